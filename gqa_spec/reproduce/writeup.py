"""Stage `report`: markdown tables, the claims table, figures, commands and wall times."""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

from gqa_spec import atomic
from gqa_spec.reproduce import finetune, premise
from gqa_spec.reproduce import jobs as jobs_lib
from gqa_spec.reproduce.jobs import Context
from gqa_spec.reproduce.presets import SUMMARIZE, TASK_METRIC, TRANSLATE
from gqa_spec.reproduce.stages import STAGES
from gqa_spec.reproduce.timing import timing_settings


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
  figures, claim_rows, claims_md = _figures_and_claims(ctx)
  walls = {s: (_optional_stage(ctx, s) or {}).get('wall_seconds') for s in STAGES[:-1]}
  job_walls = {s: jobs_lib.job_seconds(ctx, s) for s in STAGES[:-1]}
  lines = [
      f'# Reproduction: preset `{p.name}`', '',
      f'Command: `{command(ctx)}`', '',
      f'Machine: {_machine()}', '',
      *([_smoke_note(ctx), ''] if p.name == 'smoke' else []),
      '## Study design', '',
      report.design_note(p, finetune.multitask_metric(
          {t: TASK_METRIC[t] for t in p.finetune_lengths})), '',
      '## Claims', '', claims_md, '',
      '## GQA Table 1: quality and time per sample (test split, greedy)', '',
      report.table1(evaluate, evaluate_stage.get('baselines', ())), '',
      *(['## Teacher-forced likelihood of the test references (what claims 1a-3b are decided on)',
         '', report.likelihood_table(evaluate, evaluate_stage.get('baselines', ())), '']
        if any('likelihood' in r for r in evaluate) else []),
      f'## GQA Figure 4: conversion methods (alpha = {p.method_ablation_alpha:g})', '',
      report.conversion_table(evaluate, p.method_ablation_alpha), '',
      '## GQA Figure 5: uptraining proportion (mean pooling)', '',
      report.uptraining_table(evaluate), '',
      '## GQA Figure 6: time per sample vs number of K/V groups', '',
      report.timing_table(timing), '',
      '## Speculative decoding (Leviathan Table 2 form): best gamma per draft', '',
      report.speculative_table(spec), '',
      '## `--gamma auto` beside fixed gammas (draft model)', '',
      report.auto_table(spec_record), '',
      '## Acceptance rate alpha per draft (Leviathan Table 3 form)', '',
      report.alpha_table(spec), '',
      '## Token trees and staged speculation (Spector & Re Table 1 form), MHA target', '',
      report.spector_table(spec_record), '',
      '## Drafts trained against the target (Chimera Table 5 form), MHA target', '',
      report.chimera_table(ctx.read_stage('drafts')['rows'], spec_record), '',
      '## The premise pair: speculation where a greedy step is weight-bound', '',
      premise.report_section(_optional_stage(ctx, 'premise')), '',
      '## Figures', '']
  lines += [f'Drawn from the stage JSON by `{command(ctx)} --stages report --force` (no '
            'retraining or re-timing).', '']
  lines += [f'![{f}]({f})' for f in figures]
  lines += ['', '## Wall time per stage (seconds)', '',
            'The machine line above is the report\'s: stage records do not name where they '
            'ran. "Last run" is the invocation that '
            'finished the stage; a stage resumed after a kill also ran jobs in earlier '
            'invocations, which "jobs" sums (each finished job\'s own time, from '
            '`<work dir>/jobs/<stage>/`; set-up between jobs and '
            'work lost to a kill are left out; "-" for stages without jobs).' +
            (f' Training stages ran {p.workers} jobs side by side '
             '(the preset\'s `workers`): their jobs\' times overlap, and sum to more than the stage '
             'took.' if p.workers > 1 else ''), '',
            report.markdown_table(['Stage', 'Last run', 'Jobs'],
                                  [[s, w, '-' if job_walls[s] is None else job_walls[s]]
                                   for s, w in walls.items()]), '']
  atomic.write_text(os.path.join(ctx.out_dir, 'report.md'), '\n'.join(lines))
  return {'figures': figures, 'report': 'report.md', 'stage_wall_seconds': walls,
          'claims': [{'key': c.key, 'claim': c.claim, 'ours': c.ours, 'verdict': c.verdict,
                      'why': c.why, 'text_metric': c.text_metric} for c in claim_rows],
          'stage_job_seconds': job_walls,
          'design': p.design()}


def _figures_and_claims(ctx: Context) -> Tuple[List[str], list, str]:
  """Writes the PNG figures; returns their names, the claims and the claims section of report.md."""
  from gqa_spec.reproduce import claims, decode_bytes, figures, quality_claims  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  evaluate, timing, spec = (ctx.read_stage(s) for s in ('evaluate', 'timing', 'speculative'))
  predicted = decode_bytes.predicted_times(
      timing['rows'], {s: config for s, (config, _) in timing_settings(p).items()})
  names = figures.plot_all(ctx.out_dir, evaluate['rows'], timing['rows'], spec,
                           p.method_ablation_alpha, predicted)
  rows = claims.all_claims(evaluate, timing, spec, p.method_ablation_alpha, predicted,
                           _optional_stage(ctx, 'premise'))
  notes = [claims.PROXY_NOTE] if quality_claims.has_likelihood(evaluate) else []
  return names, rows, '\n\n'.join([quality_claims.quality_bar(evaluate), claims.markdown(rows),
                                     claims.NOTE] + notes)


def _optional_stage(ctx: Context, stage: str) -> Optional[dict]:
  """A stage's record, or None for the premise stage where it has not run (a study from before
  the stage existed still reports); any other missing stage is an error (`read_stage`)."""
  if stage == 'premise' and not os.path.exists(ctx.stage_path(stage)):
    return None
  return ctx.read_stage(stage)


def _smoke_note(ctx: Context) -> str:
  """What a smoke report is: a pipeline check on the packaged excerpt, not a finding."""
  return smoke_note(*smoke_splits(ctx.read_stage('corpus')), ctx.preset.fast_compile_decoding)


def smoke_splits(corpus: dict) -> Tuple[dict, dict]:
  """(train, test) sizes for `smoke_note` from the corpus stage's record: its DDTP stats, or, with
  `--exported`, the exported tasks' example counts (a task the study does not read is left out)."""
  if 'stats' in corpus:
    return corpus['stats']['splits']['train'], corpus['stats']['splits']['test']
  tasks = corpus['tasks']

  def sizes(split):
    names = (('translate_en_de_pairs', TRANSLATE), ('summarize_examples', SUMMARIZE))
    return {key: tasks[name]['splits'][split]['examples'] for key, name in names
            if split in tasks.get(name, {}).get('splits', {})}

  return sizes('train'), sizes('test')


def smoke_note(train: dict, test: dict, fast_compile_decoding: bool = False) -> str:
  """The smoke label for the report and the terminal (split sizes from `smoke_splits`)."""

  def counted(split):
    nouns = (('translate_en_de_pairs', 'translation pairs'), ('summarize_examples', 'summaries'))
    parts = [f'{split[key]} {noun}' for key, noun in nouns if key in split]
    return ' and '.join(parts) or 'no examples'

  return ('**Smoke run: a pipeline check on a tiny excerpt, not findings.** Tiny models trained '
          'for a few hundred steps on the DDTP excerpt shipped in the package '
          f'({counted(train)} to train on, {counted(test)} to test): the numbers show that every '
          'stage learns and measures, not whether any paper claim holds (that is `--preset cpu`).' +
          (' Its speculative loops are compiled with XLA\'s fast-compile options '
           '(`fast_compile_decoding`): their times and speedups are of unoptimised code.'
           if fast_compile_decoding else ''))


def claims_summary(claims: List[dict]) -> str:
  """The terminal's summary of the claims table: what holds at this scale first, then one line
  each for the rest (the full table with intervals and reasons is in report.md)."""
  holds = [c for c in claims if c['verdict'] == 'holds']
  rest = [c for c in claims if c['verdict'] != 'holds']
  lines = [f'Holds at this scale ({len(holds)} of {len(claims)} claims):']
  lines += [f"  {c['key']:>3}  {c['claim']}: {c['ours']}" for c in holds] or ['  none']
  if rest:
    lines.append('Not shown at this scale (reasons in report.md):')
    lines += [f"  {c['key']:>3}  {c['claim']}: {c['verdict']}" for c in rest]
  return '\n'.join(lines)


def command(ctx: Context) -> str:
  sets = ''.join(f' --set {o}' for o in ctx.overrides)
  if ctx.exported_dir is not None:
    sets += f' --exported {ctx.exported_dir}'
  if not sets:
    return f'gqa-spec reproduce --preset {ctx.preset.name}'
  return (f'gqa-spec reproduce --preset {ctx.preset.name}{sets} --out {ctx.out_dir} '
          f'--work-dir {ctx.work_dir}')


def _machine() -> str:
  import platform  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  return (f'{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, '
          f'JAX {jax.__version__} on {jax.devices()[0].platform}')
