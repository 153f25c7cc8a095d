"""`gqa-spec status DIR` on a run directory and on a reproduction results directory."""

import json
import os
import subprocess
import sys

import pytest

from gqa_spec import rundir, rundir_lock, status
from gqa_spec.errors import UserError


def _write(path, obj):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(obj if isinstance(obj, str) else json.dumps(obj))


def _dead_pid():
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


def test_run_status_reports_checkpoints_metrics_best_and_process(tmp_path):
  run = str(tmp_path)
  for d in ('checkpoints/5', 'checkpoints/10', 'checkpoints/15.orbax-checkpoint-tmp-17'):
    os.makedirs(os.path.join(run, d))
  _write(os.path.join(run, rundir.TRAIN_LOG_FILE), ''.join(json.dumps(r) + '\n' for r in [
      {'step': 10, 'split': 'train', 'loss': 4.5, 'accuracy': 0.25},
      {'step': 10, 'split': 'eval', 'bleu': 3.0},
      {'step': 12, 'split': 'train', 'loss': 4.25, 'accuracy': 0.3}]) + '{"step": 1')  # torn
  _write(os.path.join(run, 'best.json'), {'step': 10, 'metric': 'bleu', 'value': 3.0})
  with rundir_lock.running(run, total_steps=20):
    lines = status.status(run)
    assert lines[1].startswith(f'  process: running (pid {os.getpid()}, since ')
  assert not os.path.exists(os.path.join(run, rundir.RUNNING_FILE))  # removed at the end
  assert lines[2:7] == [
      '  latest complete checkpoint: step 10 (checkpoints/10); kept: 5, 10',
      '  incomplete (uncommitted, ignored on resume): 15.orbax-checkpoint-tmp-17',
      '  last train metrics (step 12): loss=4.25, accuracy=0.3',
      '  last eval metrics (step 10): bleu=3',
      '  best: bleu = 3 at step 10 (best/)']
  assert status.status(run)[1] == '  process: not running'
  # A lock left behind by a killed process names a dead pid.
  pid = _dead_pid()
  _write(os.path.join(run, rundir.RUNNING_FILE), {'pid': pid, 'host': os.uname().nodename,
                                                  'started': 0.0})
  assert status.status(run)[1].startswith(f'  process: not running (pid {pid}, started ')


def test_reproduction_status_reports_stages_and_jobs(tmp_path):
  out, work = str(tmp_path / 'results'), str(tmp_path / 'work')
  _write(os.path.join(out, 'preset.json'), {'name': 'smoke', 'work_dir': '../work'})
  _write(os.path.join(out, 'corpus.json'), {'wall_seconds': 12.0})
  _write(os.path.join(out, 'pretrain.json'), {'wall_seconds': 80.4})
  _write(os.path.join(work, 'jobs', 'uptrain', 'g2_mean_a0.05.json'), {})
  lines = status.status(out)
  assert lines[1:] == [
      '  process: not running',
      '  stages done: corpus, pretrain',
      '  stages pending: uptrain, finetune, drafts, evaluate, timing, speculative, premise, report',
      '    corpus: 12 s', '    pretrain: 80 s',
      '  uptrain: 1 job(s) finished (g2_mean_a0.05)']


def test_status_of_other_directories_is_a_clear_error(tmp_path):
  with pytest.raises(UserError, match='neither a training run directory'):
    status.status(str(tmp_path))
  with pytest.raises(UserError, match='is not a directory'):
    status.status(str(tmp_path / 'missing'))
