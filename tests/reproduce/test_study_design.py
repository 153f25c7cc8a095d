"""The study design knobs: `pretrain_task` (span corruption or T5's multi-task mixture) and
`finetune_multitask` (one fine-tuning job per model on translate + summarize)."""

import dataclasses
import json
import os

import pytest

from gqa_spec.errors import UserError
from gqa_spec.reproduce import finetune, pipeline, presets, report
from gqa_spec.reproduce import overrides
from gqa_spec.reproduce.presets import MULTITASK, SUMMARIZE, TRANSLATE

MEAN = 'mean_bleu_rouge1'
# A smoke run with both deviations, a few steps each: 4 models to fine-tune (MHA, a GQA variant
# uptrained for 1 step on the mixture, its first / random conversions without uptraining) + draft.
OVERRIDES = ['pretrain_task=ddtp_mixture', 'finetune_multitask=true', 'pretrain_steps=4',
             'warmup_steps=2', 'pretrain_batch=8', 'alphas=0.25', 'method_ablation_alpha=0',
             'finetune_steps=6', 'finetune_batch=8', 'eval_period=2', 'validation_examples=8',
             'test_examples=8', 'eval_batch=8', 'kv_heads=2', 'method_ablation_kv_heads=2']
# Models this small score 0 at every evaluation (measured), so the run's validation scores are
# shifted by these offsets per step: the mean of the two is highest at step 4, BLEU alone at step
# 2 and ROUGE-1 alone at step 6, so only selection by the mean keeps step 4.
OFFSETS = {TRANSLATE: {2: 60.0, 4: 45.0, 6: 0.0}, SUMMARIZE: {2: 0.0, 4: 45.0, 6: 70.0}}
BEST_STEP = 4
STAGES = ['corpus', 'pretrain', 'uptrain', 'finetune', 'evaluate']


def test_bad_design_values_are_clear_errors():
  smoke = presets.get('smoke')
  with pytest.raises(UserError, match="pretrain_task 'c4' is not one of ddtp_span_corruption, "
                                      'ddtp_mixture'):
    dataclasses.replace(smoke, pretrain_task='c4')
  with pytest.raises(UserError, match='finetune_multitask must be true or false'):
    dataclasses.replace(smoke, finetune_multitask='yes')
  with pytest.raises(UserError, match="finetune_lengths has \\['ddtp_translate_en_de'\\]"):
    dataclasses.replace(smoke, finetune_multitask=True,
                        finetune_lengths={TRANSLATE: (64, 32)})


def test_multitask_lengths_are_the_longest_over_the_tasks():
  cpu = presets.get('cpu')  # translate (64, 64), summarize (128, 32)
  assert cpu.finetune_lengths == {TRANSLATE: (64, 64), SUMMARIZE: (128, 32)}
  assert cpu.multitask_lengths() == (128, 64)
  assert cpu.design()['finetune_lengths'] == {MULTITASK: [128, 64]}
  per_task = overrides.apply(cpu, ['finetune_multitask=false']).design()
  assert per_task['finetune'] == 'per task'
  assert per_task['finetune_lengths'] == {TRANSLATE: [64, 64], SUMMARIZE: [128, 32]}


def test_task_mean_evaluator_averages_the_tasks_selection_metrics():
  calls = []

  def fake(task, metrics):
    def evaluate(params, step):
      calls.append((task, params, step))
      return {**{f'{task}/{k}': v for k, v in metrics.items()}, **metrics,
              'timing/seconds_per_sample_median': 0.5}
    return evaluate

  evaluator = finetune.TaskMeanEvaluator(
      {TRANSLATE: fake(TRANSLATE, {'bleu': 12.0}),
       SUMMARIZE: fake(SUMMARIZE, {'rouge1': 30.0, 'rouge2': 9.0})},
      {TRANSLATE: 'bleu', SUMMARIZE: 'rouge1'}, MEAN)
  out = evaluator('params', 7)
  assert calls == [(TRANSLATE, 'params', 7), (SUMMARIZE, 'params', 7)]
  assert out == {f'{TRANSLATE}/bleu': 12.0, f'{SUMMARIZE}/rouge1': 30.0,
                 f'{SUMMARIZE}/rouge2': 9.0, MEAN: 21.0,
                 f'{TRANSLATE}/timing/seconds_per_sample_median': 0.5,
                 f'{SUMMARIZE}/timing/seconds_per_sample_median': 0.5}
  assert finetune.multitask_metric(presets.TASK_METRIC) == MEAN


def test_design_note_states_the_design_and_any_deviation():
  smoke = presets.get('smoke')
  paper = report.design_note(smoke, MEAN)
  assert 'ddtp_span_corruption' in paper and 'per task' in paper
  assert 'deviates' not in paper
  both = report.design_note(
      overrides.apply(smoke, ['pretrain_task=ddtp_mixture', 'finetune_multitask=true']), MEAN)
  assert '`ddtp_mixture`' in both and f'`{MULTITASK}`' in both and f'`{MEAN}`' in both
  assert 'deviates from the GQA paper' in both and 'budget' in both
  assert 'multi-task pre-training teaches the tasks' in both
  only_finetune = report.design_note(overrides.apply(smoke, ['finetune_multitask=true']), MEAN)
  assert 'once on both tasks' in only_finetune and 'mixture instead' not in only_finetune
  assert 'multi-task pre-training teaches' not in only_finetune


@pytest.fixture(scope='module')
def multitask_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('multitask_run')
  out_dir, work_dir = str(root / 'results'), str(root / 'work')
  real = finetune._evaluator  # pylint: disable=protected-access

  def shifted(ctx, task, config):
    evaluator, key = real(ctx, task, config), f'{task}/{presets.TASK_METRIC[task]}'

    def evaluate(params, step):
      metrics = dict(evaluator(params, step))
      metrics[key] += OFFSETS[task][step]
      return metrics
    return evaluate

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(finetune, '_evaluator', shifted)
    pipeline.run('smoke', out_dir, work_dir, stages=STAGES, progress_bar=False,
                 overrides=OVERRIDES)
  return out_dir, work_dir


def _stage(out_dir, stage):
  with open(os.path.join(out_dir, f'{stage}.json')) as f:
    return json.load(f)


def _trained_on(model_dir: str) -> str:
  """The dataset the trainer itself recorded in the run's latest checkpoint."""
  from gqa_spec.checkpoints import manager  # pylint: disable=g-import-not-at-top
  ckpt = manager.Checkpointer(model_dir, 1000, None, False)
  try:
    return ckpt.restore_meta(ckpt.latest_step())['dataset']['mixture_or_task_name']
  finally:
    ckpt.close()


def test_pretraining_and_uptraining_run_on_the_mixture(multitask_run):
  out_dir, work_dir = multitask_run
  with open(os.path.join(out_dir, 'preset.json')) as f:
    recorded = json.load(f)
  assert recorded['pretrain_task'] == 'ddtp_mixture' and recorded['finetune_multitask'] is True
  pre = _stage(out_dir, 'pretrain')
  assert pre['design']['pretrain_task'] == 'ddtp_mixture'
  for role in ('target', 'draft'):
    assert pre[role]['train_task'] == 'ddtp_mixture'
    assert _trained_on(os.path.join(work_dir, pre[role]['model_dir'])) == 'ddtp_mixture'
  trained = [r for r in _stage(out_dir, 'uptrain')['rows'] if r['uptrain_steps']]
  assert [r['variant']['alpha'] for r in trained] == [0.25]  # the one uptrained variant
  assert trained[0]['uptrain_steps'] == 1 and trained[0]['train_task'] == 'ddtp_mixture'
  assert _trained_on(os.path.join(work_dir, trained[0]['checkpoint'])) == 'ddtp_mixture'


def test_multitask_finetuning_is_one_job_per_model_with_rows_per_task(multitask_run):
  out_dir, work_dir = multitask_run
  preset = overrides.apply(presets.get('smoke'), OVERRIDES)
  models = [v.name for v in preset.variants()] + ['draft']
  assert len(models) == 5
  assert sorted(os.listdir(os.path.join(work_dir, 'jobs', 'finetune'))) == sorted(
      f'multitask.{m}.json' for m in models)
  assert os.listdir(os.path.join(work_dir, 'models', 'finetune')) == [MULTITASK]
  assert sorted(os.listdir(os.path.join(work_dir, 'models', 'finetune', MULTITASK))) == sorted(
      models)
  stage = _stage(out_dir, 'finetune')
  assert stage['jobs'] == 5 and stage['design']['finetune'] == f'multi-task ({MULTITASK})'
  rows = stage['rows']
  assert sorted((r['name'], r['task']) for r in rows) == sorted(
      (m, t) for m in models for t in (TRANSLATE, SUMMARIZE))
  for m in models:
    translate, summarize = (next(r for r in rows if r['name'] == m and r['task'] == t)
                            for t in (TRANSLATE, SUMMARIZE))
    assert translate['best_checkpoint'] == summarize['best_checkpoint'] == os.path.join(
        'models', 'finetune', MULTITASK, m, 'best')
    for r in (translate, summarize):
      assert r['multitask'] is True and r['train_task'] == MULTITASK
      assert r['train_lengths'] == list(preset.multitask_lengths())
      assert r['best_metric'] == MEAN
    best = translate['best']
    assert best['metric'] == MEAN
    scores = (best['metrics'][f'{TRANSLATE}/bleu'], best['metrics'][f'{SUMMARIZE}/rouge1'])
    assert best['value'] == pytest.approx(sum(scores) / 2)
    assert (translate['best_task_score'], summarize['best_task_score']) == scores
    # both tasks were scored at every evaluation, and the kept step has the highest mean
    with open(os.path.join(work_dir, translate['model_dir'], 'train_log.jsonl')) as f:
      evals = [json.loads(l) for l in f if json.loads(l)['split'] == 'eval']
    assert [e['step'] for e in evals] == [2, 4, 6]
    for e in evals:
      assert e[MEAN] == pytest.approx((e[f'{TRANSLATE}/bleu'] + e[f'{SUMMARIZE}/rouge1']) / 2)
    assert best['step'] == BEST_STEP, [(e['step'], e[MEAN]) for e in evals]
    logged = next(e for e in evals if e['step'] == BEST_STEP)
    assert best['metrics'] == pytest.approx(
        {k: v for k, v in logged.items() if k not in ('step', 'split')})
    assert os.path.isdir(os.path.join(work_dir, translate['best_checkpoint']))


def test_evaluate_scores_each_task_from_the_shared_checkpoint(multitask_run):
  out_dir, _ = multitask_run
  preset = overrides.apply(presets.get('smoke'), OVERRIDES)
  best_step = {r['name']: r['best']['step'] for r in _stage(out_dir, 'finetune')['rows']}
  rows = _stage(out_dir, 'evaluate')['rows']
  assert sorted((r['variant'], r['task']) for r in rows) == sorted(
      (m, t) for m in best_step for t in preset.finetune_lengths)
  for r in rows:
    assert r['metric'] == presets.TASK_METRIC[r['task']] and 0.0 <= r['score'] <= 100.0
    assert r['best_step'] == best_step[r['variant']] == BEST_STEP
    assert 0 < r['examples'] <= preset.test_examples
