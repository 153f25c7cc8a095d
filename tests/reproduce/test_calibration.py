"""`gqa-spec calibrate --preset smoke` on the packaged excerpt: the record's structure, real
learning curves, the figures and the resume (finished points are not re-run)."""

import json
import os
import shutil

import pytest

from gqa_spec.errors import UserError
from gqa_spec.reproduce import calibration, presets


@pytest.fixture(scope='module')
def calibrated(tiny_data_dir, tmp_path_factory):
  root = tmp_path_factory.mktemp('calibration')
  out_dir, work_dir = str(root / 'results'), str(root / 'work')
  shutil.copytree(tiny_data_dir, os.path.join(work_dir, 'data'))
  record = calibration.calibrate('smoke', out_dir, work_dir, command='CMD')
  return out_dir, work_dir, record


def test_record_structure_and_files(calibrated):
  out_dir, _, record = calibrated
  with open(os.path.join(out_dir, 'calibration.json')) as f:
    written = json.load(f)
  assert written == json.loads(json.dumps(record))
  assert written['command'] == 'CMD' and written['status'] == 'complete'
  plan = calibration.plan(presets.get('smoke'))
  assert [s['name'] for s in written['sweeps']] == [s.name for s in plan.sweeps]
  for sweep, spec in zip(written['sweeps'], plan.sweeps):
    assert [p['label'] for p in sweep['points']] == [p.label for p in spec.points]
    for p in sweep['points']:
      steps = [row['step'] for row in p['curve']]
      assert steps == list(range(spec.eval_period, p['steps'] + 1, spec.eval_period))
      walls = [row['wall_seconds'] for row in p['curve']]
      assert walls == sorted(walls) and walls[0] > 0
      assert p['seconds_per_step'] > 0
  with open(os.path.join(out_dir, 'calibration.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  md = open(os.path.join(out_dir, 'calibration.md')).read()
  assert '`CMD`' in md and '(complete)' in md


def test_curves_are_real(calibrated):
  """Pre-training loss falls on the excerpt; fine-tuning starts from the best pre-trained point
  and records its task metric."""
  _, _, record = calibrated
  pretrain, finetune, mixture, multitask, nano = record['sweeps']
  for p in pretrain['points']:
    first, last = p['curve'][0]['val_loss'], p['curve'][-1]['val_loss']
    assert last < first - 0.1, (p['label'], first, last)
  best = min(pretrain['points'], key=lambda p: p['final_val_loss'])
  (ft,) = finetune['points']
  assert ft['initial_checkpoint'] == best['model_dir']
  assert all(0.0 <= row['bleu'] <= 100.0 for row in ft['curve'])
  assert ft['curve'][-1]['val_loss'] < ft['curve'][0]['val_loss']
  # multi-task pre-training evaluates both tasks' metrics along its curve; the multi-task
  # fine-tuning named it as its start, not the span-corruption point of lower val loss
  (mix,) = mixture['points']
  assert {'bleu/ddtp_translate_en_de', 'rouge1/ddtp_summarize',
          'val_loss/ddtp_span_corruption'} <= set(mix['curve'][-1])
  assert mix['curve'][-1]['val_loss'] < mix['curve'][0]['val_loss']
  (mt,) = multitask['points']
  assert mt['initial_checkpoint'] == mix['model_dir'] != best['model_dir']



def test_a_sweep_can_name_another_model_preset(calibrated):
  """`Sweep.model` trains that model preset (here `nano`) at the preset's vocabulary; the
  preset's own target is used otherwise."""
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.config import preset as model_preset  # pylint: disable=g-import-not-at-top
  _, work_dir, record = calibrated
  by_name = {s['name']: s for s in record['sweeps']}
  (p,) = by_name['pretrain.target.nano']['points']
  (q,) = by_name['pretrain.target']['points'][:1]
  assert (p['model'], q['model']) == ('nano', 'smoke target')
  smoke = presets.get('smoke').target
  config = native.load_config(os.path.join(work_dir, p['model_dir']))
  assert config == model_preset('nano', vocab_size=smoke.vocab_size) != smoke
  assert p['curve'][-1]['val_loss'] < p['curve'][0]['val_loss']


def test_finished_points_are_skipped(calibrated):
  out_dir, work_dir, record = calibrated
  again = calibration.calibrate('smoke', out_dir, work_dir, sweeps=['pretrain.target'],
                                command='CMD')
  assert again == record  # nothing re-trained: the same curves, wall seconds included
  os.remove(os.path.join(out_dir, 'calibration.png'))
  assert calibration.calibrate('smoke', out_dir, work_dir, command='CMD', train=False) == record
  assert os.path.exists(os.path.join(out_dir, 'calibration.png'))


def test_unknown_sweep_is_named():
  with pytest.raises(UserError, match='finetune.nope'):
    calibration.calibrate('smoke', sweeps=['finetune.nope'])


def test_the_persistent_compilation_cache_ends_with_the_call(calibrated):
  """calibrate / reproduce use an XLA cache under their work dir only while they run: the caller's
  process (the suite, a notebook) is left without one (a leaked cache once had later tests
  writing executables into a fixture's directory, and the suite crashed inside that write)."""
  import jax  # pylint: disable=g-import-not-at-top
  assert not jax.config.jax_compilation_cache_dir
