"""`draft.json`: the target is recorded relative to the run directory, so a copied work dir resumes."""

import json
import os
import shutil

import pytest

from gqa_spec import rundir
from gqa_spec.checkpoints import drafts
from gqa_spec.errors import UserError
from gqa_spec.models.config import preset

DRAFT = preset('nano')


def _work(root):
  os.makedirs(os.path.join(root, 'models', 'target'))
  run = os.path.join(root, 'models', 'draft_run')
  drafts.write_draft_file(run, 'model', os.path.join(root, 'models', 'target'), DRAFT)
  return run


def test_a_copied_work_dir_resumes_against_its_own_target(tmp_path):
  run = _work(str(tmp_path / 'a'))
  with open(os.path.join(run, rundir.DRAFT_FILE)) as f:
    assert json.load(f)['target'] == os.path.join('..', 'target')
  shutil.copytree(tmp_path / 'a', tmp_path / 'b')
  shutil.rmtree(tmp_path / 'a')  # the original is gone: only relative records still resolve
  moved = str(tmp_path / 'b' / 'models' / 'draft_run')
  drafts.write_draft_file(moved, 'model', str(tmp_path / 'b' / 'models' / 'target'), DRAFT)
  with pytest.raises(UserError, match='trains a different draft'):
    drafts.write_draft_file(moved, 'model', str(tmp_path / 'elsewhere'), DRAFT)
  with pytest.raises(UserError, match='trains a different draft'):
    drafts.write_draft_file(moved, 'chimera', str(tmp_path / 'b' / 'models' / 'target'), DRAFT)


def test_an_older_absolute_record_still_matches_its_target(tmp_path):
  run = _work(str(tmp_path))
  record_path = os.path.join(run, rundir.DRAFT_FILE)
  with open(record_path) as f:
    record = json.load(f)
  target = os.path.join(str(tmp_path), 'models', 'target')
  with open(record_path, 'w') as f:
    json.dump(dict(record, target=target), f)
  drafts.write_draft_file(run, 'model', target, DRAFT)  # same target, absolute as recorded before
  assert rundir.resolve(target, run) == target
  assert rundir.resolve(os.path.join('..', 'target'), run) == target
