"""`gqa-spec reproduce`: the whole study, stage by stage, each cached and resumable.

Stages (in order; each writes `results/<preset>/<stage>.json` and is skipped when that exists):
  corpus       DDTP splits + SentencePiece vocabulary (the packaged excerpt for `smoke`)
  pretrain     MHA target and MHA draft on the preset's `pretrain_task` (ddtp_span_corruption, or
               the ddtp_mixture of T5's multi-task pre-training; rsqrt schedule, T5 Adafactor)
  uptrain      convert the target (mean / first / random, G groups) and continue pre-training for
               alpha x the pre-training steps on `pretrain_task`, continuing the original schedule
  finetune     every variant and the draft on each task, or once on translate + summarize
               (`finetune_multitask`); constant lr, dropout 0.1, best validation checkpoint kept
               (`finetune.py`); one row per (model, task) either way
  drafts       per task, a Chimera and a distilled draft trained against the frozen fine-tuned MHA
               target; per-head top-k accuracy (`drafts.py`)
  evaluate     test-set quality (greedy) and time per sample of every fine-tuned variant, with
               per-example scores (`bootstrap.encode`) for the claims' paired bootstrap
  timing       time per sample vs number of K/V groups at a short and a long input setting
  speculative  fine-tuned MHA and GQA targets with the draft model, bigram and copy drafts; for MHA
               also token trees, staged, Chimera (chain and tree) and distilled (`speculation.py`)
  report       markdown tables, the claims table (`claims.py`), PNG figures (`figures.py`),
               commands and wall times
Models live under the work dir (default `runs/<preset>/`, not committed); everything a table needs
is in the stage JSON. Inside a stage, finished jobs are skipped and a killed training job resumes
from its last checkpoint (the trainer's own resume).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gqa_spec import progress, status
from gqa_spec.errors import UserError
from gqa_spec.reproduce import bootstrap, drafts, finetune, speculation
from gqa_spec.reproduce import presets as presets_lib
from gqa_spec.reproduce.presets import TASK_METRIC, TRANSLATE, Preset, Variant

STAGES = ('corpus', 'pretrain', 'uptrain', 'finetune', 'drafts', 'evaluate', 'timing',
          'speculative', 'report')


@dataclasses.dataclass
class Context:
  """Where a reproduction reads and writes."""

  preset: Preset
  out_dir: str  # results/<preset>
  work_dir: str  # models, data, caches
  progress: Any = None
  overrides: Tuple[str, ...] = ()  # `--set KEY=VALUE` applied to the preset

  @property
  def data_dir(self) -> str:
    return os.path.join(self.work_dir, 'data')

  def path(self, relative: str) -> str:
    """A path recorded relative to the work dir (stage JSON stays valid if the dir moves)."""
    return os.path.join(self.work_dir, relative)

  def relative(self, path: str) -> str:
    """`path` as recorded: relative to the work dir (`path` reads it back)."""
    return os.path.relpath(path, self.work_dir)

  def model_dir(self, *parts: str) -> str:
    return os.path.join(self.work_dir, 'models', *parts)

  def stage_path(self, stage: str) -> str:
    return os.path.join(self.out_dir, f'{stage}.json')

  def read_stage(self, stage: str) -> Dict[str, Any]:
    path = self.stage_path(stage)
    if not os.path.exists(path):
      raise UserError(f'stage {stage!r} has not run yet ({path} is missing); run it first')
    with open(path) as f:
      return json.load(f)


def _write_json(path: str, obj: Any) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=1, sort_keys=True)
    f.write('\n')
  os.replace(tmp, path)  # a stage counts as done only once its JSON is complete


def _jobs_dir(ctx: Context, stage: str) -> str:
  """Where a stage's finished jobs keep their records (one `<key>.json` each)."""
  return os.path.join(ctx.work_dir, 'jobs', stage)


def _job_done(ctx: Context, stage: str, key: str) -> Optional[dict]:
  path = os.path.join(_jobs_dir(ctx, stage), f'{key}.json')
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  return None


def _finish_job(ctx: Context, stage: str, key: str, record: dict) -> dict:
  os.makedirs(_jobs_dir(ctx, stage), exist_ok=True)
  _write_json(os.path.join(_jobs_dir(ctx, stage), f'{key}.json'), record)
  return record


def _job_seconds(ctx: Context, stage: str) -> Optional[float]:
  """The sum of a stage's finished jobs' own wall times, whichever invocation ran them."""
  folder = _jobs_dir(ctx, stage)
  if not os.path.isdir(folder):
    return None
  total = 0.0
  for name in sorted(os.listdir(folder)):
    if name.endswith('.json'):
      with open(os.path.join(folder, name)) as f:
        total += float(json.load(f).get('wall_seconds') or 0.0)
  return round(total, 1)


MAPS_BEFORE_RELEASE = 16_384  # a quarter of Linux's default vm.max_map_count (65,530)


def _memory_maps() -> Optional[int]:
  """This process's memory mappings (Linux's /proc/self/maps), or None where there is none."""
  try:
    with open('/proc/self/maps') as f:
      return sum(1 for _ in f)
  except OSError:
    return None


def _release_compiled() -> None:
  """After a job: drops every compiled executable once the process holds many memory maps.

  XLA:CPU maps each executable's code into the process; a stage of many jobs each compiling
  its own loops (the cpu study's speculative stage: a while loop per draft, gamma and
  temperature, ~6,000 maps a minute) kept them all and crossed Linux's default
  `vm.max_map_count` (65,530) after ~20 minutes ("LLVM compilation error: Cannot allocate
  memory", then a segfault). Below `MAPS_BEFORE_RELEASE` the executables are kept, so the
  next job reuses what it shares (the smoke preset's jobs share most of theirs).
  """
  maps = _memory_maps()
  if maps is None or maps < MAPS_BEFORE_RELEASE:
    return
  import gc  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  jax.clear_caches()
  gc.collect()
  logging.getLogger(__name__).info('released compiled executables (%d memory maps)', maps)


def _run_jobs(ctx: Context, stage: str, jobs: Sequence[tuple]) -> List[dict]:
  """Runs `(key, fn)` jobs of a stage, skipping finished ones; returns their records in order."""
  records, walls = [], []
  for i, (key, fn) in enumerate(jobs, 1):
    done = _job_done(ctx, stage, key)
    if done is None:
      if ctx.progress is not None:
        ctx.progress.set_postfix_str(f'{stage}: {key}')
      with progress.scope(f'job {i}/{len(jobs)} {key}'):
        t0 = time.time()
        with progress.coarse():  # a line per job; a long job's lines every 30 s
          record = fn()
        record['wall_seconds'] = round(time.time() - t0, 2)
        walls.append(record['wall_seconds'])
        _release_compiled()
        remaining = sum(1 for k, _ in jobs[i:] if _job_done(ctx, stage, k) is None)
        progress.info('done in %s; stage ETA %s (%d job(s) left at this pace)',
                      progress.format_seconds(walls[-1]),
                      progress.format_seconds(remaining * sum(walls) / len(walls)), remaining)
      done = _finish_job(ctx, stage, key, record)
    records.append(done)
  return records


# ---------------------------------------------------------------------------------------------
# Stages 1-4: data and training.


def stage_corpus(ctx: Context) -> dict:
  from gqa_spec.data import corpus, ddtp, tasks  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  if p.use_sample_corpus:
    lists_dir, fractions = corpus.SAMPLE_LISTS_DIR, corpus.SAMPLE_FRACTIONS
  else:
    lists_dir, fractions = ddtp.APT_LISTS_DIR, ddtp.DEFAULT_FRACTIONS
  stats = corpus.prepare(lists_dir, ctx.data_dir, vocab_size=p.vocab_pieces, fractions=fractions)
  tasks.register_ddtp_tasks(ctx.data_dir)
  vocab = tasks.get(TRANSLATE).output_features['targets'].vocabulary
  if vocab.vocab_size > p.target.vocab_size:
    raise UserError(f'vocabulary of {vocab.vocab_size} ids does not fit the model vocab_size '
                    f'{p.target.vocab_size}')
  return {'data_dir': ctx.relative(ctx.data_dir), 'stats': stats, 'vocab_size': vocab.vocab_size}


def _register_tasks(ctx: Context) -> None:
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  tasks.register_ddtp_tasks(ctx.data_dir)


def _train(model_dir: str, config, task: str, lengths, batch: int, total_steps: int, *,
           learning_rate_fn, initial_checkpoint_path=None,
           initial_step=None, evaluator=None, eval_period=None, best_metric=None,
           save_period: int = 100, seed: int = 0, work_dir: str = '.') -> dict:
  from gqa_spec.training import trainer  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.data import DatasetConfig  # pylint: disable=g-import-not-at-top
  dataset = DatasetConfig(task, {'inputs': lengths[0], 'targets': lengths[1]}, batch_size=batch,
                          seed=seed)
  result = trainer.train(
      model_dir=model_dir, model_config=config, train_dataset_cfg=dataset,
      total_steps=total_steps, learning_rate_fn=learning_rate_fn,
      initial_checkpoint_path=initial_checkpoint_path,
      initial_step=initial_step, evaluator=evaluator, eval_period=eval_period,
      best_metric=best_metric, log_period=max(1, min(50, total_steps // 4)),
      checkpoint_cfg=trainer.CheckpointConfig(save_period=save_period, keep=1,
                                              asynchronous=False),
      random_seed=seed, progress_bar=False)
  return {'model_dir': os.path.relpath(model_dir, work_dir), 'step': result.step,
          'train_task': task, 'train_lengths': list(lengths),
          'train_metrics': {k: float(v) for k, v in result.train_metrics.items()},
          'best': result.best}


def stage_pretrain(ctx: Context) -> dict:
  from gqa_spec.training.optimizer import rsqrt_decay  # pylint: disable=g-import-not-at-top
  _register_tasks(ctx)
  p = ctx.preset
  jobs = []
  for role, config in (('target', p.target), ('draft', p.draft)):
    jobs.append((role, lambda config=config, role=role: _train(
        ctx.model_dir('pretrain', role), config, p.pretrain_task, p.pretrain_lengths,
        p.pretrain_batch, p.pretrain_steps,
        learning_rate_fn=rsqrt_decay(*p.pretrain_schedule(role)),
        # a kill loses at most 250 steps
        save_period=max(10, min(p.pretrain_steps // 5, 250)), work_dir=ctx.work_dir)))
  target, draft = _run_jobs(ctx, 'pretrain', jobs)
  return {'target': target, 'draft': draft, 'steps': p.pretrain_steps, 'design': p.design()}


def stage_uptrain(ctx: Context) -> dict:
  """Conversion (mean / first / random) and alpha x pre-training steps of the original recipe.

  `training.uptrain` continues the pre-training run's step count and rsqrt schedule with a fresh
  optimizer state (see its docstring); alpha = 0 is the converted checkpoint without training.
  """
  from gqa_spec.training import uptrain  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.optimizer import rsqrt_decay  # pylint: disable=g-import-not-at-top
  _register_tasks(ctx)
  p = ctx.preset
  source = ctx.model_dir('pretrain', 'target')

  def job(v: Variant) -> dict:
    model_dir = ctx.model_dir('uptrain', v.name)
    config = p.target.replace(num_kv_heads=v.kv_heads)
    record = uptrain.convert_checkpoint(model_dir, source, config, v.method)
    result = {'variant': dataclasses.asdict(v), 'uptrain_steps': 0,
              'checkpoint': ctx.relative(os.path.join(model_dir, uptrain.CONVERTED_DIR)),
              'conversion': record}
    if v.alpha > 0:
      def train_fn(**kwargs):
        return _train(kwargs['model_dir'], kwargs['model_config'], p.pretrain_task,
                      p.pretrain_lengths, p.pretrain_batch, kwargs['total_steps'],
                      learning_rate_fn=rsqrt_decay(*p.pretrain_schedule('target')),
                      initial_checkpoint_path=kwargs['initial_checkpoint_path'],
                      initial_step=kwargs['initial_step'], work_dir=ctx.work_dir)
      trained = uptrain.uptrain(model_dir=model_dir, model_config=config,
                                initial_checkpoint_path=source, method=v.method, alpha=v.alpha,
                                train_fn=train_fn)
      result.update(trained, checkpoint=ctx.relative(model_dir),
                    uptrain_steps=trained['step'] - p.pretrain_steps)
    return result

  jobs = [(v.name, lambda v=v: job(v)) for v in p.variants() if v.method is not None]
  return {'rows': _run_jobs(ctx, 'uptrain', jobs), 'design': p.design()}


def _label(ctx: Context, row: dict) -> str:
  from gqa_spec.reproduce.report import variant_label  # pylint: disable=g-import-not-at-top
  if row['name'] == 'draft':
    return 'draft (nano MHA)' if ctx.preset.name == 'cpu' else 'draft (MHA)'
  v = row['variant']
  return variant_label(v['kv_heads'], ctx.preset.target.num_heads, v['method'], v['alpha'])


def stage_evaluate(ctx: Context) -> dict:
  """Test-set quality (greedy, as the GQA paper) and median time per sample after compilation."""
  from gqa_spec.training.evaluation import evaluate_checkpoint  # pylint: disable=g-import-not-at-top
  _register_tasks(ctx)
  p = ctx.preset
  jobs = []
  for row in ctx.read_stage('finetune')['rows']:
    def job(row=row):
      lengths = p.finetune_lengths[row['task']]
      metrics = evaluate_checkpoint(
          ctx.path(row['best_checkpoint']), row['task'],
          ctx.model_dir('eval', row['task'], row['name']),
          split='test', task_feature_lengths={'inputs': lengths[0], 'targets': lengths[1]},
          batch_size=p.eval_batch, num_examples=p.test_examples)
      v = row['variant'] or {}
      per_example = _per_example_scores(ctx.model_dir('eval', row['task'], row['name']),
                                        row['task'])
      return {'variant': row['name'], 'label': _label(ctx, row), 'task': row['task'],
              'per_example': per_example,
              'kv_heads': row['kv_heads'], 'method': v.get('method'), 'alpha': v.get('alpha'),
              'model': 'draft' if row['name'] == 'draft' else 'target',
              'metric': TASK_METRIC[row['task']], 'score': metrics[TASK_METRIC[row['task']]],
              'time_per_sample_s': metrics['timing/seconds_per_sample_median'],
              'batch_size': p.eval_batch,
              'examples': len(bootstrap.decode(TASK_METRIC[row['task']], per_example)),
              'best_step': row['best']['step'] if row['best'] else None}
    jobs.append((f"{row['task']}.{row['name']}", job))
  return {'rows': _run_jobs(ctx, 'evaluate', jobs), 'baselines': _baselines(ctx)}


def _baselines(ctx: Context) -> List[dict]:
  """Table 1's trivial baselines (copy input; first sentence / first N words) on the models' test
  examples and metrics (`reproduce/baselines.py`)."""
  from gqa_spec.reproduce import baselines  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  return baselines.evaluate({t: TASK_METRIC[t] for t in p.finetune_lengths}, p.finetune_lengths,
                            'test', p.test_examples)


def _per_example_scores(eval_dir: str, task: str) -> dict:
  """The test predictions' per-example scores (`bootstrap.encode`), for paired bootstrap."""
  with open(os.path.join(eval_dir, f'predictions-{task}.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return bootstrap.encode(TASK_METRIC[task], [r['target'] for r in rows],
                          [r['prediction'] for r in rows])


def time_per_sample(config, params, inputs, max_decode_len: int, repeats: int) -> float:
  """Median seconds per sample of encoding `inputs [b, S]` and greedily decoding exactly
  `max_decode_len` tokens (EOS disabled, so every model does the same work), after compilation."""
  import jax  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding import autoregressive, speedup  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.targets import T5Decoder  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  decoder = T5Decoder(Transformer(config))

  def run():
    state = decoder.init(params, inputs, max_decode_len + 1)
    return autoregressive.decode(decoder, state, jax.random.PRNGKey(0),
                                 max_decode_len=max_decode_len, eos_id=-1)

  return float(speedup.median_time(run, repeats)) / inputs.shape[0]


def _timing_settings(p: Preset) -> Dict[str, tuple]:
  """setting -> (config, (inputs, targets)) of the timing stage."""
  return {'short': (p.target, p.finetune_lengths[TRANSLATE]),
          'long': (p.long_timing_config, p.long_timing)}


def stage_timing(ctx: Context) -> dict:
  """GQA Figure 6: time per sample vs K/V groups (untrained weights: quality is irrelevant here).

  `short` uses the fine-tuning setting of the translation task with the target config; `long`
  uses long inputs and outputs, where the K/V cache, not the parameters, dominates the bytes read.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.train_step import init_params  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  settings = _timing_settings(p)
  jobs = []
  for setting, (base, (inputs_len, targets_len)) in settings.items():
    for g in p.timing_groups:
      if base.num_heads % g:
        continue
      def job(setting=setting, base=base, g=g, inputs_len=inputs_len, targets_len=targets_len):
        config = base.replace(num_kv_heads=g)
        params = init_params(config, jax.random.PRNGKey(0))
        rng = np.random.default_rng(0)
        inputs = rng.integers(2, config.vocab_size, (p.timing_batch, inputs_len)).astype(np.int32)
        seconds = time_per_sample(config, params, inputs, targets_len, p.timing_repeats)
        return {'setting': setting, 'kv_heads': g, 'num_heads': config.num_heads,
                'inputs': inputs_len, 'targets': targets_len, 'batch_size': p.timing_batch,
                'time_per_sample_s': seconds}
      jobs.append((f'{setting}.g{g}', job))
  return {'rows': _run_jobs(ctx, 'timing', jobs)}


def stage_report(ctx: Context) -> dict:
  """Markdown tables in the papers' forms, the claims table, PNG figures, the commands and the wall
  times."""
  from gqa_spec.reproduce import report  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  evaluate_stage = ctx.read_stage('evaluate')
  evaluate = evaluate_stage['rows']
  timing = ctx.read_stage('timing')['rows']
  spec_record = ctx.read_stage('speculative')
  spec = spec_record['rows']
  figures, claims_md = _figures_and_claims(ctx)
  walls = {s: ctx.read_stage(s).get('wall_seconds') for s in STAGES[:-1]}
  job_walls = {s: _job_seconds(ctx, s) for s in STAGES[:-1]}
  lines = [
      f'# Reproduction: preset `{p.name}`', '',
      f'Command: `{_command(ctx)}`', '',
      f'Machine: {_machine()}', '',
      *([_smoke_note(ctx), ''] if p.name == 'smoke' else []),
      '## Study design', '',
      report.design_note(p, finetune.multitask_metric(
          {t: TASK_METRIC[t] for t in p.finetune_lengths})), '',
      '## Claims', '', claims_md, '',
      '## GQA Table 1: quality and time per sample (test split, greedy)', '',
      report.table1(evaluate, evaluate_stage.get('baselines', ())), '',
      f'## GQA Figure 4: conversion methods (alpha = {p.method_ablation_alpha:g})', '',
      report.conversion_table(evaluate, p.method_ablation_alpha), '',
      '## GQA Figure 5: uptraining proportion (mean pooling)', '',
      report.uptraining_table(evaluate), '',
      '## GQA Figure 6: time per sample vs number of K/V groups', '',
      report.timing_table(timing), '',
      '## Speculative decoding (Leviathan Table 2 form): best gamma per draft', '',
      report.speculative_table(spec), '',
      '## Acceptance rate alpha per draft (Leviathan Table 3 form)', '',
      report.alpha_table(spec), '',
      '## Token trees and staged speculation (Spector & Re Table 1 form), MHA target', '',
      report.spector_table(spec_record), '',
      '## Drafts trained against the target (Chimera Table 5 form), MHA target', '',
      report.chimera_table(ctx.read_stage('drafts')['rows'], spec_record), '',
      '## Figures', '']
  lines += [f'Drawn from the stage JSON by `{_command(ctx)} --stages report --force` (no '
            'retraining or re-timing).', '']
  lines += [f'![{f}]({f})' for f in figures]
  lines += ['', '## Wall time per stage (seconds)', '',
            'The machine line above is the report\'s: stage records do not name where they '
            'ran. "Last run" is the invocation that '
            'finished the stage; a stage resumed after a kill also ran jobs in earlier '
            'invocations, which "jobs" sums (each finished job\'s own time, from '
            '`<work dir>/jobs/<stage>/`; set-up between jobs and '
            'work lost to a kill are left out; "-" for stages without jobs).', '',
            report.markdown_table(['Stage', 'Last run', 'Jobs'],
                                  [[s, w, '-' if job_walls[s] is None else job_walls[s]]
                                   for s, w in walls.items()]), '']
  with open(os.path.join(ctx.out_dir, 'report.md'), 'w') as f:
    f.write('\n'.join(lines))
  return {'figures': figures, 'report': 'report.md', 'stage_wall_seconds': walls,
          'stage_job_seconds': job_walls,
          'design': p.design()}


def _figures_and_claims(ctx: Context) -> Tuple[List[str], str]:
  """Writes the PNG figures; returns their names and the claims section of report.md."""
  from gqa_spec.reproduce import claims, decode_bytes, figures  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  evaluate, timing, spec = (ctx.read_stage(s) for s in ('evaluate', 'timing', 'speculative'))
  predicted = decode_bytes.predicted_times(
      timing['rows'], {s: config for s, (config, _) in _timing_settings(p).items()})
  names = figures.plot_all(ctx.out_dir, evaluate['rows'], timing['rows'], spec,
                           p.method_ablation_alpha, predicted)
  rows = claims.all_claims(evaluate, timing, spec, p.method_ablation_alpha, predicted)
  return names, '\n\n'.join([claims.quality_bar(evaluate), claims.markdown(rows), claims.NOTE])


def _smoke_note(ctx: Context) -> str:
  """What a smoke report is: a pipeline check on the packaged excerpt, not a finding."""
  splits = ctx.read_stage('corpus')['stats']['splits']
  return smoke_note(splits['train'], splits['test'])


def smoke_note(train: dict, test: dict) -> str:
  """The smoke label for the report and the terminal (split sizes from the corpus stats)."""
  return ('**Smoke run: a pipeline check on a tiny excerpt, not findings.** Tiny models trained '
          'for a few hundred steps on the DDTP excerpt shipped in the package '
          f"({train['translate_en_de_pairs']} translation pairs and {train['summarize_examples']} "
          f"summaries to train on, {test['translate_en_de_pairs']} and "
          f"{test['summarize_examples']} to test): the numbers show that every stage learns and "
          'measures, not whether any paper claim holds (that is `--preset cpu`).')


def _command(ctx: Context) -> str:
  sets = ''.join(f' --set {o}' for o in ctx.overrides)
  if not sets:
    return f'gqa-spec reproduce --preset {ctx.preset.name}'
  return (f'gqa-spec reproduce --preset {ctx.preset.name}{sets} --out {ctx.out_dir} '
          f'--work-dir {ctx.work_dir}')


def _machine() -> str:
  import platform  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  return (f'{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, '
          f'JAX {jax.__version__} on {jax.devices()[0].platform}')


STAGE_FNS = {'corpus': stage_corpus, 'pretrain': stage_pretrain, 'uptrain': stage_uptrain,
             'finetune': finetune.stage_finetune, 'drafts': drafts.stage_drafts,
             'evaluate': stage_evaluate, 'timing': stage_timing,
             'speculative': speculation.stage_speculative, 'report': stage_report}


def run(preset_name: str, out_dir: Optional[str] = None, work_dir: Optional[str] = None,
        stages: Optional[Sequence[str]] = None, force: bool = False,
        progress_bar: Optional[bool] = None,
        overrides: Sequence[str] = ()) -> Dict[str, dict]:
  """Runs (or resumes) a reproduction; returns every stage's record.

  Args:
    preset_name: 'smoke' or 'cpu'.
    out_dir: results directory (default `results/<preset>`).
    work_dir: models and data (default `runs/<preset>`).
    stages: a subset of `STAGES` to run (default all; earlier stages must have run).
    force: re-run the named stages even when their JSON exists (jobs inside still resume).
    progress_bar: show a progress bar (default: on terminals).
    overrides: `KEY=VALUE` changes to the preset (`--set`); they need their own `out_dir` and
      `work_dir`, so that a changed study never reuses the preset's cached stages.
  """
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  preset = presets_lib.override(presets_lib.get(preset_name), overrides)
  if overrides and (out_dir is None or work_dir is None):
    raise UserError('--set changes the preset: give its own --out and --work-dir (the defaults '
                    f'hold the unchanged {preset_name!r} study)')
  unknown = [s for s in stages or () if s not in STAGES]
  if unknown:
    raise UserError(f'unknown stage(s) {unknown}; stages: {", ".join(STAGES)}')
  todo = [s for s in STAGES if not stages or s in stages]
  ctx = Context(preset, out_dir or os.path.join('results', preset_name),
                work_dir or os.path.join('runs', preset_name), overrides=tuple(overrides))
  os.makedirs(ctx.out_dir, exist_ok=True)
  os.makedirs(ctx.work_dir, exist_ok=True)
  _write_json(os.path.join(ctx.out_dir, 'preset.json'),
              dict(json.loads(json.dumps(dataclasses.asdict(preset), default=str)),
                   work_dir=os.path.relpath(ctx.work_dir, ctx.out_dir),  # preset.json's dir
                   overrides=list(overrides)))
  records = {}
  if progress_bar is None:
    progress_bar = sys.stderr.isatty()
  with tqdm(total=len(todo), desc=f'reproduce {preset_name}', unit='stage',
            disable=not progress_bar) as bar, status.running(ctx.out_dir), \
       compilation_cache(ctx.work_dir):
    ctx.progress = bar
    for n, stage in enumerate(todo, 1):
      bar.set_postfix_str(stage)
      path = ctx.stage_path(stage)
      if os.path.exists(path) and not force:
        records[stage] = ctx.read_stage(stage)
      else:
        t0 = time.time()
        with progress.scope(f'reproduce {preset_name}', f'stage {n}/{len(todo)} {stage}'):
          progress.info('started')
          record = STAGE_FNS[stage](ctx)
          progress.info('done in %s', progress.format_seconds(time.time() - t0))
        record['wall_seconds'] = round(time.time() - t0, 1)
        record['command'] = _command(ctx) + f' --stages {stage}'
        _write_json(path, record)
        records[stage] = record
      bar.update(1)
  return records


@contextlib.contextmanager
def compilation_cache(work_dir: str):
  """Persistent XLA cache under `work_dir` while the block runs: the many same-shaped train steps
  and decoders compile once.

  A cache directory the user configured (JAX_COMPILATION_CACHE_DIR) is left as it is. Otherwise the
  previous settings are restored and JAX's cache reset on exit, so a caller's process (a notebook,
  the test suite) does not go on writing executables into this run's work dir.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=g-import-not-at-top
  if jax.config.jax_compilation_cache_dir:
    yield
    return
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update('jax_compilation_cache_dir', os.path.join(work_dir, 'xla_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  cc.reset_cache()
  try:
    yield
  finally:
    jax.config.update('jax_compilation_cache_dir', None)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', before)
    cc.reset_cache()
