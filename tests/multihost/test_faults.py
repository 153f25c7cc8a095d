"""A process of a multi-process job killed (SIGKILL): every other process ends within seconds with
one line naming it (`distributed._watch`), not after JAX's heartbeat timeout with pages of C++ log;
an ordinary end, one process finishing before the other, is no loss."""

import os
import signal
import subprocess
import sys
import time

import pytest

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
