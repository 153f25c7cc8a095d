"""One writer per run directory (issue 34): a second writer refuses in one line, a dead holder's lock
is taken over with a note, a lock from another host is judged by its heartbeat, `status` reads it."""

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from gqa_spec import cli, rundir, rundir_lock, status

HOLD = ('import sys, time; from gqa_spec import rundir_lock\n'
        'with rundir_lock.running(sys.argv[1], total_steps=7):\n'
        '  print("held", flush=True); time.sleep(60)\n')


@pytest.fixture
def holder(tmp_path):
  """A live process on this host holding the lock of tmp_path/run."""
  run = str(tmp_path / 'run')
  proc = subprocess.Popen([sys.executable, '-c', HOLD, run], stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()))
  assert proc.stdout.readline() == 'held\n'
  yield run, proc
  proc.kill()
  proc.wait()


def _lock(run):
  with open(os.path.join(run, rundir.RUNNING_FILE)) as f:
    return json.load(f)


def test_a_second_writer_refuses_at_once_naming_the_holder(holder, capsys):
  run, proc = holder
  with pytest.raises(rundir_lock.LockHeldError, match=(
      rf'{run}: another process is writing this run directory \(pid {proc.pid} on host '
      rf'{os.uname().nodename}, since .*, heartbeat \d+ s ago\); wait for it to end, stop it '
      rf'\(kill {proc.pid}\), or write to another directory')):
    with rundir_lock.running(run):
      pass
  assert _lock(run)['pid'] == proc.pid  # the holder's lock untouched
  assert status.status(run)[1].startswith(f'  process: running (pid {proc.pid}, since ')
  # Through the CLI (train takes the lock before it reads or writes the run directory): one line.
  t0 = time.time()
  code = cli.main(['train', '--gin_file=runs/pretrain.gin',
                   '--gin_file=models/t5_1_1/nano.gin', f"--gin.MODEL_DIR='{run}'",
                   "--gin.MIXTURE_OR_TASK_NAME='synthetic'", '--gin.TRAIN_STEPS=1',
                   "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 8}"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith(f'gqa-spec: error: {run}: another process is writing this run directory '
                           f'(pid {proc.pid} ')
  assert not os.path.exists(os.path.join(run, 'checkpoints'))
  assert time.time() - t0 < 60


def test_the_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path, caplog):
  run = str(tmp_path)
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  with open(os.path.join(run, rundir.RUNNING_FILE), 'w') as f:
    json.dump({'pid': proc.pid, 'host': os.uname().nodename, 'started': 1.0e9}, f)
  with caplog.at_level(logging.WARNING, 'gqa_spec.rundir_lock'):
    with rundir_lock.running(run, total_steps=3):
      mine = _lock(run)
      assert (mine['pid'], mine['total_steps']) == (os.getpid(), 3)
      with rundir_lock.running(run):  # the same process again (a trainer inside uptrain)
        pass
      assert _lock(run) == mine  # still held
  assert [r.getMessage() for r in caplog.records] == [
      f'{run}: took over the lock of a writer that is gone (pid {proc.pid} on host '
      f'{os.uname().nodename}, since {time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1.0e9))}, '
      f'heartbeat {time.time() - 1.0e9:.0f} s ago): its pid {proc.pid} is gone on this host']
  assert not os.path.exists(os.path.join(run, rundir.RUNNING_FILE))  # released at the end


def test_a_lock_from_another_host_is_judged_by_its_heartbeat(tmp_path, monkeypatch):
  run = str(tmp_path)
  path = os.path.join(run, rundir.RUNNING_FILE)
  other = {'pid': 1, 'host': 'elsewhere', 'started': time.time() - 3600, 'token': 'x'}
  with open(path, 'w') as f:
    json.dump(dict(other, heartbeat=time.time() - 20), f)
  with pytest.raises(rundir_lock.LockHeldError, match=r'heartbeat 20 s ago\); wait for it to end, '
                     r'stop it \(kill 1 on host elsewhere\)'):
    with rundir_lock.running(run):
      pass
  assert rundir_lock.process_state(run).endswith('heartbeat 20 s ago')
  with open(path, 'w') as f:  # no heartbeat for 10 minutes: the holder is gone
    json.dump(dict(other, heartbeat=time.time() - 600), f)
  assert rundir_lock.process_state(run).endswith('(stale: the next writer takes it over)')
  monkeypatch.setattr(rundir_lock, 'HEARTBEAT_SECONDS', 0.05)
  with rundir_lock.running(run):
    first = _lock(run)['heartbeat']
    time.sleep(0.5)
    assert _lock(run)['heartbeat'] > first  # the holder refreshes it
    assert _lock(run)['host'] == os.uname().nodename


def test_a_run_directory_that_is_a_file_is_one_line(tmp_path):
  path = tmp_path / 'file'
  path.write_text('x')
  with pytest.raises(rundir_lock.UserError, match=f'^{path} is a file, not a run directory; '):
    with rundir_lock.running(str(path)):
      pass
  with pytest.raises(rundir_lock.UserError, match=f'^{path}/run: cannot create the run directory'):
    with rundir_lock.running(str(path / 'run')):
      pass
  assert path.read_text() == 'x'


def test_a_second_reproduction_on_the_same_work_dir_refuses(holder, tmp_path):
  from gqa_spec.reproduce import pipeline  # pylint: disable=g-import-not-at-top
  work, proc = holder  # another process holds the work directory
  out = tmp_path / 'results'
  with pytest.raises(rundir_lock.LockHeldError, match=f'^{work}: another process is writing this '
                                                      rf'run directory \(pid {proc.pid} '):
    pipeline.run('smoke', str(out), work, exported_dir=str(tmp_path))
  assert not (out / 'preset.json').exists()  # nothing written
  assert not (out / rundir.RUNNING_FILE).exists()  # its own lock on the results released


def test_uptrain_and_train_draft_take_the_lock_before_writing(holder, tmp_path):
  from gqa_spec.models.config import T5Config  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import draft_training, uptrain  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.data import DatasetConfig  # pylint: disable=g-import-not-at-top
  run, proc = holder
  held = rf'^{run}: another process is writing this run directory \(pid {proc.pid} '
  missing = str(tmp_path / 'no_checkpoint')  # never read: the lock comes first
  with pytest.raises(rundir_lock.LockHeldError, match=held):
    uptrain.uptrain(model_dir=run, model_config=T5Config(num_kv_heads=1),
                    initial_checkpoint_path=missing)
  with pytest.raises(rundir_lock.LockHeldError, match=held):
    draft_training.train_draft(kind='chimera', target_checkpoint=missing, model_dir=run,
                               train_dataset_cfg=DatasetConfig('synthetic', {'inputs': 8,
                                                                             'targets': 8},
                                                               batch_size=2, pack=False),
                               total_steps=1)
  assert sorted(os.listdir(run)) == [rundir.RUNNING_FILE]  # no converted/, no draft.json


@pytest.fixture
def stranger():
  """A live process on this host that has nothing to do with any run directory (a pid reused)."""
  proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
  yield proc
  proc.kill()
  proc.wait()


def test_a_lock_whose_pid_now_names_another_process_is_taken_over(tmp_path, stranger, caplog):
  from gqa_spec import pids  # pylint: disable=g-import-not-at-top
  run, host = str(tmp_path), os.uname().nodename
  path = os.path.join(run, rundir.RUNNING_FILE)
  me = pids.identity()
  assert set(me) == {'boot_id', 'start_ticks'}  # Linux: both read from /proc
  started = time.time() - 3600
  locks = {  # the stranger's pid, recorded by a holder that was another process
      'another start time': (dict(me, start_ticks=me['start_ticks'] - 100),
                             f'its pid {stranger.pid} now belongs to another process (started '),
      'another boot': (dict(me, boot_id='0' * 32),
                       f'it ran before this host rebooted (pid {stranger.pid} is now another '
                       'process)'),
      'no identity (an older lock)': ({}, f'its pid {stranger.pid} now belongs to another process, '
                                          'started after the lock was taken'),
  }
  for name, (identity, reason) in locks.items():
    with open(path, 'w') as f:
      json.dump(dict(identity, pid=stranger.pid, host=host, started=started), f)
    state = status.status(run)[1]  # `status` says "running" no more
    assert state.startswith(f'  process: not running (pid {stranger.pid}, started ') and (
        f'ended without cleaning up: killed?; {reason}' in state), (name, state)
    caplog.clear()
    with caplog.at_level(logging.WARNING, 'gqa_spec.rundir_lock'):
      with rundir_lock.running(run, total_steps=3):
        mine = _lock(run)
        assert mine['pid'] == os.getpid() and {k: mine[k] for k in me} == me
    messages = [r.getMessage() for r in caplog.records if r.name == 'gqa_spec.rundir_lock']
    assert len(messages) == 1 and messages[0].startswith(
        f'{run}: took over the lock of a writer that is gone (pid {stranger.pid} on host '
        f'{host}, ') and reason in messages[0], (name, messages)
  assert stranger.poll() is None  # nobody told to kill it
  # The live holder it recorded itself is still respected (`holder`: the first test).


@pytest.mark.parametrize('content,reason', [
    ('{"pid": "123", "host": "h", "started": 1}',
     'its field \'pid\' is a string ("123"), not an integer'),
    ('{"host": "h", "started": 1}', "its field 'pid' is missing"),
    ('{"pid": 123, "host": "h", "started": "yesterday"}',
     'its field \'started\' is a string ("yesterday"), not a number'),
    ('[123]', 'a list, not a JSON object'),
    ('pid=123', 'not JSON (Expecting value: line 1 column 1 (char 0))'),
    ('', 'empty'),
])
def test_a_lock_of_the_wrong_shape_is_unreadable_in_one_line(tmp_path, capsys, caplog, content,
                                                             reason):
  run = str(tmp_path)
  path = os.path.join(run, rundir.RUNNING_FILE)
  with open(path, 'w') as f:
    f.write(content)
  assert cli.main(['status', run]) == 0
  out, err = capsys.readouterr()
  assert f'  process: unknown ({rundir.RUNNING_FILE} cannot be read as a lock: {reason})' in (
      out.splitlines()) and err == ''
  # A young one may still be being written (a filesystem without hard links): refused.
  with pytest.raises(rundir_lock.LockHeldError, match='its lock is being written'):
    with rundir_lock.running(run):
      pass
  old = time.time() - 60
  os.utime(path, (old, old))
  with caplog.at_level(logging.WARNING, 'gqa_spec.rundir_lock'):
    with rundir_lock.running(run):
      assert _lock(run)['pid'] == os.getpid()
  assert [r.getMessage() for r in caplog.records if r.name == 'gqa_spec.rundir_lock'] == [
      f'{run}: took over the lock of a writer that is gone (unreadable lock): it cannot be read '
      f'as a lock: {reason}']
  assert not os.path.exists(path)
