"""Records read back (issue 61): a file of the wrong shape (not JSON, a missing field, a field of
another type) is one line naming the file and what is wrong, in the command that reads it and in
`gqa-spec status`, never a KeyError or TypeError from deep inside the reader."""

import json
import os

import pytest

from gqa_spec import cli, rundir, status
from gqa_spec.checkpoints import drafts
from gqa_spec.models.config import preset


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


@pytest.mark.parametrize('text,reason', [
    ('{"step": 3, "metric": "bleu"}', "its field 'value' is missing"),
    ('{"step": "3", "metric": "bleu", "value": 1.0}',
     'its field \'step\' is a string ("3"), not an integer'),
    ('{"step": 3, "metric": "bleu", "value": true}',
     "its field 'value' is a boolean (true), not a number"),
    ('{"step": 3,', 'not JSON (Expecting property name enclosed in double quotes: line 1 column '
                    '12 (char 11))'),
    ('\xe9t\xe9', 'not UTF-8 text (byte 0)'),
])
def test_best_json_of_the_wrong_shape(tmp_path, capsys, text, reason):
  run = str(tmp_path)
  os.makedirs(os.path.join(run, rundir.CHECKPOINTS_DIR))
  path = os.path.join(run, rundir.BEST_FILE)
  with open(path, 'wb') as f:
    f.write(text.encode('latin-1'))
  assert cli.main(['status', run]) == 0
  out, err = capsys.readouterr()
  assert f'  best: cannot be read: {path} (best record): {reason}' in out.splitlines(), out
  assert err == ''
  # A resume reads it before training: one line, and how to go on.
  from gqa_spec.training import trainer  # pylint: disable=g-import-not-at-top
  with pytest.raises(rundir.RecordError) as raised:
    trainer._read_best(run)  # pylint: disable=protected-access
  assert str(raised.value) == (f'{path} (best record): {reason}; remove it to resume (the '
                               'next evaluation writes it anew, and best/ with it)')
  assert '\n' not in str(raised.value)


def test_train_log_lines_that_are_not_records_are_skipped(tmp_path):
  from gqa_spec.training import summaries  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / rundir.TRAIN_LOG_FILE)
  _write(path, '{"step": 2, "split": "train", "loss": 1.5}\n[1, 2]\n7\n{"step": "x"}\n'
               '{"step": 4, "split": "train", "loss": 1.25}\n{"ste')
  assert [r['step'] for r in summaries.read_records(path)] == [2, 4]
  assert summaries.drop_records_after(path, 3) == 5
  assert [json.loads(line) for line in open(path)] == [{'step': 2, 'split': 'train', 'loss': 1.5}]
  (tmp_path / rundir.CHECKPOINTS_DIR).mkdir()
  assert status.status(str(tmp_path))[3] == '  last train metrics (step 2): loss=1.5'


def test_draft_json_of_the_wrong_shape(tmp_path):
  run = str(tmp_path / 'draft_run')
  path = os.path.join(run, rundir.DRAFT_FILE)
  _write(path, json.dumps({'kind': 'chimera', 'target': 5, 'draft_config': {}}))
  message = (f'{path} (draft run record): its field \'target\' is an integer (5), not a '
             'string')
  with pytest.raises(rundir.RecordError) as raised:
    drafts.write_draft_file(run, 'model', str(tmp_path / 'target'), preset('nano'))
  assert str(raised.value) == message
  with pytest.raises(rundir.RecordError) as raised:
    drafts.load_chimera(run)
  assert str(raised.value) == message
  _write(path, '["chimera"]')
  with pytest.raises(rundir.RecordError, match=f'^{path} \\(draft run record\\): a list, not a '
                                               'JSON object$'):
    drafts.load_chimera.__wrapped__(run)


def test_uptrain_json_of_the_wrong_shape(tmp_path):
  from gqa_spec.training import uptrain  # pylint: disable=g-import-not-at-top
  path = os.path.join(str(tmp_path), rundir.CONVERTED_DIR, rundir.UPTRAIN_FILE)
  _write(path, json.dumps({'num_kv_heads': 2, 'original_train_steps': None}))
  with pytest.raises(rundir.RecordError, match=(
      f"^{path} \\(uptraining record\\): its field 'original_train_steps' is null \\(null\\), "
      'not an integer$')):
    uptrain.convert_checkpoint(str(tmp_path), str(tmp_path / 'never_read'),
                               preset('nano').replace(num_kv_heads=2))


def test_reproduction_records_of_the_wrong_shape(tmp_path, capsys):
  out = str(tmp_path / 'results')
  _write(os.path.join(out, 'preset.json'), json.dumps({'name': 'smoke', 'work_dir': 7}))
  assert cli.main(['status', out]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f'gqa-spec: error: {out}/preset.json (reproduction record): its field \'work_dir\' is '
      'an integer (7), not a string']
  _write(os.path.join(out, 'preset.json'), json.dumps({'name': 'smoke', 'work_dir': '../work'}))
  _write(os.path.join(out, 'corpus.json'), '{"wall_seconds": "12"}')
  lines = status.status(out)
  assert lines[4] == (f'    corpus: cannot be read: {out}/corpus.json (stage record): its field '
                      '\'wall_seconds\' is a string ("12"), not a number or null')
  from gqa_spec.reproduce import jobs  # pylint: disable=g-import-not-at-top
  ctx = jobs.Context.__new__(jobs.Context)
  ctx.out_dir = out
  _write(os.path.join(out, 'pretrain.json'), '')
  with pytest.raises(rundir.RecordError, match=f'^{out}/pretrain.json \\(stage record\\): empty$'):
    ctx.read_stage('pretrain')


def test_check_record_names_every_json_type():
  for value, kind in [({}, 'an object'), ([], 'a list'), ('x', 'a string'), (1, 'an integer'),
                      (1.5, 'a number'), (True, 'a boolean'), (None, 'null')]:
    if kind == 'an object':
      assert rundir.check_record(value, {}, 'f', 'record') == {}
      continue
    with pytest.raises(rundir.RecordError, match=f'^f \\(record\\): {kind}, not a JSON object$'):
      rundir.check_record(value, {}, 'f', 'record')
  record = {'n': 3, 'x': 2}
  assert rundir.check_record(record, {'n': int, 'x': float}, 'f', 'record') is record
