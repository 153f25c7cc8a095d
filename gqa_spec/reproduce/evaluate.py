"""Stage `evaluate`: test-set quality of every fine-tuned variant, with per-example scores: the
task's metric of greedy decoding (BLEU / ROUGE-1) and the teacher-forced likelihood of the
references (`likelihood.py`: nats per target token and token accuracy), with trivial baselines of
both (`baselines.py`; a unigram language model of the training targets for the likelihood)."""

from __future__ import annotations

import json
import os
from typing import List

from gqa_spec.reproduce import bootstrap
from gqa_spec.reproduce import likelihood
from gqa_spec.reproduce import jobs as jobs_lib
from gqa_spec.reproduce.jobs import Context
from gqa_spec.reproduce.presets import TASK_METRIC

def _label(ctx: Context, row: dict) -> str:
  from gqa_spec.reproduce.report import variant_label  # pylint: disable=g-import-not-at-top
  if row['name'] == 'draft':
    return 'draft (nano MHA)' if ctx.preset.name == 'cpu' else 'draft (MHA)'
  v = row['variant']
  return variant_label(v['kv_heads'], ctx.preset.target.num_heads, v['method'], v['alpha'])


def stage_evaluate(ctx: Context) -> dict:
  """Test-set quality (greedy, as the GQA paper) and median time per sample after compilation."""
  from gqa_spec.evaluation.evaluator import evaluate_checkpoint  # pylint: disable=g-import-not-at-top
  jobs_lib.register_tasks(ctx)
  p = ctx.preset
  jobs = []
  for row in ctx.read_stage('finetune')['rows']:
    def job(row=row):
      lengths = p.finetune_lengths[row['task']]
      metrics = evaluate_checkpoint(
          ctx.path(row['best_checkpoint']), ctx.task(row['task']),
          ctx.model_dir('eval', row['task'], row['name']),
          split='test', task_feature_lengths={'inputs': lengths[0], 'targets': lengths[1]},
          batch_size=p.eval_batch, num_examples=p.test_examples)
      stats = likelihood.checkpoint_statistics(
          ctx.path(row['best_checkpoint']), ctx.task(row['task']), 'test',
          {'inputs': lengths[0], 'targets': lengths[1]}, p.test_examples, p.eval_batch)
      v = row['variant'] or {}
      per_example = _per_example_scores(ctx.model_dir('eval', row['task'], row['name']),
                                        row['task'])
      return {'variant': row['name'], 'label': _label(ctx, row), 'task': row['task'],
              'per_example': per_example, 'likelihood': likelihood.record(stats),
              'kv_heads': row['kv_heads'], 'method': v.get('method'), 'alpha': v.get('alpha'),
              'model': 'draft' if row['name'] == 'draft' else 'target',
              'metric': TASK_METRIC[row['task']], 'score': metrics[TASK_METRIC[row['task']]],
              'time_per_sample_s': metrics['timing/seconds_per_sample_median'],
              'batch_size': p.eval_batch,
              'examples': len(bootstrap.decode(TASK_METRIC[row['task']], per_example)),
              'best_step': row['best']['step'] if row['best'] else None}
    jobs.append((f"{row['task']}.{row['name']}", job))
  for key, _ in jobs:  # a record from before the likelihood (a work dir of older code): redo it
    done = jobs_lib.job_done(ctx, 'evaluate', key)
    if done is not None and 'likelihood' not in done:
      os.remove(os.path.join(jobs_lib.jobs_dir(ctx, 'evaluate'), f'{key}.json'))
  return {'rows': jobs_lib.run_jobs(ctx, 'evaluate', jobs, p.eval_workers),
          'eval_workers': p.eval_workers, 'baselines': _baselines(ctx)}


def _baselines(ctx: Context) -> List[dict]:
  """Table 1's trivial baselines (copy input; first sentence / first N words) on the models' test
  examples and metrics, and the unigram language model of each task's training targets on the
  same examples' references (`reproduce/baselines.py`)."""
  from gqa_spec.reproduce import baselines  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  return (baselines.evaluate({t: TASK_METRIC[t] for t in p.finetune_lengths}, p.finetune_lengths,
                             'test', p.test_examples, source=ctx.task)
          + baselines.likelihood_baselines(p.finetune_lengths, 'test', p.test_examples,
                                           p.target.vocab_size, source=ctx.task))


def _per_example_scores(eval_dir: str, task: str) -> dict:
  """The test predictions' per-example scores (`bootstrap.encode`), for paired bootstrap."""
  with open(os.path.join(eval_dir, f'predictions-{task}.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return bootstrap.encode(TASK_METRIC[task], [r['target'] for r in rows],
                          [r['prediction'] for r in rows])
