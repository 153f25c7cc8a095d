"""Stages 1-3: the corpus, pre-training of the MHA target and draft, and uptraining."""

from __future__ import annotations

import dataclasses
import os

from gqa_spec import rundir
from gqa_spec.errors import UserError
from gqa_spec.reproduce import jobs as jobs_lib
from gqa_spec.reproduce.jobs import Context
from gqa_spec.reproduce.presets import TRANSLATE, Variant

def stage_corpus(ctx: Context) -> dict:
  if ctx.exported_dir is not None:
    return _exported_corpus(ctx)
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


def study_tasks(preset) -> list:
  """The seqio tasks and mixtures a study reads: pre-training, fine-tuning and evaluation."""
  from gqa_spec.reproduce.presets import MULTITASK  # pylint: disable=g-import-not-at-top
  names = [preset.pretrain_task, *preset.finetune_lengths]
  return names + ([MULTITASK] if preset.finetune_multitask else [])


def _exported_corpus(ctx: Context) -> dict:
  """With `--exported DIR`: the exported tasks' manifests stand for the corpus (no seqio)."""
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  manifests = {}
  for name in study_tasks(p):
    for task in exported.resolve(ctx.task(name))[0]:
      missing = {'train', 'validation', 'test'} - set(task.manifest['splits'])
      if task.name != p.pretrain_task and missing and task.metric_fns:
        raise UserError(f'exported task {task.name} lacks split(s) {sorted(missing)}; export '
                        'with --splits train,validation,test')
      manifests[task.name] = {k: task.manifest[k] for k in ('splits', 'lengths', 'vocab_size')
                              if k in task.manifest}
  vocab_size = max(m['vocab_size'] for m in manifests.values())
  if vocab_size > p.target.vocab_size:
    raise UserError(f'exported vocabulary of {vocab_size} ids does not fit the model vocab_size '
                    f'{p.target.vocab_size}')
  return {'exported_dir': os.path.abspath(ctx.exported_dir), 'tasks': manifests,
          'vocab_size': vocab_size}


def stage_pretrain(ctx: Context) -> dict:
  from gqa_spec.training.optimizer import rsqrt_decay  # pylint: disable=g-import-not-at-top
  jobs_lib.register_tasks(ctx)
  p = ctx.preset
  jobs = []
  for role, config in (('target', p.target), ('draft', p.draft)):
    jobs.append((role, lambda config=config, role=role: jobs_lib.train(
        ctx.model_dir('pretrain', role), config, ctx.task(p.pretrain_task), p.pretrain_lengths,
        p.pretrain_batch, p.pretrain_steps,
        learning_rate_fn=rsqrt_decay(*p.pretrain_schedule(role)),
        # a kill loses at most 250 steps
        save_period=max(10, min(p.pretrain_steps // 5, 250)), work_dir=ctx.work_dir)))
  target, draft = jobs_lib.run_jobs(ctx, 'pretrain', jobs, p.workers)
  return {'target': target, 'draft': draft, 'steps': p.pretrain_steps, 'design': p.design()}


def stage_uptrain(ctx: Context) -> dict:
  """Conversion (mean / first / random) and alpha x pre-training steps of the original recipe.

  `training.uptrain` continues the pre-training run's step count and rsqrt schedule with a fresh
  optimizer state (see its docstring); alpha = 0 is the converted checkpoint without training.
  """
  from gqa_spec.training import uptrain  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.optimizer import rsqrt_decay  # pylint: disable=g-import-not-at-top
  jobs_lib.register_tasks(ctx)
  p = ctx.preset
  source = ctx.model_dir('pretrain', 'target')

  def job(v: Variant) -> dict:
    model_dir = ctx.model_dir('uptrain', v.name)
    config = p.target.replace(num_kv_heads=v.kv_heads)
    record = uptrain.convert_checkpoint(model_dir, source, config, v.method)
    result = {'variant': dataclasses.asdict(v), 'uptrain_steps': 0,
              'checkpoint': ctx.relative(os.path.join(model_dir, rundir.CONVERTED_DIR)),
              'conversion': record}
    if v.alpha > 0:
      def train_fn(**kwargs):
        return jobs_lib.train(kwargs['model_dir'], kwargs['model_config'], ctx.task(p.pretrain_task),
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
  return {'rows': jobs_lib.run_jobs(ctx, 'uptrain', jobs, p.workers), 'design': p.design()}
