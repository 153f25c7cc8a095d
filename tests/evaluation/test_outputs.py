"""The step eval records for a run's best/ export (best.json's), and none for other checkpoints."""

import json

from gqa_spec.evaluation import outputs


def test_checkpoint_step_of_a_best_export(tmp_path):
  (tmp_path / 'best').mkdir()
  assert outputs.checkpoint_step(str(tmp_path / 'best'), None) is None  # no best.json yet
  (tmp_path / 'best.json').write_text(json.dumps({'step': 500, 'metric': 'bleu'}))
  assert outputs.checkpoint_step(str(tmp_path / 'best') + '/', None) == 500
  assert outputs.checkpoint_step(str(tmp_path / 'best'), 7) == 7  # a loaded step wins
  (tmp_path / 'other').mkdir()
  assert outputs.checkpoint_step(str(tmp_path / 'other'), None) is None
  (tmp_path / 'best.json').write_text('{')
  assert outputs.checkpoint_step(str(tmp_path / 'best'), None) is None
