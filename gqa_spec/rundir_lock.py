"""One writer per run directory: the `RUNNING.json` lock that `train`, `uptrain`, `train-draft` and
`gqa-spec reproduce` (its results and work directories) hold while they write.

Standard library only, so `gqa-spec status` reads it without JAX. Readers (`eval`, `generate`,
`status`) never take it.

  with rundir_lock.running(model_dir, total_steps=1000):   # enabled=jax.process_index() == 0
    ...  # write

- Taking it: the lock's JSON (pid, host, started, heartbeat, a random token) is written to a
  temporary file which is hard-linked to `RUNNING.json`: the link fails when the name exists, also
  on NFS, and a reader never sees half a lock.
- A second writer (another process, here or on another host) refuses at once with `LockHeldError`,
  one line naming the holder (pid, host, since, last heartbeat) and how to proceed.
- A lock whose holder is gone is taken over, with a warning naming it: on this host when its pid no
  longer exists (SIGKILL, a crash), from another host when its heartbeat is older than
  `STALE_SECONDS` (the holder rewrites it every `HEARTBEAT_SECONDS` from a thread; this needs the
  hosts' clocks to agree within a few minutes).
- The same process may take it again (a trainer inside `uptrain`): held until the outermost ends.
- Released when the outermost block ends, also by an exception or a signal; only the lock with this
  holder's token is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Dict, Iterator, Optional

from gqa_spec.errors import UserError
from gqa_spec.rundir import RUNNING_FILE

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0  # 10 missed heartbeats: a holder on another host is presumed gone
_WRITING_SECONDS = 10.0  # an unreadable lock this young is still being written (no-link fallback)

_mutex = threading.Lock()
_held: Dict[str, '_Held'] = {}  # realpath of a directory -> what this process holds there


class LockHeldError(UserError):
  """Another live process is writing the run directory."""


class _Held:
  """A lock this process holds: how many blocks hold it, its token, and its heartbeat thread."""

  def __init__(self, path: str, record: dict):
    self.path, self.record, self.count = path, record, 1
    self.stop = threading.Event()
    self.thread = threading.Thread(target=self._beat, name='rundir-lock-heartbeat', daemon=True)
    self.thread.start()

  def _beat(self) -> None:
    while not self.stop.wait(HEARTBEAT_SECONDS):
      current = _read(self.path)
      if not current or current.get('token') != self.record['token']:
        log.error('%s: this process (pid %d) no longer holds the lock; another writer took it over',
                  self.path, os.getpid())
        return
      self.record['heartbeat'] = time.time()
      tmp = f"{self.path}.{self.record['token']}.beat"
      try:
        with open(tmp, 'w') as f:
          json.dump(self.record, f)
        os.replace(tmp, self.path)
      except OSError as e:  # a full disk: the lock stays, with an older heartbeat
        log.warning('%s: cannot refresh the heartbeat: %s', self.path, e)
        with contextlib.suppress(OSError):
          os.remove(tmp)


def _read(path: str) -> Optional[dict]:
  """The lock at `path`; None when there is none; {} when it cannot be read as a lock."""
  try:
    with open(path) as f:
      lock = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}
  return lock if isinstance(lock, dict) and {'pid', 'host', 'started'} <= set(lock) else {}


def _since(seconds: float) -> str:
  return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(seconds))


def _holder(lock: dict) -> str:
  """'pid 123 on host h, since 2026-11-26 07:50:01, heartbeat 5 s ago'."""
  age = time.time() - lock.get('heartbeat', lock['started'])
  return (f"pid {lock['pid']} on host {lock['host']}, since {_since(lock['started'])}, "
          f'heartbeat {age:.0f} s ago')


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # alive, another user's
  return True


def _gone(path: str, lock: dict) -> Optional[str]:
  """Why the holder of `lock` is gone (a stale lock), or None when it may still be writing."""
  if not lock:
    try:
      age = time.time() - os.path.getmtime(path)
    except FileNotFoundError:
      return 'it vanished'
    return None if age < _WRITING_SECONDS else 'it cannot be read as a lock'
  if lock['host'] == socket.gethostname():
    return None if _pid_alive(lock['pid']) else f"its pid {lock['pid']} is gone on this host"
  age = time.time() - lock.get('heartbeat', lock['started'])
  if age > STALE_SECONDS:
    return f'its heartbeat is {age:.0f} s old (more than {STALE_SECONDS:.0f} s)'
  return None


def _take_over(path: str, stale: dict) -> bool:
  """Moves the stale lock aside; False when what was moved is not it (a fresh lock another taker
  made meanwhile: it is put back) or nothing was there."""
  aside = f'{path}.{uuid.uuid4().hex}.stale'
  try:
    os.rename(path, aside)
  except FileNotFoundError:
    return False
  if _read(aside) != stale:  # a fresh lock, not the one judged stale: put it back
    with contextlib.suppress(OSError):
      os.link(aside, path)
    os.remove(aside)
    return False
  os.remove(aside)
  return True


def _link(tmp: str, path: str) -> None:
  """Puts the complete lock file `tmp` at `path`; FileExistsError when a lock is there."""
  try:
    os.link(tmp, path)
  except FileExistsError:
    raise
  except OSError:  # a filesystem without hard links: exclusive create, then write
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    with os.fdopen(fd, 'w') as f, open(tmp) as src:
      f.write(src.read())


def _acquire(directory: str, info: dict) -> None:
  key = os.path.realpath(directory)
  with _mutex:
    if key in _held:
      _held[key].count += 1
      return
  path = os.path.join(directory, RUNNING_FILE)
  now = time.time()
  record = dict(info, pid=os.getpid(), host=socket.gethostname(), started=now, heartbeat=now,
                token=uuid.uuid4().hex)
  tmp = f"{path}.{record['token']}.tmp"
  try:
    with open(tmp, 'w') as f:
      json.dump(record, f)
    for _ in range(5):
      try:
        _link(tmp, path)
        break
      except FileExistsError:
        lock = _read(path)
        if lock is None:
          continue  # released meanwhile
        reason = _gone(path, lock)
        if reason is None:
          raise LockHeldError(
              f'{directory}: another process is writing this run directory ('
              + (_holder(lock) if lock else 'its lock is being written')
              + f'); wait for it to end, stop it (kill {lock.get("pid", "PID")}'
              + (f' on host {lock["host"]}' if lock.get('host', socket.gethostname())
                 != socket.gethostname() else '')
              + '), or write to another directory') from None
        if _take_over(path, lock):
          log.warning('%s: took over the lock of a writer that is gone (%s): %s', directory,
                      _holder(lock) if lock else 'unreadable lock', reason)
    else:
      raise LockHeldError(f'{directory}: could not take the lock {RUNNING_FILE} (other writers keep '
                          'taking it); try again')
  finally:
    with contextlib.suppress(OSError):
      os.remove(tmp)
  with _mutex:
    _held[key] = _Held(path, record)


def _release(directory: str) -> None:
  key = os.path.realpath(directory)
  with _mutex:
    held = _held[key]
    held.count -= 1
    if held.count:
      return
    del _held[key]
  held.stop.set()
  held.thread.join()
  if (_read(held.path) or {}).get('token') == held.record['token']:
    with contextlib.suppress(FileNotFoundError):
      os.remove(held.path)


@contextlib.contextmanager
def running(directory: str, enabled: bool = True, **info) -> Iterator[None]:
  """Holds the lock of `directory` (created) for the block; `info` is recorded in it.

  enabled: False takes nothing (the other processes of a multi-process run: process 0 writes).
  """
  make_directory(directory)
  if not enabled:
    yield
    return
  _acquire(directory, info)
  try:
    yield
  finally:
    _release(directory)


def make_directory(directory: str) -> None:
  """Creates a run directory; one line when its path (or a parent's) is a file."""
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise UserError(f'{directory} is a file, not a run directory; give a directory path')
  try:
    os.makedirs(directory, exist_ok=True)
  except (FileExistsError, NotADirectoryError) as e:
    raise UserError(f'{directory}: cannot create the run directory ({e.strerror}: '
                    f'{e.filename}); give a directory path') from e
  except OSError as e:
    raise UserError(f'{directory}: cannot create the run directory: {e.strerror}') from e


def process_state(directory: str) -> str:
  """'running (pid N, ...)', 'not running', or what can be told of a lock from another host."""
  path = os.path.join(directory, RUNNING_FILE)
  lock = _read(path)
  if lock is None:
    return 'not running'
  if not lock:
    return f'unknown ({RUNNING_FILE} cannot be read as a lock)'
  since = _since(lock['started'])
  if lock['host'] != socket.gethostname():
    age = time.time() - lock.get('heartbeat', lock['started'])
    state = f"a process on host {lock['host']} (pid {lock['pid']}) started writing at {since}"
    if 'heartbeat' not in lock:
      return state
    stale = ' (stale: the next writer takes it over)' if age > STALE_SECONDS else ''
    return f'{state}; heartbeat {age:.0f} s ago{stale}'
  if not _pid_alive(lock['pid']):
    return f"not running (pid {lock['pid']}, started {since}, ended without cleaning up: killed?)"
  return f"running (pid {lock['pid']}, since {since})"
