"""Partitioned inference through the trainer, `gqa-spec eval` and `gqa-spec generate`.

On 8 virtual CPU devices (a subprocess: XLA's device count is fixed when jax initialises,
`mesh_eval_check.py`): a training run on a 4x2 mesh evaluates in the loop on that mesh, with the
metrics and predictions of its saved checkpoint evaluated on one device; `eval --model-parallel`
and `generate --model-parallel` give the single-device results; `--stats` reports the memory per
device.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.mesh_flags import eight_device_xla_flags

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope='module')
def report(tiny_data_dir, tmp_path_factory):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=_ROOT,
             XLA_FLAGS=eight_device_xla_flags())
  work = str(tmp_path_factory.mktemp('mesh_eval'))
  result = subprocess.run([sys.executable, '-m', 'tests.training.mesh_eval_check', tiny_data_dir,
                           work], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.split('REPORT ', 1)[1])


def _quality(metrics):
  return {k: v for k, v in metrics.items() if not k.startswith('timing/')}


@pytest.mark.slow
def test_in_loop_evaluation_decodes_on_the_training_mesh(report):
  # The trainer hands over parameters sharded on its 4x2 mesh (GQA-2: K/V heads over model) ...
  assert report['params_mesh'] == {'data': 4, 'model': 2}
  assert report['params_kv_spec'] == [None, 'model']
  # ... and the evaluator decodes on that mesh, not on a gathered copy.
  assert report['decode_mesh'] == {'data': 4, 'model': 2}


@pytest.mark.slow
def test_in_loop_metrics_equal_the_checkpoint_evaluated_on_one_device(report):
  in_loop = {k: v for k, v in report['in_loop'].items() if k not in ('step', 'split')}
  assert _quality(in_loop) == _quality(report['single'])
  assert 'bleu' in report['single']
  assert report['in_loop_predictions'] == report['predictions'] and len(report['predictions']) == 6
  assert len(set(report['predictions'])) > 1  # a model that says something (not only EOS)


@pytest.mark.slow
def test_eval_command_model_parallel_gives_single_device_metrics(report):
  assert report['eval_mesh']['mesh'] == {'data': 4, 'model': 2}
  assert _quality(report['eval_mesh']['metrics']) == _quality(report['single'])
  assert report['eval_mesh_predictions'] == report['predictions']


@pytest.mark.slow
def test_generate_model_parallel_gives_single_device_outputs(report):
  single = report['generate_single']
  assert len(single['outputs']) == 5 and len(set(single['outputs'])) > 1
  for name, mesh in (('mesh', {'data': 4, 'model': 2}), ('mesh_draft', {'data': 2, 'model': 4})):
    run = report[f'generate_{name}']
    assert run['outputs'] == single['outputs'], name
    assert run['stats']['mesh'] == mesh
    memory = run['stats']['memory_per_device']
    assert (memory['data'], memory['model']) == (mesh['data'], mesh['model'])
    assert memory['batch'] == 4 and memory['param_bytes'] < memory['param_bytes_total']
  assert single['stats']['memory_per_device']['param_bytes'] == (
      single['stats']['memory_per_device']['param_bytes_total'])
  # The checkpoint as its own draft (greedy): every proposal accepted.
  assert report['generate_mesh_draft']['stats']['acceptance_rate'] == 1.0


def test_model_parallel_flag_must_be_positive(capsys):
  from gqa_spec import cli  # pylint: disable=g-import-not-at-top
  assert cli.main(['eval', '--gin_file=runs/eval.gin', '--model-parallel', '0']) == 2
  err = capsys.readouterr().err.strip()
  assert '--model-parallel must be >= 1' in err and '\n' not in err
