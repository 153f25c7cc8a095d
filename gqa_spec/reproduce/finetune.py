"""The reproduction's `finetune` stage: every variant and the draft, per task or multi-task.

Per task (`finetune_multitask` False, the GQA paper's design): one job per model per task
(`<task>.<model>`), trained on the task at its `finetune_lengths` and validated on it; the best
checkpoint by the task's metric (BLEU / ROUGE-1) is kept.

Multi-task (`finetune_multitask` True, a budget deviation): one job per model
(`multitask.<model>`), trained on `ddtp_translate_summarize` (the two tasks 1:1) at
`Preset.multitask_lengths()`. Every evaluation scores both tasks, each on its own validation split
at its own lengths (`TaskMeanEvaluator`), and the best checkpoint is the one with the highest mean
of the two metrics (`multitask_metric`, 'mean_bleu_rouge1'). The stage still returns one row per
(model, task), both rows pointing at the job's best checkpoint, so that the later stages read the
same rows in either design.

All jobs: constant lr (the preset's, per role), dropout 0.1, resumable like every stage (a job
saves its train state at its end or when stopped, and every 500 steps, not every evaluation).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Mapping

from gqa_spec.reproduce import jobs as jobs_lib
from gqa_spec.reproduce.presets import MULTITASK, TASK_METRIC, Variant


def multitask_metric(task_metrics: Mapping[str, str]) -> str:
  """The multi-task selection metric's name: `mean_` + the tasks' metrics ('mean_bleu_rouge1')."""
  return 'mean_' + '_'.join(task_metrics.values())


class TaskMeanEvaluator:
  """The trainer's evaluator for multi-task fine-tuning: one `InferenceEvaluator` per task.

  Returns `'<task>/<metric>'` for every metric of every task, `'<task>/timing/...'`, and
  `name` = the mean of the tasks' selection metrics (`metrics[task]`).

  Args:
    evaluators: task -> its evaluator (a callable `(params, step) -> metrics`).
    metrics: task -> the metric the mean takes from it (e.g. 'bleu').
    name: the mean's name.
  """

  def __init__(self, evaluators: Mapping[str, object], metrics: Mapping[str, str], name: str):
    self.evaluators, self.metrics, self.name = dict(evaluators), dict(metrics), name

  def __call__(self, params, step: int) -> Dict[str, float]:
    out = {}
    for task, evaluator in self.evaluators.items():
      for key, value in evaluator(params, step).items():
        if key.startswith(f'{task}/'):
          out[key] = float(value)
        elif key.startswith('timing/'):
          out[f'{task}/{key}'] = float(value)
    out[self.name] = sum(out[f'{t}/{m}'] for t, m in self.metrics.items()) / len(self.metrics)
    return out


def _sources(ctx) -> List[tuple]:
  """`(name, config, initial checkpoint, variant or None)` of every model to fine-tune."""
  p = ctx.preset
  uptrained = {Variant(**r['variant']).name: ctx.path(r['checkpoint'])
               for r in ctx.read_stage('uptrain')['rows']}
  out = []
  for v in p.variants():
    source = ctx.model_dir('pretrain', 'target') if v.method is None else uptrained[v.name]
    out.append((v.name, p.target.replace(num_kv_heads=v.kv_heads), source, v))
  out.append(('draft', p.draft, ctx.model_dir('pretrain', 'draft'), None))
  return out


def _evaluator(ctx, task: str, config):
  from gqa_spec.evaluation.evaluator import InferenceEvaluator  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  inputs, targets = p.finetune_lengths[task]
  return InferenceEvaluator(ctx.task(task), config, 'validation',
                            {'inputs': inputs, 'targets': targets},
                            batch_size=p.eval_batch, num_examples=p.validation_examples)


def _row(record: dict, name: str, task: str, config, variant) -> dict:
  return dict(record, name=name, task=task, kv_heads=config.num_kv_heads,
              variant=None if variant is None else dataclasses.asdict(variant),
              best_checkpoint=os.path.join(record['model_dir'], 'best'))


def stage_finetune(ctx) -> dict:
  """Per-task or multi-task fine-tuning of every model (module docstring); one row per (model,
  task) either way."""

  from gqa_spec.training.optimizer import constant  # pylint: disable=g-import-not-at-top
  jobs_lib.register_tasks(ctx)
  p = ctx.preset
  task_metrics = {task: TASK_METRIC[task] for task in p.finetune_lengths}
  mean_name = multitask_metric(task_metrics)

  def train(name, config, source, variant, task, lengths, evaluator, best_metric):
    record = jobs_lib.train(
        ctx.model_dir('finetune', task, name), config, ctx.task(task), lengths, p.finetune_batch,
        p.finetune_steps, learning_rate_fn=constant(p.finetune_lr(
            'draft' if variant is None else 'target')),
        initial_checkpoint_path=source, initial_step=0, evaluator=evaluator,
        eval_period=p.eval_period, best_metric=best_metric,
        # The train state at the end (and on SIGTERM: the trainer's save on exit), and every 500
        # steps of a longer job. The presets' jobs are 100-300 steps: an orbax save of the smoke
        # state costs ~0.6 s (~20 of its steps), and a hard kill re-runs one job. The best
        # checkpoint is exported at every new best anyway.
        save_period=min(p.finetune_steps, 500), work_dir=ctx.work_dir)
    return dict(record, best_metric=best_metric)

  jobs, expand = [], []  # expand: (job index, name, config, variant) -> the job's rows
  for name, config, source, variant in _sources(ctx):
    config = config.replace(dropout_rate=0.1)
    if p.finetune_multitask:
      def job(name=name, config=config, source=source, variant=variant):
        evaluator = TaskMeanEvaluator({t: _evaluator(ctx, t, config) for t in task_metrics},
                                      task_metrics, mean_name)
        return train(name, config, source, variant, MULTITASK, p.multitask_lengths(), evaluator,
                     mean_name)
      expand.append((len(jobs), name, config, variant))
      jobs.append((f'multitask.{name}', job))
      continue
    for task, lengths in p.finetune_lengths.items():
      def job(name=name, config=config, source=source, variant=variant, task=task,
              lengths=lengths):
        return _row(train(name, config, source, variant, task, lengths,
                          _evaluator(ctx, task, config), task_metrics[task]),
                    name, task, config, variant)
      jobs.append((f'{task}.{name}', job))
  # Started task by task: side by side (`workers`), the first two jobs then compile
  # different models' steps (MHA and GQA) at once; the rows keep the model-major order.
  tasks = ['multitask'] if p.finetune_multitask else list(p.finetune_lengths)
  start = [key for task in tasks for key, _ in jobs if key.startswith(f'{task}.')]
  records = jobs_lib.run_jobs(ctx, 'finetune', jobs, p.workers, start)
  if p.finetune_multitask:
    rows = [_multitask_row(records[i], name, task, config, variant, task_metrics)
            for i, name, config, variant in expand for task in task_metrics]
  else:
    rows = [dict(r, multitask=False) for r in records]
  return {'rows': rows, 'jobs': len(jobs), 'design': p.design()}


def _multitask_row(record: dict, name: str, task: str, config, variant,
                   task_metrics: Mapping[str, str]) -> dict:
  """A (model, task) row of a multi-task job: the job's best checkpoint and that task's validation
  score at it (`best_task_score`)."""
  best = record['best']
  score = best['metrics'][f'{task}/{task_metrics[task]}'] if best else None
  return dict(_row(record, name, task, config, variant), multitask=True, best_task_score=score)
