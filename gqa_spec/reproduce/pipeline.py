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
  premise      the preset's premise pair (`Preset.premise`, cpu only): a weight-bound target
               pre-trained and fine-tuned on translate, a Chimera and a distilled draft against
               it, and the speculative rows at batch 1 and 8 where Theorem 8 can pay
               (`premise.py`); a preset without one records so
  report       markdown tables, the claims table (`claims.py`), PNG figures (`figures.py`),
               commands and wall times
This module only drives: `run` calls each stage's function in `STAGES` order (their modules:
`pretraining`, `finetune`, `drafts`, `evaluate`, `timing`, `speculation`, `premise`,
`writeup`), all built on `jobs`. Models live under the work dir (default `runs/<preset>/`, not committed); everything a table needs
is in the stage JSON. Inside a stage, finished jobs are skipped and a killed training job resumes
from its last checkpoint (the trainer's own resume).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Dict, Optional, Sequence

from gqa_spec import progress, rundir_lock
from gqa_spec.errors import UserError
from gqa_spec.reproduce import (drafts, evaluate, finetune, premise, pretraining, speculation,
                                timing)
from gqa_spec.reproduce import jobs as jobs_lib
from gqa_spec.reproduce import overrides as overrides_lib
from gqa_spec.reproduce import presets as presets_lib
from gqa_spec.reproduce import writeup
from gqa_spec.reproduce.jobs import Context, compilation_cache
from gqa_spec.reproduce.stages import STAGES


STAGE_FNS = {'corpus': pretraining.stage_corpus, 'pretrain': pretraining.stage_pretrain,
             'uptrain': pretraining.stage_uptrain, 'finetune': finetune.stage_finetune,
             'drafts': drafts.stage_drafts, 'evaluate': evaluate.stage_evaluate,
             'timing': timing.stage_timing, 'speculative': speculation.stage_speculative,
             'premise': premise.stage_premise, 'report': writeup.stage_report}


def run(preset_name: str, out_dir: Optional[str] = None, work_dir: Optional[str] = None,
        stages: Optional[Sequence[str]] = None, force: bool = False,
        progress_bar: Optional[bool] = None,
        overrides: Sequence[str] = (), exported_dir: Optional[str] = None,
        time_limit: Optional[float] = None) -> Dict[str, dict]:
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
    exported_dir: read the tasks from `gqa-spec data export`'s directory (no TensorFlow or seqio
      needed); required where they cannot be imported.
    time_limit: seconds; the run stops cleanly before them (`jobs.time_limit`): finished stages
      and jobs are kept, a training job saves a checkpoint, and the same call resumes. The
      returned records then hold `'stopped': {'stage': ...}`.
  """
  preset = overrides_lib.apply(presets_lib.get(preset_name), overrides)
  if overrides and (out_dir is None or work_dir is None):
    raise UserError('--set changes the preset: give its own --out and --work-dir (the defaults '
                    f'hold the unchanged {preset_name!r} study)')
  unknown = [s for s in stages or () if s not in STAGES]
  if unknown:
    raise UserError(f'unknown stage(s) {unknown}; stages: {", ".join(STAGES)}')
  todo = [s for s in STAGES if not stages or s in stages]
  if exported_dir is None and not _seqio_importable():
    raise UserError('TensorFlow or seqio cannot be imported here: give the exported tasks with '
                    '--exported DIR (written by `gqa-spec data export` where they can)')
  if exported_dir is not None and not os.path.isdir(exported_dir):
    raise UserError(f'--exported {exported_dir}: no such directory')
  ctx = Context(preset, out_dir or os.path.join('results', preset_name),
                work_dir or os.path.join('runs', preset_name), overrides=tuple(overrides),
                exported_dir=exported_dir)
  with rundir_lock.running(ctx.out_dir), rundir_lock.running(ctx.work_dir):  # one reproduction each
    return _run_stages(ctx, preset_name, todo, force, time_limit, progress_bar, overrides,
                       exported_dir)


def _run_stages(ctx, preset_name, todo, force, time_limit, progress_bar, overrides, exported_dir):
  """`run`'s stages, in `ctx`'s directories (locked)."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  jobs_lib.write_json(os.path.join(ctx.out_dir, 'preset.json'),
                      dict(json.loads(json.dumps(dataclasses.asdict(ctx.preset), default=str)),
                           work_dir=os.path.relpath(ctx.work_dir, ctx.out_dir),  # its own dir
                           overrides=list(overrides), exported=exported_dir is not None))
  records = {}
  # Jobs on the same data share its batches (training/data.py; the smoke preset's 12 fine-tuning
  # jobs read 2 datasets) and their evaluators seqio's examples and targets (evaluator.py).
  from gqa_spec.evaluation.evaluator import shared_eval_data  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.data import shared_batches  # pylint: disable=g-import-not-at-top
  if progress_bar is None:
    progress_bar = sys.stderr.isatty()
  with tqdm(total=len(todo), desc=f'reproduce {preset_name}', unit='stage',
            disable=not progress_bar) as bar, \
       compilation_cache(ctx.work_dir), shared_batches(), shared_eval_data(), \
       jobs_lib.time_limit(ctx, time_limit):
    ctx.progress = bar
    for n, stage in enumerate(todo, 1):
      if ctx.stop_requested:
        records['stopped'] = {'stage': stage}
        break
      bar.set_postfix_str(stage)
      path = ctx.stage_path(stage)
      if os.path.exists(path) and not force:
        records[stage] = ctx.read_stage(stage)
      else:
        t0 = time.time()
        with progress.scope(f'reproduce {preset_name}', f'stage {n}/{len(todo)} {stage}'):
          progress.info('started')
          try:
            record = STAGE_FNS[stage](ctx)
          except jobs_lib.TimeLimitReached as e:
            progress.info('time limit: %s; the same command resumes', e)
            records['stopped'] = {'stage': stage}
            break
          progress.info('done in %s', progress.format_seconds(time.time() - t0))
        record['wall_seconds'] = round(time.time() - t0, 1)
        record['command'] = writeup.command(ctx) + f' --stages {stage}'
        jobs_lib.write_json(path, record)
        records[stage] = record
      bar.update(1)
  return records


def _seqio_importable() -> bool:
  import importlib.util  # pylint: disable=g-import-not-at-top
  try:
    return all(importlib.util.find_spec(m) is not None for m in ('tensorflow', 'seqio'))
  except (ImportError, ValueError):
    return False


