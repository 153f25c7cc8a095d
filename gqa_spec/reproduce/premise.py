"""The reproduction's `premise` stage: a speculative pair where the papers' premise holds.

Leviathan et al.'s speedups assume a target whose batch-1 greedy step is bound by reading its
weights, and a draft that costs a small fraction c of that step. The study's own target is too
small for either on a CPU (`claims.premise` then reads 5c, 6a and 6b "premise not met"). The
preset's `premise` (`presets.PremisePair`) names a larger target, trained here, on which the same
rows are measured and claims 5c, 5d, 6a and 6b decided (`claims.premise_claims`). Jobs (each
skipped once finished, training resumed from its checkpoints; one after another, except the
drafts, which run `workers` at a time):
  pretrain     the pair's target on the preset's `pretrain_task` at `pretrain_lengths` (rsqrt
               schedule, its own warm-up and peak);
  finetune     that target on the pair's `task` only (one task is enough for the speed claims, and
               halves the training), the preset's constant lr, dropout 0.1, the best validation
               checkpoint kept (as the `finetune` stage);
  chimera, distilled, independent
               the `drafts` stage's jobs against the frozen fine-tuned pair target
               (`drafts.chimera_job`, `distilled_job`, `independent_job`): a Chimera draft, and the
               study's fine-tuned draft distilled against it, `draft_steps` at `draft_batch` each;
               'independent' is the study's fine-tuned draft itself (no training);
  batch<b>     for each of the pair's `batches`: the speculative stage's drafts job
               (`speculation.measure_drafts`) on the first `examples` test inputs of the task at
               batch b: chains of the independent ('draft model'), distilled, Chimera and staged
               drafts, token trees and `--gamma auto` with the distilled draft, against greedy /
               sampled autoregressive decoding of the same target, with c and v(gamma) measured as
               the speculative stage measures them; and the machine's memory bandwidth
               (`memory_bandwidth`, just before the grid).
The stage record's `premise` holds the premise itself: the target's batch-1 greedy step time
against its weight bytes / the measured bandwidth, and the drafts' c. A preset without a pair
records that it has none (`skipped`); the report says so once.
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Mapping

from gqa_spec.reproduce import drafts, speculation
from gqa_spec.reproduce import jobs as jobs_lib
from gqa_spec.reproduce.presets import TASK_METRIC

TARGET = 'premise target'  # the rows' `target`
WEIGHT_BOUND = 0.8  # the premise: a greedy step reads the weights at >= this share of bandwidth
DRAFT_COST_GOAL = 0.1  # the premise: the draft's c at most this
PAIR_DRAFT = 'distilled'  # the pair's draft: the study's draft distilled against the pair target


def memory_bandwidth(mib: int = 256, repeats: int = 5) -> float:
  """Bytes/s of a jitted sum over `mib` MiB of float32, the fastest of `repeats` runs after a
  compiling one (256 MiB: far beyond the caches of a CPU, so DRAM is read)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.cost_calibration import min_time  # pylint: disable=g-import-not-at-top
  x = jnp.ones((mib * 2 ** 20 // 4,), jnp.float32)  # [n]
  total = jax.jit(jnp.sum)
  return x.nbytes / min_time(lambda: total(x), repeats)


def _train_target(ctx, pair, task: str, lengths) -> Dict[str, dict]:
  """The pretrain and finetune jobs of the pair's target; their records."""
  from gqa_spec.reproduce import finetune  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.optimizer import constant, rsqrt_decay  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  pretrain_dir, finetune_dir = ctx.model_dir('premise', 'pretrain'), ctx.model_dir('premise',
                                                                                    'finetune')
  schedule = rsqrt_decay(pair.pretrain_peak_lr * math.sqrt(pair.warmup_steps), pair.warmup_steps)
  [pretrained] = jobs_lib.run_jobs(ctx, 'premise', [('pretrain', lambda: jobs_lib.train(
      pretrain_dir, pair.target, ctx.task(p.pretrain_task), p.pretrain_lengths,
      pair.pretrain_batch, pair.pretrain_steps, learning_rate_fn=schedule,
      save_period=max(10, min(pair.pretrain_steps // 5, 250)), work_dir=ctx.work_dir))])
  config = pair.target.replace(dropout_rate=0.1)
  [finetuned] = jobs_lib.run_jobs(ctx, 'premise', [('finetune', lambda: jobs_lib.train(
      finetune_dir, config, ctx.task(task), lengths, pair.finetune_batch, pair.finetune_steps,
      learning_rate_fn=constant(p.finetune_lr('target')), initial_checkpoint_path=pretrain_dir,
      initial_step=0, evaluator=finetune._evaluator(ctx, task, config),  # pylint: disable=protected-access
      eval_period=min(p.eval_period, pair.finetune_steps), best_metric=TASK_METRIC[task],
      save_period=min(pair.finetune_steps, 500), work_dir=ctx.work_dir))])
  return {'pretrain': pretrained, 'finetune': dict(
      finetuned, best_checkpoint=os.path.join(finetuned['model_dir'], 'best'))}


def _measure(ctx, pair, task: str, lengths, paths: dict, successor, batch: int) -> dict:
  """One `batch<b>` job (module docstring)."""
  bandwidth = memory_bandwidth()
  batches = speculation.input_batches(ctx, task, lengths, pair.examples, batch)
  out = speculation.measure_drafts(ctx, task, lengths[1], TARGET, paths, batches, successor,
                                   repeats=pair.repeats, auto_drafts=(PAIR_DRAFT,))
  for key in ('drafts_rows', 'tree_rows', 'auto_rows'):
    out[key] = [dict(r, batch_size=batch) for r in out[key]]
  return dict(out, batch_size=batch, bandwidth_bytes_per_s=bandwidth)


def stage_premise(ctx) -> dict:
  """The premise pair's training, speculative rows and premise (module docstring)."""
  p, pair = ctx.preset, ctx.preset.premise
  if pair is None:
    return {'rows': [], 'skipped': f'the {p.name!r} preset has no premise pair (Preset.premise)'}
  jobs_lib.register_tasks(ctx)
  drafts.chimera_heads(p)  # a bad preset fails before any training
  task, lengths = pair.task, p.finetune_lengths[pair.task]
  independent = {(r['task'], r['name']): ctx.path(r['best_checkpoint'])
                 for r in ctx.read_stage('finetune')['rows']}[(task, 'draft')]
  trained = _train_target(ctx, pair, task, lengths)
  target = ctx.path(trained['finetune']['best_checkpoint'])
  size = drafts.Size(pair.draft_steps, pair.draft_batch, ctx.model_dir('premise', 'drafts'))
  draft_records = jobs_lib.run_jobs(ctx, 'premise', [
      ('chimera', lambda: drafts.chimera_job(ctx, task, lengths, target, size)),
      ('distilled', lambda: drafts.distilled_job(ctx, task, lengths, target, independent, size)),
      ('independent', lambda: drafts.independent_job(ctx, task, lengths, target, independent)),
  ], p.workers)
  by_draft = {r['draft']: r for r in draft_records}
  paths = {'target': target, 'draft model': independent,
           'distilled': ctx.path(by_draft['distilled']['checkpoint']),
           'chimera': ctx.path(by_draft['chimera']['run_dir'])}
  bigram = {}

  def successor():
    if not bigram:
      bigram['successor'] = speculation.fit_bigram(ctx, task).successor()
    return bigram['successor']

  from gqa_spec.decoding import xla_options  # pylint: disable=g-import-not-at-top
  with xla_options.fast_compile(p.fast_compile_decoding):
    measured = jobs_lib.run_jobs(ctx, 'premise', [
        (f'batch{b}', lambda b=b: _measure(ctx, pair, task, lengths, paths, successor(), b))
        for b in pair.batches])
  return {'task': task, 'target': TARGET, 'draft': PAIR_DRAFT, 'batches': list(pair.batches),
          'pretrain_task': p.pretrain_task,
          'examples': pair.examples, 'training': trained, 'drafts': draft_records,
          'rows': [r for m in measured for r in m['drafts_rows']],
          'tree_rows': [r for m in measured for r in m['tree_rows']],
          'auto_rows': [r for m in measured for r in m['auto_rows']],
          'jobs': measured, 'premise': premise_facts(measured)}


def premise_facts(measured: List[Mapping]) -> dict:
  """The premise in numbers, from the `batch<b>` jobs' records: at the smallest batch, the
  target's greedy step (one token) against its weight bytes / the measured bandwidth, and each
  model draft's c (a draft step / a target step) at every batch."""
  first = min(measured, key=lambda m: m['batch_size'])
  step = first['target_step_seconds']['1']
  weights = first['param_bytes']['target_weights_per_step']
  bound = weights / first['bandwidth_bytes_per_s']
  costs = {}
  for m in measured:
    for r in m['drafts_rows']:
      if r['draft'] in ('draft model', PAIR_DRAFT):
        costs.setdefault(r['draft'], {})[str(m['batch_size'])] = r['c']
  c = costs.get(PAIR_DRAFT, {}).get(str(first['batch_size']))
  return {'batch_size': first['batch_size'], 'bandwidth_bytes_per_s': first['bandwidth_bytes_per_s'],
          'weight_bytes': weights, 'step_seconds': step, 'bound_seconds': bound,
          'weights_read_fraction': bound / step, 'weight_bound': bound / step >= WEIGHT_BOUND,
          'c': costs, 'draft_cost': c, 'cheap_draft': c is not None and c <= DRAFT_COST_GOAL,
          'param_bytes': first['param_bytes']}


# ---------------------------------------------------------------------------------------------
# The report's section (`writeup.stage_report`).


def report_section(record: Mapping) -> str:
  """The premise pair's section of report.md: the pair, its premise in numbers, its rows."""
  from gqa_spec.reproduce.report import markdown_table  # pylint: disable=g-import-not-at-top
  if record is None:
    return 'The premise stage has not run (`--stages premise`).'
  if not record.get('rows'):
    return (f"No premise pair: {record.get('skipped', 'the stage measured no rows')}. Claims "
            '5c-6b are decided on the study\'s own target alone.')
  f, train = record['premise'], record['training']
  mib = lambda x: f'{x / 2 ** 20:.1f} MiB'
  sizes = f['param_bytes']
  lines = [
      "The papers' speedups assume a target whose greedy step is bound by reading its weights "
      'and a draft costing a small fraction c of that step; the study\'s own target and draft '
      'are too small for that on a CPU. This pair is built for it, and the first table says '
      f"whether it holds: a larger target pre-trained {train['pretrain']['step']} steps on "
      f"`{record.get('pretrain_task', train['pretrain']['train_task'])}` and fine-tuned "
      f"{train['finetune']['step']} steps on `{record['task']}` only (one task: the speed "
      "claims need one), the study's fine-tuned draft ('draft model', the independent draft) "
      "distilled against it ('distilled', the pair's draft), and a Chimera draft trained against "
      "it. Claims 5c-6b are decided on its rows by the same rules as above: the claims table's "
      "'premise pair' rows.", '',
      markdown_table(['', 'value', 'premise'], [
          ['target parameters (all; read per step)',
           f"{mib(sizes['target'])}; {mib(f['weight_bytes'])}", ''],
          ['draft parameters (distilled; Chimera)',
           f"{mib(sizes['distilled'])}; {mib(sizes['chimera'])}", ''],
          ['memory bandwidth (jitted sum over 256 MiB)',
           f"{f['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s", ''],
          [f"greedy step of the target, batch {f['batch_size']}", f"{f['step_seconds'] * 1e3:.2f} ms",
           ''],
          ['bound: weights read / bandwidth', f"{f['bound_seconds'] * 1e3:.2f} ms",
           f"{f['weights_read_fraction']:.2f} of the bandwidth "
           f"({'met' if f['weight_bound'] else 'not met'}: >= {WEIGHT_BOUND:g})"],
          *[[f"c of the {'independent' if d == 'draft model' else d} draft (batch {b})", f'{c:.3f}',
             (f"{'met' if c <= DRAFT_COST_GOAL else 'not met'}: <= {DRAFT_COST_GOAL:g}"
              if d == PAIR_DRAFT else '')]
            for d, by_batch in sorted(f['c'].items()) for b, c in sorted(by_batch.items(),
                                                                          key=lambda x: int(x[0]))],
      ]), '', premise_table(record)]
  return '\n'.join(lines)


def premise_table(record: Mapping) -> str:
  """Every chain at its best gamma, every tree and `--gamma auto`, per batch and temperature:
  tokens per target call, c, v, the measured speedup over autoregressive decoding of the same
  target, Theorem 8 with the measured c and v, and identity with greedy decoding."""
  from gqa_spec.reproduce.report import markdown_table  # pylint: disable=g-import-not-at-top
  best: Dict[tuple, Mapping] = {}
  for r in record['rows']:
    key = (r['batch_size'], r['temperature'], r['draft'])
    if key not in best or r['speedup_measured'] > best[key]['speedup_measured']:
      best[key] = r
  rows = list(best.values()) + list(record.get('tree_rows', [])) + list(
      record.get('auto_rows', []))
  fmt = lambda x, spec='.2f': '-' if x is None else format(x, spec)
  body = []
  for r in sorted(rows, key=lambda r: (r['batch_size'], r['temperature'], 'tree' in r,
                                       'policy' in r, r['draft'])):
    method = (f"{r['draft']} (gamma auto)" if 'policy' in r else r['draft'] if 'tree' in r
              else f"chain {r['draft']} (gamma={r['gamma']})")
    v = r.get('verify_ratio_v')
    eq = r.get('tokens_equal_autoregressive')
    body.append([str(r['batch_size']), f"{r['temperature']:g}", method,
                 fmt(r.get('alpha')), fmt(r['tokens_per_call']), fmt(r.get('c'), '.3f'),
                 fmt(v if not isinstance(v, list) else None),
                 f"{r['speedup_measured']:.2f}x",
                 '-' if 'speedup_thm8_with_v' not in r else f"{r['speedup_thm8_with_v']:.2f}x",
                 '-' if eq is None else str(eq)])
  return markdown_table(['Batch', 'Temp', 'Method', 'alpha', 'tokens/call', 'c', 'v(gamma)',
                         'Speed (measured)', 'Thm 8 (c, v)', '= AR (greedy)'], body)
