"""The reproduction's `drafts` stage: drafts trained against the frozen fine-tuned MHA target.

Per task (jobs `<task>.chimera`, `<task>.distilled`, `<task>.independent`):
  chimera      a Chimera draft with max(gammas) heads (`train-draft --kind chimera`): trigram
               encoder + one full-context block + residual heads over the target's hidden states,
               on the preset's `chimera_label_source` (the paper's: the data's tokens), for as
               many steps as the distilled draft;
  distilled    the preset's draft architecture started from the fine-tuned (independent) draft and
               trained on the target's greedy outputs for the task's training inputs
               (`train-draft --kind model`, sequence-level knowledge distillation);
  independent  the fine-tuned draft itself, not trained here (its accuracy for the comparison).
Each records Chimera Table 5's form on `validation_examples` validation inputs: per head, top-1..5
accuracy against the target's greedy continuation (a model draft has one "head", its
teacher-forced next token; `draft_training.head_topk_accuracy`). Mean accepted lengths come from
the speculative stage, which decodes with these drafts.

Resumable as every stage: finished jobs are skipped, a killed training job resumes from its
run directory's last checkpoint (`trainer.train`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from typing import Optional

from gqa_spec import rundir
from gqa_spec.errors import UserError
from gqa_spec.reproduce import jobs as jobs_lib


def chimera_heads(preset) -> int:
  """Heads of the stage's Chimera drafts: enough for every gamma and the Chimera tree's depth."""
  from gqa_spec.decoding.tree import TreeShape  # pylint: disable=g-import-not-at-top
  heads = max(preset.gammas)
  depth = TreeShape.parse(preset.chimera_tree).depth
  if depth > heads:
    raise UserError(f'chimera_tree {preset.chimera_tree!r} has depth {depth}; the Chimera drafts '
                    f'have max(gammas) = {heads} heads')
  if not preset.draft_gammas or max(preset.draft_gammas) > heads or min(preset.draft_gammas) < 1:
    raise UserError(f'draft_gammas {preset.draft_gammas} must be in 1..max(gammas) = {heads} (the '
                    'Chimera heads)')
  return heads


def _validation_batches(task: str, lengths, preset):
  from gqa_spec.training.data import DatasetConfig, get_batches  # pylint: disable=g-import-not-at-top
  cfg = DatasetConfig(task, {'inputs': lengths[0], 'targets': lengths[1]}, split='validation',
                      batch_size=preset.eval_batch, shuffle=False, pack=False)
  count = math.ceil(preset.validation_examples / preset.eval_batch)
  return list(itertools.islice(get_batches(cfg, num_epochs=1), count))


def _accuracy(ctx, config, params, target_path: str, task: str, lengths) -> list:
  from gqa_spec.training import draft_training  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints.load import load_any  # pylint: disable=g-import-not-at-top
  target_config, target_params, _ = load_any(target_path)
  return draft_training.head_topk_accuracy(config, params, target_config, target_params,
                                           _validation_batches(ctx.task(task), lengths,
                                                               ctx.preset))


def _train(ctx, kind: str, task: str, lengths, target_path: str, initial_path=None,
           size=None) -> dict:
  """Trains a draft against the frozen target (`size`: `Size`, default the drafts stage's)."""
  from gqa_spec.training import draft_training, trainer  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.data import DatasetConfig  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.optimizer import constant  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  name = 'chimera' if kind == 'chimera' else 'distilled'
  steps, batch, lr = ((p.chimera_steps, p.chimera_batch, p.chimera_learning_rate)
                      if kind == 'chimera' else
                      (p.distill_steps, p.distill_batch, p.distill_learning_rate))
  run_dir = ctx.model_dir('drafts', task, name)
  if size is not None:
    steps, batch, run_dir = size.steps, size.batch, os.path.join(size.models_dir, name)
  data = DatasetConfig(ctx.task(task), {'inputs': lengths[0], 'targets': lengths[1]},
                       batch_size=batch,
                       pack=False)
  result = draft_training.train_draft(
      kind=kind, target_checkpoint=target_path, model_dir=run_dir, train_dataset_cfg=data,
      total_steps=steps, draft_model_config=p.draft if kind == 'model' else None,
      num_draft_heads=chimera_heads(p), learning_rate_fn=constant(lr),
      checkpoint_cfg=trainer.CheckpointConfig(save_period=max(10, steps // 5), keep=1,
                                              asynchronous=False),
      log_period=max(1, min(50, steps // 4)), initial_checkpoint_path=initial_path,
      label_source=p.chimera_label_source if kind == 'chimera' else 'target')
  jobs_lib.check_finished(result, steps, run_dir)
  return {'task': task, 'draft': name, 'kind': kind, 'step': result.step,
          'label_source': p.chimera_label_source if kind == 'chimera' else 'target',
          'steps': steps, 'batch_size': batch, 'learning_rate': lr,
          'train_metrics': ({k: float(v) for k, v in result.train_metrics.items()}
                            or _last_logged_train_metrics(run_dir)),
          'run_dir': ctx.relative(run_dir), 'target': ctx.relative(target_path),
          'initial_checkpoint': None if initial_path is None else ctx.relative(initial_path)}


@dataclasses.dataclass(frozen=True)
class Size:
  """Steps and batch of a draft job and where its run directories go (`<models_dir>/<draft>`):
  the premise stage's drafts (`premise.py`); the drafts stage uses the preset's own."""

  steps: int
  batch: int
  models_dir: str


def chimera_job(ctx, task: str, lengths, target_path: str, size: Optional[Size] = None) -> dict:
  """A Chimera draft trained against the frozen target at `target_path`, with its per-head
  accuracy (module docstring)."""
  from gqa_spec.checkpoints import drafts as draft_records  # pylint: disable=g-import-not-at-top
  record = _train(ctx, 'chimera', task, lengths, target_path, size=size)
  config, params, _ = draft_records.load_chimera(ctx.path(record['run_dir']))
  return dict(record, num_draft_heads=config.num_draft_heads,
              head_accuracy=_accuracy(ctx, config, params, target_path, task, lengths))


def distilled_job(ctx, task: str, lengths, target_path: str, independent: str,
                  size: Optional[Size] = None) -> dict:
  """The draft architecture distilled against the frozen target from the `independent` draft's
  checkpoint, with its accuracy (module docstring)."""
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  record = _train(ctx, 'model', task, lengths, target_path, initial_path=independent, size=size)
  checkpoint = os.path.join(ctx.path(record['run_dir']), rundir.DRAFT_EXPORT_DIR)
  config, params, _ = native.load_checkpoint(checkpoint)
  return dict(record, checkpoint=ctx.relative(checkpoint),
              head_accuracy=_accuracy(ctx, config, params, target_path, task, lengths))


def independent_job(ctx, task: str, lengths, target_path: str, independent: str) -> dict:
  """The `independent` draft's accuracy against the target (nothing trained)."""
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  config, params, _ = native.load_checkpoint(independent)
  return {'task': task, 'draft': 'independent', 'kind': 'model', 'step': None,
          'checkpoint': ctx.relative(independent), 'target': ctx.relative(target_path),
          'head_accuracy': _accuracy(ctx, config, params, target_path, task, lengths)}


def stage_drafts(ctx) -> dict:
  """Chimera and distilled drafts per task against the fine-tuned MHA target (module docstring)."""

  p = ctx.preset
  if not p.trained_drafts:  # a time-boxed study (`Preset.trained_drafts`)
    return {'rows': [], 'skipped': 'the preset trains no drafts against the target '
                                   '(trained_drafts false)'}
  jobs_lib.register_tasks(ctx)
  chimera_heads(p)  # a bad preset fails before any training
  finetuned = {(r['task'], r['name']): ctx.path(r['best_checkpoint'])
               for r in ctx.read_stage('finetune')['rows']}
  mha = p.variants()[0].name
  jobs = []
  for task, lengths in p.finetune_lengths.items():
    target, independent = finetuned[(task, mha)], finetuned[(task, 'draft')]
    jobs += [
        (f'{task}.chimera', lambda t=task, l=lengths, tp=target: chimera_job(ctx, t, l, tp)),
        (f'{task}.distilled', lambda t=task, l=lengths, tp=target, i=independent:
         distilled_job(ctx, t, l, tp, i)),
        (f'{task}.independent', lambda t=task, l=lengths, tp=target, i=independent:
         independent_job(ctx, t, l, tp, i)),
    ]
  return {'rows': jobs_lib.run_jobs(ctx, 'drafts', jobs, p.workers), 'target': mha}


def _last_logged_train_metrics(run_dir: str) -> dict:
  """The last train record of `run_dir`'s train_log.jsonl: a run found already complete trains
  nothing, so its job record takes the metrics the run logged when it did train."""
  path = os.path.join(run_dir, 'train_log.jsonl')
  last = {}
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        record = json.loads(line)
        if record.get('split') == 'train':
          last = record
  return {k: float(v) for k, v in last.items() if k not in ('step', 'split')}
