"""One writer per run directory: the `RUNNING.json` lock that `train`, `uptrain`, `train-draft` and
`gqa-spec reproduce` (its results and work directories) hold while they write.

Standard library only, so `gqa-spec status` reads it without JAX. Readers (`eval`, `generate`,
`status`) never take it.

  with rundir_lock.running(model_dir, total_steps=1000):   # enabled=jax.process_index() == 0
    ...  # write

- Taking it: the lock's JSON (pid, host, started, heartbeat, a random token, and what names the
  process beyond its pid: the boot id and its start time in `/proc/PID/stat`, `pids.identity`) is
  written to a temporary file which is hard-linked to `RUNNING.json`: the link fails when the name
  exists, also on NFS, and a reader never sees half a lock. A run directory that cannot be written
  (a read-only mount, permissions) is one line naming it, before anything else.
- A second writer (another process, here or on another host) refuses at once with `LockHeldError`,
  one line naming the holder (pid, host, since, last heartbeat) and how to proceed.
- A lock whose holder is gone is taken over, with a warning naming it: on this host when its pid no
  longer exists (SIGKILL, a crash) or now names another process (a reused pid: after a reboot, in
  a container restarted with the same pids; told by the boot id and start time, or for a lock
  written before those were recorded by a process that started after the lock was taken), from
  another host when its heartbeat is older than `STALE_SECONDS` (the holder rewrites it every
  `HEARTBEAT_SECONDS` from a thread; this needs the hosts' clocks to agree within a few minutes).
  A lock file of the wrong shape (not JSON, a missing field, a pid that is a string) is unreadable:
  taken over once it is `_WRITING_SECONDS` old, and `status` says why in one line.
- Once taken, the temporaries of the directory's writers that are gone (`.NAME.tmpPID`, from a
  kill -9 during an export: `atomic.sweep_all`) and stale side files of the lock are removed.
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
from typing import Dict, Iterator, List, Optional

from gqa_spec import atomic, pids, rundir
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


_FIELDS = {'pid': int, 'host': str, 'started': float}
_OPTIONAL = {'heartbeat': float, 'token': str, 'boot_id': str, 'start_ticks': int}


def _read_checked(path: str) -> Optional[dict]:
  """The lock at `path`; None when there is none; `rundir.RecordError` when it has another shape."""
  try:
    return rundir.read_record(path, _FIELDS, 'run directory lock', _OPTIONAL)
  except FileNotFoundError:
    return None
  except OSError as e:
    raise rundir.RecordError(f'{path}: cannot be read: {e.strerror}') from None


def _read(path: str) -> Optional[dict]:
  """The lock at `path`; None when there is none; {} when it cannot be read as a lock."""
  try:
    return _read_checked(path)
  except rundir.RecordError:
    return {}


def _unreadable(path: str) -> str:
  """Why the lock at `path` cannot be read ("its field 'pid' is a string ...")."""
  try:
    _read_checked(path)
  except rundir.RecordError as e:
    return str(e).split(' (run directory lock): ', 1)[-1]
  return 'it changed meanwhile'


def _since(seconds: float) -> str:
  return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(seconds))


def _holder(lock: dict) -> str:
  """'pid 123 on host h, since 2026-11-26 07:50:01, heartbeat 5 s ago'."""
  age = time.time() - lock.get('heartbeat', lock['started'])
  return (f"pid {lock['pid']} on host {lock['host']}, since {_since(lock['started'])}, "
          f'heartbeat {age:.0f} s ago')


def _holder_gone(lock: dict) -> Optional[str]:
  """Why the holder of a lock taken on this host is gone (its pid gone, or reused), or None."""
  reason = pids.gone(lock['pid'], lock)
  if reason is None and 'start_ticks' not in lock and pids.started_after(lock['pid'],
                                                                          lock['started']):
    reason = (f"its pid {lock['pid']} now belongs to another process, started after the lock was "
              'taken')
  return reason


def _gone(path: str, lock: dict) -> Optional[str]:
  """Why the holder of `lock` is gone (a stale lock), or None when it may still be writing."""
  if not lock:
    try:
      age = time.time() - os.path.getmtime(path)
    except FileNotFoundError:
      return 'it vanished'
    return None if age < _WRITING_SECONDS else f'it cannot be read as a lock: {_unreadable(path)}'
  if lock['host'] == socket.gethostname():
    return _holder_gone(lock)
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


def _held_error(directory: str, lock: dict) -> LockHeldError:
  return LockHeldError(
      f'{directory}: another process is writing this run directory ('
      + (_holder(lock) if lock else 'its lock is being written')
      + f'); wait for it to end, stop it (kill {lock.get("pid", "PID")}'
      + (f' on host {lock["host"]}' if lock.get('host', socket.gethostname())
         != socket.gethostname() else '')
      + '), or write to another directory')


def check_free(directory: str) -> None:
  """Raises `LockHeldError` when another live writer holds `directory`'s lock; creates nothing.
  For commands that check their inputs before they make the run directory (a refused run leaves
  nothing behind): a held lock is still the first thing they report."""
  if os.path.realpath(directory) in _held:
    return  # this process holds it
  path = os.path.join(directory, RUNNING_FILE)
  lock = _read(path)
  if lock is not None and _gone(path, lock) is None:
    raise _held_error(directory, lock)


def _acquire(directory: str, info: dict) -> None:
  key = os.path.realpath(directory)
  with _mutex:
    if key in _held:
      _held[key].count += 1
      return
  path = os.path.join(directory, RUNNING_FILE)
  now = time.time()
  record = dict(info, pid=os.getpid(), host=socket.gethostname(), started=now, heartbeat=now,
                token=uuid.uuid4().hex, **pids.identity())
  tmp = f"{path}.{record['token']}.tmp"
  try:
    try:
      with open(tmp, 'w') as f:
        json.dump(record, f)
    except OSError as e:
      raise UserError(f'{directory}: cannot write the run directory ({e.strerror}); nothing was '
                      'written there') from None
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
          raise _held_error(directory, lock) from None
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
  for place in (directory, os.path.dirname(os.path.join(directory, rundir.VOCAB_FILE))):
    atomic.sweep_all(place)  # what writers killed before their rename left (`leftovers`)
  for side in _stale_side_files(directory):
    with contextlib.suppress(OSError):
      os.remove(side)


def _stale_side_files(directory: str) -> List[str]:
  """The lock's own temporaries (`RUNNING.json.TOKEN.tmp|beat|stale`) a killed taker or holder left:
  older than a minute (a live taker's last a moment)."""
  try:
    names = os.listdir(directory)
  except OSError:
    return []
  found = []
  for name in sorted(names):
    path = os.path.join(directory, name)
    if name.startswith(RUNNING_FILE + '.') and name.endswith(('.tmp', '.beat', '.stale')):
      with contextlib.suppress(OSError):
        if time.time() - os.lstat(path).st_mtime > 6 * _WRITING_SECONDS:
          found.append(path)
  return found


def leftovers(directory: str) -> List[str]:
  """Temporaries in a run directory whose writers are gone: what the next writer removes."""
  return (atomic.leftovers(directory) +
          atomic.leftovers(os.path.dirname(os.path.join(directory, rundir.VOCAB_FILE))) +
          _stale_side_files(directory))


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
  reason = atomic.unwritable(directory)
  if reason:
    raise UserError(f'{directory}: cannot write the run directory ({reason}); give a writable '
                    'directory')


def process_state(directory: str) -> str:
  """'running (pid N, ...)', 'not running', or what can be told of a lock from another host."""
  path = os.path.join(directory, RUNNING_FILE)
  lock = _read(path)
  if lock is None:
    return 'not running'
  if not lock:
    return f'unknown ({RUNNING_FILE} cannot be read as a lock: {_unreadable(path)})'
  since = _since(lock['started'])
  if lock['host'] != socket.gethostname():
    age = time.time() - lock.get('heartbeat', lock['started'])
    state = f"a process on host {lock['host']} (pid {lock['pid']}) started writing at {since}"
    if 'heartbeat' not in lock:
      return state
    stale = ' (stale: the next writer takes it over)' if age > STALE_SECONDS else ''
    return f'{state}; heartbeat {age:.0f} s ago{stale}'
  gone = _holder_gone(lock)
  if gone:
    return (f"not running (pid {lock['pid']}, started {since}, ended without cleaning up: killed?"
            f'; {gone})')
  return f"running (pid {lock['pid']}, since {since})"
