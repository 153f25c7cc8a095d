"""Tables and figures of the papers, drawn from the reproduction's per-stage JSON.

Inputs (written by the stages, `pipeline.run`, one JSON file per stage under `results/<preset>/`):
  evaluate.json     {'rows': [{variant, kv_heads, method, alpha, task, metric, score,
                               time_per_sample_s, batch_size, examples}, ...]}
  timing.json       {'rows': [{setting, kv_heads, time_per_sample_s, rounds_s, inputs, targets,
                                batch_size}]}
  speculative.json  {'rows': [{target, draft, task, temperature, gamma, alpha, tokens_per_call,
                               c, verify_ratio_v, speedup_measured, speedup_thm8, ...}, ...]}
                    (rows of `gqa_spec.reproduce.speed_grid.measure_grid` + task, target);
                    also `drafts_rows`, `tree_rows`, `jobs` (section at the end of this file)
  drafts.json       {'rows': [{task, draft, kind, head_accuracy: [{head, top1..top5}]}, ...]}
Outputs: markdown tables in the papers' forms:
  GQA Table 1 (quality and T_infer per model), Figure 4 (conversion methods), Figure 5 (uptraining
  proportion) and Figure 6 (time per sample vs number of groups) as tables; Leviathan Table 2
  (speedup per draft, temperature, gamma) and Table 3 (alpha per draft);
  Spector & Re Table 1 (trees, staged vs plain speculative vs autoregressive), Chimera Table 5
  (per-head top-k accuracy, mean accepted length). The PNG figures are
  `figures.py`'s, the claims table `claims.py`'s.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

TASK_LABELS = {'ddtp_translate_en_de': 'Translate EN-DE (BLEU)',
               'ddtp_summarize': 'Summarize (ROUGE-1)'}


def _fmt(x, digits: int = 2) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return '-'
  if isinstance(x, float):
    return f'{x:.{digits}f}'
  return str(x)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join('---' for _ in header) + '|']
  lines += ['| ' + ' | '.join(_fmt(c) if not isinstance(c, str) else c for c in r) + ' |'
            for r in rows]
  return '\n'.join(lines)


def variant_label(kv_heads: int, num_heads: int, method: Optional[str], alpha: Optional[float]) -> str:
  if kv_heads == num_heads:
    kind = 'MHA'
  elif kv_heads == 1:
    kind = 'MQA'
  else:
    kind = f'GQA-{kv_heads}'
  if method is None:
    return kind
  return f'{kind} ({method}, alpha={alpha:g})'


def _by_variant(rows: Sequence[Mapping]) -> Dict[str, Dict[str, Mapping]]:
  out: Dict[str, Dict[str, Mapping]] = {}
  for r in rows:
    out.setdefault(r['variant'], {})[r['task']] = r
  return out


def design_note(preset, best_metric: str) -> str:
  """The study design in words: the pre-training (and uptraining) task, the fine-tuning jobs and,
  where the preset deviates from the GQA paper's recipe, that it does and why.

  Args:
    preset: the run's `presets.Preset`.
    best_metric: the multi-task selection metric's name (`finetune.multitask_metric`).
  """
  from gqa_spec.reproduce.presets import MULTITASK, PRETRAIN  # pylint: disable=g-import-not-at-top
  if preset.pretrain_task == PRETRAIN:
    pre = f'`{PRETRAIN}` (span corruption, the GQA paper\'s recipe)'
  else:
    pre = (f'`{preset.pretrain_task}` (span corruption + translation + summarization at '
           'example-proportional rates: T5\'s multi-task pre-training, Raffel et al. 2020, '
           'sec. 3.5.3)')
  lines = [f'Pre-training of the target and the draft, and every variant\'s uptraining: {pre}, '
           f'inputs / targets {preset.pretrain_lengths[0]} / {preset.pretrain_lengths[1]} tokens.']
  if preset.finetune_multitask:
    inputs, targets = preset.multitask_lengths()
    lines.append(f'Fine-tuning: multi-task, one job per model on `{MULTITASK}` (translation and '
                 f'summarization 1:1, {inputs} / {targets} tokens); the checkpoint kept is the '
                 f'one with the best `{best_metric}`, the mean of validation BLEU and ROUGE-1 '
                 '(each task scored on its own validation split at its own lengths); every task '
                 'is tested at its own lengths.')
  else:
    lines.append('Fine-tuning: per task, one job per model and task (the GQA paper\'s); the '
                 'checkpoint kept is the one with the best validation metric of its task.')
  changes = ((['pre-trains on the multi-task mixture instead of span corruption alone']
              if preset.pretrain_task != PRETRAIN else []) +
             (['fine-tunes each model once on both tasks instead of once per task']
              if preset.finetune_multitask else []))
  if changes:
    lines.append('This deviates from the GQA paper, which fine-tunes each model on each task '
                 f'after span-corruption pre-training: this study {" and ".join(changes)}. The '
                 'reason is budget: a study of a few hours on 2 CPU cores cannot both pre-train '
                 'the target well on span corruption and fine-tune every model on every task '
                 'for long' + ('; multi-task pre-training teaches the tasks during pre-training '
                               'so that fine-tuning can be short.'
                               if preset.pretrain_task != PRETRAIN else '.'))
  return ' '.join(lines)


def quality_rows(evaluate_rows: Sequence[Mapping]) -> List[dict]:
  """One row per variant: per-task scores, their average and the mean time per sample."""
  tasks = sorted({r['task'] for r in evaluate_rows})
  rows = []
  for variant, per_task in _by_variant(evaluate_rows).items():
    any_row = next(iter(per_task.values()))
    scores = [per_task[t]['score'] for t in tasks if t in per_task]
    times = [per_task[t]['time_per_sample_s'] for t in tasks if t in per_task]
    rows.append({'variant': variant, 'label': any_row['label'], 'kv_heads': any_row['kv_heads'],
                 'method': any_row.get('method'), 'alpha': any_row.get('alpha'),
                 'model': any_row.get('model', 'target'),
                 'scores': {t: per_task[t]['score'] for t in tasks if t in per_task},
                 'average': sum(scores) / len(scores) if scores else float('nan'),
                 'time_per_sample_s': sum(times) / len(times) if times else float('nan')})
  return rows


def table1(evaluate_rows: Sequence[Mapping], baselines: Sequence[Mapping] = ()) -> str:
  """GQA Table 1: T_infer and per-task quality (+ average) for every model, then the trivial
  `baselines` (rows of `reproduce.baselines.evaluate`) for scale."""
  tasks = sorted({r['task'] for r in evaluate_rows})
  rows = quality_rows(evaluate_rows)
  rows.sort(key=lambda r: (r['model'] != 'target', -r['kv_heads'], r['label']))
  body = [[r['label'], f"{1000 * r['time_per_sample_s']:.2f}", r['average']]
          + [r['scores'].get(t) for t in tasks] for r in rows]
  return markdown_table(['Model', 'T_infer (ms/sample)', 'Average']
                        + [TASK_LABELS.get(t, t) for t in tasks],
                        body + baseline_rows(baselines, tasks))


def baseline_rows(baselines: Sequence[Mapping], tasks: Sequence[str]) -> List[list]:
  """Table 1 rows of the trivial baselines: `baseline: <name>`, no time, no average, the score
  in its task's column only (the likelihood's unigram baseline is `likelihood_table`'s)."""
  return [[f"baseline: {b['baseline']}", '-', None] + [b['score'] if b['task'] == t else None
                                                        for t in tasks]
          for b in baselines if b['task'] in tasks and 'likelihood' not in b]


def likelihood_table(evaluate_rows: Sequence[Mapping], baselines: Sequence[Mapping] = ()) -> str:
  """Per model and task, the teacher-forced log-likelihood of the test references (nats per target
  token) and token accuracy (%), then the unigram language-model baseline's."""
  rows = [r for r in evaluate_rows if 'likelihood' in r]
  tasks = sorted({r['task'] for r in rows})
  by_variant = _by_variant(rows)
  order = sorted(by_variant.items(), key=lambda kv: (
      next(iter(kv[1].values())).get('model', 'target') != 'target',
      -next(iter(kv[1].values()))['kv_heads'], next(iter(kv[1].values()))['label']))
  body = []
  for _, per_task in order:
    label = next(iter(per_task.values()))['label']
    cells = []
    for t in tasks:
      lk = per_task[t]['likelihood'] if t in per_task else None
      cells += [lk and lk['loglik'], lk and lk['token_acc']]
    body.append([label] + [None if c is None else float(c) for c in cells])
  for b in baselines:
    if 'likelihood' in b and b['task'] in tasks:
      cells = []
      for t in tasks:
        cells += ([b['likelihood']['loglik'], b['likelihood']['token_acc']] if b['task'] == t
                  else [None, None])
      body.append([f"baseline: {b['baseline']}"] + cells)
  header = ['Model']
  for t in tasks:
    name = TASK_LABELS.get(t, t).split(' (')[0]
    header += [f'{name} log-likelihood (nats/token)', f'{name} token accuracy (%)']
  return markdown_table(header, [[r[0]] + ['-' if c is None else f'{c:.3f}' for c in r[1:]]
                                 for r in body])


def conversion_table(evaluate_rows: Sequence[Mapping], alpha: float) -> str:
  """GQA Figure 4 as a table: conversion method vs average quality, at one uptraining alpha."""
  rows = [r for r in quality_rows(evaluate_rows)
          if r['method'] is not None and r['alpha'] == alpha]
  rows.sort(key=lambda r: (r['kv_heads'], r['method']))
  return markdown_table(['Model', 'Method', 'Average'],
                        [[r['label'].split(' (')[0], r['method'], r['average']] for r in rows])


def uptraining_table(evaluate_rows: Sequence[Mapping], method: str = 'mean') -> str:
  """GQA Figure 5 as a table: uptraining proportion alpha vs average quality."""
  rows = [r for r in quality_rows(evaluate_rows) if r['method'] == method]
  kinds = sorted({r['kv_heads'] for r in rows})
  alphas = sorted({r['alpha'] for r in rows})
  lookup = {(r['kv_heads'], r['alpha']): r['average'] for r in rows}
  body = [[f'alpha={a:g}'] + [lookup.get((g, a)) for g in kinds] for a in alphas]
  header = ['Uptraining'] + [('MQA' if g == 1 else f'GQA-{g}') for g in kinds]
  return markdown_table(header, body)


def timing_table(timing_rows: Sequence[Mapping]) -> str:
  """GQA Figure 6 as a table: time per sample vs number of K/V groups, per setting."""
  settings = sorted({r['setting'] for r in timing_rows})
  groups = sorted({r['kv_heads'] for r in timing_rows})
  lookup = {(r['setting'], r['kv_heads']): r['time_per_sample_s'] for r in timing_rows}
  body = [[str(g)] + [None if (s, g) not in lookup else 1000 * lookup[(s, g)] for s in settings]
          for g in groups]
  labels = []
  for s in settings:
    r = next(r for r in timing_rows if r['setting'] == s)
    labels.append(f"{s} ({r['inputs']}/{r['targets']} tokens) ms/sample")
  return markdown_table(['KV groups'] + labels, body)


def speculative_table(spec_rows: Sequence[Mapping]) -> str:
  """Leviathan Table 2: per target, draft and temperature the best gamma, alpha and speedup."""
  best: Dict[tuple, Mapping] = {}
  for r in spec_rows:
    key = (r['task'], r['target'], r['draft'], r['temperature'])
    if key not in best or r['speedup_measured'] > best[key]['speedup_measured']:
      best[key] = r
  body = [[r['task'], r['target'], r['draft'], _fmt(r['temperature'], 0), str(r['gamma']),
           r['alpha'], r['tokens_per_call'], r['c'], f"{r['speedup_measured']:.2f}x",
           f"{r['speedup_thm8']:.2f}x"] for _, r in sorted(best.items())]
  return markdown_table(['Task', 'Target', 'Draft', 'Temp', 'gamma', 'alpha', 'tokens/call', 'c',
                         'Speed (measured)', 'Speed (Thm 8)'], body)


def auto_table(spec_record: Mapping) -> str:
  """`--gamma auto` beside the best and the worst fixed gamma of the same task, target, draft and
  temperature (measured speedups over autoregressive decoding in the same job)."""
  fixed: Dict[tuple, List[Mapping]] = {}
  for r in spec_record['rows']:
    fixed.setdefault((r['task'], r['target'], r['draft'], r['temperature']), []).append(r)
  body = []
  for a in sorted(spec_record.get('auto_rows', ()),
                  key=lambda r: (r['task'], r['target'], r['draft'], r['temperature'])):
    rows = fixed.get((a['task'], a['target'], a['draft'], a['temperature']), [])
    best = max(rows, key=lambda r: r['speedup_measured'], default=None)
    worst = min(rows, key=lambda r: r['speedup_measured'], default=None)
    body.append([a['task'], a['target'], a['draft'], _fmt(a['temperature'], 0),
                 f"{a['speedup_measured']:.2f}x", a['tokens_per_call'],
                 ' '.join(str(x) for x in a['gamma_histogram']),
                 '-' if best is None else
                 f"{best['speedup_measured']:.2f}x (gamma={best['gamma']})",
                 '-' if worst is None else
                 f"{worst['speedup_measured']:.2f}x (gamma={worst['gamma']})"])
  return markdown_table(['Task', 'Target', 'Draft', 'Temp', 'Speed (auto)', 'tokens/call',
                         'target calls per gamma 0..max', 'best fixed', 'worst fixed'], body)


def alpha_table(spec_rows: Sequence[Mapping]) -> str:
  """Leviathan Table 3: alpha per draft model, task and temperature (alpha does not depend on gamma;
  averaged over the gammas measured)."""
  groups: Dict[tuple, List[float]] = {}
  for r in spec_rows:
    groups.setdefault((r['task'], r['target'], r['draft'], r['temperature']), []).append(r['alpha'])
  body = [[t, tgt, d, _fmt(temp, 0), sum(a) / len(a)] for (t, tgt, d, temp), a in
          sorted(groups.items())]
  return markdown_table(['Task', 'Target', 'Draft', 'Temp', 'alpha'], body)


# ---------------------------------------------------------------------------------------------
# Staged speculation (Spector & Re 2023) and drafts trained against the target (Chimera 2024).
# Inputs: speculative.json's `drafts_rows` (chains: 'draft model', 'distilled', 'chimera',
# 'staged ...'), `tree_rows` and `jobs` (the drafts jobs' autoregressive baselines), and
# drafts.json's `rows` (per-head top-k accuracy).

def _mb(x) -> str:
  return '-' if x is None else f'{x / 1e6:.3f}'


def spector_table(spec: Mapping) -> str:
  """Spector & Re Table 1's form per task and temperature: autoregressive, plain speculation and
  the other chains at their best gamma, and every tree: tokens per target call, tokens/s, speedup
  over autoregressive and over plain speculation, parameter bytes read per generated token."""
  body = []
  for job in spec.get('jobs', []):
    chains = job.get('drafts_rows')
    if chains is None:  # a chain job with trees (no drafts job: `Preset.trained_drafts` false)
      if 'tree_rows' not in job:
        continue
      chains = [r for r in job['rows'] if r['draft'] == 'draft model']
    for temp, ar in sorted(job['autoregressive'].items(), key=lambda kv: float(kv[0])):
      t = float(temp)
      best: Dict[str, Mapping] = {}
      for r in chains:
        if r['temperature'] == t and (r['draft'] not in best or
                                      r['speedup_measured'] > best[r['draft']]['speedup_measured']):
          best[r['draft']] = r
      plain = best.get('draft model')
      ar_tps = ar['tokens'] / ar['seconds']
      body.append([job['task'], _fmt(t, 0), 'autoregressive', '1.00', f'{ar_tps:.1f}', '1.00x',
                   '-' if plain is None else f"{1 / plain['speedup_measured']:.2f}x",
                   _mb(ar.get('target_bytes_per_token')), '-', '-'])
      methods = [(f"chain {name} (gamma={r['gamma']})", r) for name, r in best.items()]
      methods += [(r['draft'], r) for r in job['tree_rows'] if r['temperature'] == t]
      for label, r in methods:
        eq = r['tokens_equal_autoregressive']
        body.append([job['task'], _fmt(t, 0), label, f"{r['tokens_per_call']:.2f}",
                     f"{r['tokens'] / r['seconds']:.1f}", f"{r['speedup_measured']:.2f}x",
                     '-' if plain is None else
                     f"{r['speedup_measured'] / plain['speedup_measured']:.2f}x",
                     _mb(r.get('target_bytes_per_token')), _mb(r.get('draft_bytes_per_token')),
                     '-' if eq is None else str(eq)])
  return markdown_table(['Task', 'Temp', 'Method', 'tokens/call', 'tokens/s', 'vs AR',
                         'vs plain spec', 'target MB/token', 'draft MB/token', '= AR (greedy)'],
                        body)


_SPEC_NAME = {'independent': 'draft model', 'distilled': 'distilled', 'chimera': 'chimera'}


def chimera_table(draft_rows: Sequence[Mapping], spec: Mapping) -> str:
  """Chimera Table 5's form: per draft and head, top-1..top-5 accuracy against the target's greedy
  outputs on validation inputs, with the greedy chain's mean accepted length (accepted draft tokens
  per target call) and alpha at the largest gamma measured."""
  chains = spec.get('drafts_rows', [])
  body = []
  for d in sorted(draft_rows, key=lambda r: (r['task'], r['draft'])):
    runs = [r for r in chains if r['task'] == d['task'] and r['draft'] == _SPEC_NAME[d['draft']]
            and r['temperature'] == 0]
    run = max(runs, key=lambda r: r['gamma']) if runs else None
    for i, h in enumerate(d['head_accuracy']):
      first = i == 0 and run is not None
      body.append([d['task'], d['draft'], str(h['head'])] + [h[f'top{k}'] for k in range(1, 6)]
                  + [f"{run['accepted'] / run['target_calls']:.2f} (gamma={run['gamma']})"
                     if first else '', run['alpha'] if first else ''])
  return markdown_table(['Task', 'Draft', 'Head', 'top-1', 'top-2', 'top-3', 'top-4', 'top-5',
                         'mean accepted (T=0)', 'alpha (T=0)'], body)
