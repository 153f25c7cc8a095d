"""A process of a multi-process job killed (SIGKILL): every other process ends within seconds with
one line naming it (`distributed._watch`), not after JAX's heartbeat timeout with pages of C++ log;
an ordinary end, one process finishing before the other, is no loss; SIGTERM to every process of
a training job (pre-emption) saves one checkpoint at one step and exits 0."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from gqa_spec.checkpoints import manager
from gqa_spec.checkpoints.load import load_any
from tests.multihost import worker
from tests.multihost.test_multihost import env, free_port

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'collectives.py')


def _start(port, i, steps, pause):
  return subprocess.Popen([sys.executable, SCRIPT, str(port), '2', str(i), str(steps), str(pause)],
                          env=env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)


def _wait_ready(proc):
  """Reads the process's stdout up to its `ready` line (gloo prints its connections there too)."""
  for line in proc.stdout:
    if line.strip() == 'ready':
      return
  raise AssertionError(f'exited {proc.wait()} before ready: {proc.stderr.read()[-2000:]}')


@pytest.mark.parametrize('victim', [1, 0])
def test_killed_process_is_named_by_the_others(victim):
  port = free_port()
  procs = [_start(port, i, 600, 0.1) for i in (0, 1)]
  try:
    for p in procs:
      _wait_ready(p)
    killed_at = time.monotonic()
    procs[victim].kill()
    survivor = procs[1 - victim]
    code = survivor.wait(timeout=60)
    seconds = time.monotonic() - killed_at
    stderr = survivor.stderr.read()
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
      p.wait()
  assert code == 1 and seconds < 15, (code, seconds, stderr[-2000:])
  how = ('its connection to process 0 closed: killed, or its host down' if victim == 1 else
         'its connection closed: killed, or its host down')
  assert stderr.strip().splitlines()[-1] == (
      f'gqa-spec: error: jax.distributed: process {victim} of 2 was lost ({how}); stopping '
      f'process {1 - victim}')


def test_one_process_ending_first_is_no_loss():
  port = free_port()
  procs = [_start(port, 0, 3, 0.5), _start(port, 1, 3, 0.1)]
  try:
    outs = [p.communicate(timeout=120) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
  assert not any('was lost' in err for _, err in outs)


@pytest.mark.slow  # ~25 s each: two training processes
@pytest.mark.parametrize('when', ['soon', 'during_the_save'])
def test_sigterm_to_every_process_saves_one_checkpoint_at_one_step(tmp_path, when):
  """Pre-emption: SIGTERM reaches the processes of a training job at different moments, process 1
  first. Every process must stop after the same step and take part in the same save (a process
  saving at another step would leave the other waiting in a collective), then exit 0. Process 0's
  signal comes 0.5 s later ('soon': a step or more), or ('during_the_save') only once process 1's
  request has stopped it too and its save waits to be committed (the test hook
  `manager.STALL_ENV`, 3 s): then it must still finish that save and exit 0."""
  gin = tmp_path / 'tiny.gin'
  gin.write_text(worker.GIN)
  run = tmp_path / 'run'
  port = free_port()
  flags = [f'--gin_file={gin}', f"--gin.MODEL_DIR='{run}'", '--gin.TRAIN_STEPS=10000',
           '--gin_bindings=trainer.CheckpointConfig.save_period = 10000', '--model-parallel', '4',
           '--coordinator', f'localhost:{port}', '--num-processes', '2']
  logs = [tmp_path / f'log{i}' for i in (0, 1)]
  procs = []
  try:
    for i in (0, 1):
      with open(logs[i], 'w') as f:
        procs.append(subprocess.Popen(
            [sys.executable, '-m', 'gqa_spec', 'train', *flags, '--process-id', str(i)],
            env=dict(env(4), **({manager.STALL_ENV: '3'} if when == 'during_the_save' else {})),
            stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + 180
    log_file = run / 'train_log.jsonl'  # one line a step (log_period 1): training is under way
    while not (log_file.exists() and len(log_file.read_text().splitlines()) >= 3):
      assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
          log.read_text()[-2000:] for log in logs]
      time.sleep(0.2)
    procs[1].send_signal(signal.SIGTERM)
    if when == 'soon':
      time.sleep(0.5)
    else:  # the stop's save (the first: save_period 10000) waits before its commit
      while not (run / 'checkpoints' / 'save_stall_state').exists():
        assert time.monotonic() < deadline, [log.read_text()[-2000:] for log in logs]
        time.sleep(0.1)
    if procs[0].poll() is None:
      procs[0].send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=60) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
      p.wait()
  texts = [log.read_text() for log in logs]
  assert codes == [0, 0], [text[-2000:] for text in texts]
  # each process says where it stopped (a warning: process 1 logs warnings too); process 0 may
  # have stopped on process 1's request before its own signal came (then it still exits 0)
  stops = [re.findall(r'stopped (?:by signal at step (\d+)|at step (\d+) as another process asked)'
                      r'; saved a checkpoint', text) for text in texts]
  stops = [[a or b for a, b in found] for found in stops]
  assert len(stops[0]) == len(stops[1]) == 1 and stops[0] == stops[1], texts
  step = int(stops[0][0])
  if when == 'during_the_save':  # process 0 had stopped on process 1's request
    assert 'as another process asked' in texts[0], texts[0][-2000:]
  assert 3 <= step < 10000
  assert sorted(n for n in os.listdir(run / 'checkpoints') if n.isdigit()) == [str(step)]
  _, _, restored_step = load_any(str(run))  # complete, and its fingerprints match
  assert restored_step == step


def _two(tmp_path, argv_of, timeout=90):
  """Starts `gqa-spec` as process 0 and 1 of two, each in its own working directory (tmp/p0,
  tmp/p1: two hosts' disks), `argv_of(i)` its arguments; their exit codes, stderrs and seconds."""
  port = free_port()
  procs = []
  start = time.monotonic()
  try:
    for i in (0, 1):
      procs.append(subprocess.Popen(
          [sys.executable, '-m', 'gqa_spec', *argv_of(i), '--coordinator', f'localhost:{port}',
           '--num-processes', '2', '--process-id', str(i)], cwd=tmp_path / f'p{i}', env=env(1),
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True))
    outs = [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  return [p.returncode for p in procs], [err for _, err in outs], time.monotonic() - start


def _hosts(tmp_path, name, contents):
  """The file `name` on each 'host' (tmp/p0, tmp/p1), with contents[i]."""
  for i, text in enumerate(contents):
    (tmp_path / f'p{i}').mkdir(exist_ok=True)
    (tmp_path / f'p{i}' / name).write_text(text)


AGREE = 'every process must be given the same command, files and config'


def test_processes_given_other_inputs_stop_at_start(tmp_path):
  """Issue 61, case 1: the same command, each process pointing at another --inputs file (the
  output mixed the two files' rows): every process stops at start-up, naming process 1 and
  --inputs; nothing is written."""
  _hosts(tmp_path, 'in0.jsonl', ['{"input_ids": [5, 1]}\n'] * 2)
  (tmp_path / 'p1' / 'in1.jsonl').write_text('{"input_ids": [6, 1]}\n')
  codes, errs, seconds = _two(tmp_path, lambda i: [
      'generate', '--model', str(tmp_path / 'model'), '--inputs', f'in{i}.jsonl', '--out', 'o.jsonl'])
  assert codes == [2, 2] and seconds < 60, (codes, seconds, errs)
  for err in errs:
    assert err.strip().splitlines() == [
        'gqa-spec: error: process 1 differs from process 0 in --inputs (in1.jsonl against '
        f'in0.jsonl): {AGREE}'], err[-2000:]
  assert not any((tmp_path / f'p{i}' / 'o.jsonl').exists() for i in (0, 1))


def test_processes_given_other_bytes_under_one_name_stop_at_start(tmp_path):
  """The same command line, but `in.jsonl` holds other rows on each host's disk: its bytes
  differ, and every process names them."""
  _hosts(tmp_path, 'in.jsonl', ['{"input_ids": [5, 1]}\n', '{"input_ids": [6, 1]}\n'])
  codes, errs, _ = _two(tmp_path, lambda i: [
      'generate', '--model', str(tmp_path / 'model'), '--inputs', 'in.jsonl', '--out', 'o.jsonl'])
  assert codes == [2, 2], errs
  for err in errs:
    [line] = err.strip().splitlines()
    assert re.fullmatch(r'gqa-spec: error: process 1 differs from process 0 in the bytes of '
                        r'--inputs in\.jsonl \(sha256 [0-9a-f]{16} against sha256 [0-9a-f]{16}\): '
                        + AGREE, line), line


def test_gin_file_that_differs_stops_every_process_at_once(tmp_path):
  """Issue 61, case 5: a gin file with TRAIN_STEPS 8 on one host and 4 on the other (process 0
  stalled 60 s, then both aborted with 39 lines of C++ traces): one line on each, within
  seconds, naming the gin file; no run directory is made."""
  gin = worker.GIN + "MODEL_DIR = 'run'\nTRAIN_STEPS = "
  _hosts(tmp_path, 'tiny.gin', [gin + '8\n', gin + '4\n'])
  codes, errs, seconds = _two(tmp_path, lambda i: ['train', '--gin_file=tiny.gin'])
  assert codes == [2, 2] and seconds < 60, (codes, seconds, errs)
  for err in errs:
    [line] = err.strip().splitlines()
    assert re.fullmatch(r'gqa-spec: error: process 1 differs from process 0 in the bytes of '
                        r'--gin_file tiny\.gin \(sha256 \w+ against sha256 \w+\): ' + AGREE,
                        line), line
  assert not any((tmp_path / f'p{i}' / 'run').exists() for i in (0, 1))
