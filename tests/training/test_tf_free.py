"""Training, evaluation and inference from an exported task without TensorFlow, seqio or gin.

One subprocess (`tf_free_check.py`) in which those packages cannot be imported trains a tiny model
on the exported translate + summarize mixture, evaluates its checkpoint (BLEU, ROUGE) and writes
t5x-style inference files; here, with seqio, the same checkpoint is evaluated and inferred through
the registered tasks: the metrics and every prediction must agree.
"""

import json
import os
import subprocess
import sys

import pytest

from gqa_spec.data import export, tasks
from gqa_spec.evaluation import evaluator, infer

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIXTURE = 'ddtp_translate_summarize'
LENGTHS = {'inputs': 32, 'targets': 16}  # as tf_free_check.LENGTHS


@pytest.fixture(scope='module')
def run(tiny_data_dir, tmp_path_factory):
  tasks.register_ddtp_tasks(tiny_data_dir)
  out = str(tmp_path_factory.mktemp('export'))
  export.export([MIXTURE], out, lengths=LENGTHS)
  work = str(tmp_path_factory.mktemp('tf_free'))
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=_ROOT)
  result = subprocess.run([sys.executable, '-m', 'tests.training.tf_free_check',
                           f'exported:{out}/{MIXTURE}', work], cwd=_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  yield json.loads(result.stdout.split('REPORT ', 1)[1]), work
  tasks.register_ddtp_tasks()  # back to the default data dir for other modules


def _quality(metrics):
  return {k: v for k, v in metrics.items() if not k.startswith('timing/')}


@pytest.mark.slow
def test_runs_with_tensorflow_seqio_and_gin_unimportable(run):
  report, _ = run
  assert report['blocked_loaded'] == []  # the CLI's parser and the reproduction imported too
  assert 'gin-config is not installed' in report['gin_error']  # one line, naming the package
  assert report['step'] == 100
  model_dir = report['model_dir']
  assert os.path.isfile(os.path.join(model_dir, 'train_log.jsonl'))
  assert not os.path.exists(os.path.join(model_dir, 'train'))  # no TensorBoard without TF


@pytest.mark.slow
def test_metrics_and_predictions_equal_the_seqio_path(run):
  report, work = run
  seqio_metrics = evaluator.evaluate_checkpoint(
      report['model_dir'], MIXTURE, os.path.join(work, 'seqio_eval'), split='validation',
      task_feature_lengths=LENGTHS, batch_size=4, num_examples=6)
  assert _quality(report['metrics']) == pytest.approx(_quality(seqio_metrics), abs=1e-9)
  assert report['metrics']['ddtp_translate_en_de/bleu'] > 0  # the predictions are not trivial
  for task in ('ddtp_translate_en_de', 'ddtp_summarize'):
    name = f'predictions-{task}.jsonl'
    ours = open(os.path.join(work, 'eval', name)).read()
    assert ours == open(os.path.join(work, 'seqio_eval', name)).read()
    assert len({json.loads(l)['prediction'] for l in ours.splitlines()}) > 1  # input-dependent
  files = infer.infer(report['model_dir'], MIXTURE, os.path.join(work, 'seqio_infer'),
                      split='validation', task_feature_lengths=LENGTHS, batch_size=4,
                      num_examples=6)
  assert sorted(files) == sorted(report['files'])
  for task, path in files.items():
    assert open(path).read() == open(report['files'][task]).read()
