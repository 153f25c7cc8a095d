"""Files written whole or not at all: a temporary name beside the target, renamed when complete.

Standard library only, so every layer may use it (below `models`, like `errors`). A failure while
writing (a full disk, a quota, a permission, a signal) removes the temporary file, leaves whatever
was at the target before untouched, and raises `WriteError`: one line naming the path and the errno,
which the CLI prints as `gqa-spec: error: PATH: cannot write: No space left on device (ENOSPC);
nothing was written there`.

  with atomic.open_for_write(path) as f:   # or mode='wb'
    f.write(...)
  atomic.write_text(path, text)
  atomic.write_json(path, obj)
  atomic.copy_file(source, path)

Directories (native checkpoints, exports) use the same idea with `directory`: the caller fills a
temporary directory beside the target, which replaces the target only when complete (in one step
where the kernel can swap two paths, `renameat2`'s RENAME_EXCHANGE; else in two renames).

What the target is decides how it is written:
- `-` is standard output, and a device, a FIFO or a socket (or a link to one: `/dev/stdout`,
  `/dev/null`) is a stream: written in place, never replaced by a rename (as root, a rename would
  put a regular file where `/dev/null` was).
- A symbolic link is followed: its final target is written whole or not at all, the link stays.

A writer killed before its rename (SIGKILL, a power cut) leaves its temporary `.NAME.tmpPID`
(`.NAME.tmpPID.old`: a directory replaced in two renames, cut between them). The next write to the
same target removes those whose writer is gone (`sweep`; a directory cut between its two renames is
put back first), a run directory's next writer removes all of its own (`sweep_all`, from
`rundir_lock`), and `gqa-spec status` lists what is left (`leftovers`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import shutil
import stat
import sys
from typing import Any, Iterator, List, Optional

from gqa_spec import pids
from gqa_spec.errors import UserError

log = logging.getLogger(__name__)

STDOUT = '-'

class WriteError(UserError):
  """A file or directory could not be written; nothing partial is left at its path."""


def describe(path: str, error: OSError, stream: bool = False) -> str:
  """'PATH: cannot write: No space left on device (ENOSPC); nothing was written there' (a stream:
  without the last clause, as a stream keeps what was written before the error)."""
  name = errno.errorcode.get(error.errno or 0, 'unknown errno')
  reason = error.strerror or str(error)
  return (f'{path}: cannot write: {reason} ({name})' +
          ('' if stream else '; nothing was written there'))


def is_stream(path: str) -> bool:
  """Whether `path` is written in place: `-` (standard output), a device, FIFO or socket (also
  through a symbolic link), or a path through `/proc` (`/dev/stdout` is a link to
  `/proc/self/fd/1`, which names the file a shell's `>` opened: replacing that file would leave the
  shell's descriptor on the old one); never a regular file or a directory elsewhere."""
  if path == STDOUT or _through_proc(path):
    return True
  try:
    mode = os.stat(path).st_mode
  except (OSError, ValueError):
    return False
  return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _through_proc(path: str) -> bool:
  """Whether `path`, or a link on the way to its target, lies under /proc."""
  for _ in range(40):  # the kernel's own limit on a chain of links
    path = os.path.abspath(path)
    if path == '/proc' or path.startswith('/proc/'):
      return True
    if not os.path.islink(path):
      return False
    path = os.path.join(os.path.dirname(path), os.readlink(path))
  return False


def unwritable(directory: str) -> Optional[str]:
  """Why no file can be made in the existing `directory` ('read-only file system', 'permission
  denied'), or None. `os.access` answers for the caller's user, root included (on a read-only
  mount even root is refused)."""
  if os.access(directory, os.W_OK | os.X_OK):
    return None
  try:
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
      return 'read-only file system'
  except OSError:
    pass
  return 'permission denied'


def final_target(path: str) -> str:
  """Where a write to `path` lands: a symbolic link's final target (a chain followed to its end,
  which need not exist yet), else `path` itself."""
  path = os.path.normpath(path)  # 'out/' is 'out', not a name inside it
  return os.path.realpath(path) if os.path.islink(path) else path


def _temporary(path: str) -> str:
  head, tail = os.path.split(os.path.normpath(path))
  return os.path.join(head, f'.{tail}.tmp{os.getpid()}')


_LEFTOVER = re.compile(r'\.(?P<name>.+)\.tmp(?P<pid>\d+)(?P<old>\.old)?')


def _writer_gone(pid: int, path: str) -> bool:
  """Whether the process that wrote the temporary `path` as `pid` is gone: no such pid, this
  process (a leftover of an earlier one with the same pid), or a process started after the
  temporary was last written (the pid was reused)."""
  if pid == os.getpid() or not pids.alive(pid):
    return True
  try:
    return pids.started_after(pid, os.lstat(path).st_mtime)
  except OSError:
    return False


def leftovers(directory: str, name: Optional[str] = None) -> List[str]:
  """The temporaries in `directory` (of the target `name`, else of any) whose writer is gone."""
  try:
    entries = sorted(os.listdir(directory))
  except OSError:
    return []
  found = []
  for entry in entries:
    match = _LEFTOVER.fullmatch(entry)
    if match and (name is None or match['name'] == name):
      path = os.path.join(directory, entry)
      if _writer_gone(int(match['pid']), path):
        found.append(path)
  return found


def _clean(leftover: str) -> None:
  """Removes one leftover; a directory moved aside by a replacement cut between its two renames
  (`.NAME.tmpPID.old`, its target missing) is put back instead."""
  head, entry = os.path.split(leftover)
  match = _LEFTOVER.fullmatch(entry)
  target = os.path.join(head, match['name'])
  if match['old'] and not os.path.lexists(target):
    with contextlib.suppress(OSError):
      os.rename(leftover, target)
      log.warning('%s: put back the previous copy, which a writer that was killed while '
                  'replacing it had moved aside', target)
      return
  _remove(leftover)


def sweep(path: str) -> None:
  """Removes the temporaries of `path` that writers which are gone left beside it."""
  head, tail = os.path.split(os.path.normpath(path))
  for leftover in leftovers(head or '.', tail):
    _clean(leftover)


def sweep_all(directory: str) -> List[str]:
  """Removes every temporary in `directory` whose writer is gone; returns their paths."""
  found = leftovers(directory)
  for leftover in sorted(found, key=lambda p: not p.endswith('.old')):  # put back, then remove
    _clean(leftover)
  if found:
    log.warning('%s: removed %d temporary file(s) of writers that are gone: %s', directory,
                len(found), ', '.join(os.path.basename(p) for p in found))
  return found


def _remove(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    with contextlib.suppress(OSError):
      os.remove(path)


@contextlib.contextmanager
def open_for_write(path: str, mode: str = 'w', encoding: str = 'utf-8') -> Iterator[Any]:
  """A file object whose contents appear at `path` only when the block ends without an error;
  `-` and streams (`is_stream`) are written in place, a symbolic link's target whole."""
  kwargs = {} if 'b' in mode else {'encoding': encoding}
  if is_stream(path):
    try:
      if path == STDOUT:
        out = sys.stdout.buffer if 'b' in mode else sys.stdout
        yield out
        out.flush()
      else:  # appended: a descriptor's file (`/dev/stdout` after `>`) keeps what precedes
        sys.stdout.flush()
        with open(path, mode.replace('w', 'a'), **kwargs) as f:
          yield f
    except OSError as e:
      raise WriteError(describe('standard output' if path == STDOUT else path, e,
                                stream=True)) from e
    return
  path = final_target(path)
  sweep(path)
  tmp = _temporary(path)
  done = False
  try:
    with open(tmp, mode, **kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
    done = True
  except OSError as e:
    raise WriteError(describe(path, e)) from e
  finally:  # also on a signal's KeyboardInterrupt and on the caller's own errors
    if not done:
      _remove(tmp)


def write_text(path: str, text: str) -> None:
  with open_for_write(path) as f:
    f.write(text)


def write_json(path: str, obj: Any, **dump_kwargs) -> None:
  with open_for_write(path) as f:
    json.dump(obj, f, **dump_kwargs)
    f.write('\n')


def copy_file(source: str, path: str) -> None:
  """Copies the file `source` to `path`, whole or not at all."""
  with open(source, 'rb') as src, open_for_write(path, 'wb') as f:
    shutil.copyfileobj(src, f)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: str, b: str) -> bool:
  """Swaps the paths `a` and `b` in one step (Linux `renameat2(RENAME_EXCHANGE)`); False where the
  C library or the filesystem cannot."""
  try:
    renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
  except (OSError, AttributeError):
    return False
  if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
    return True
  code = ctypes.get_errno()
  if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
    return False
  raise OSError(code, os.strerror(code), b)


@contextlib.contextmanager
def directory(path: str) -> Iterator[str]:
  """A temporary directory for the caller to fill; it replaces `path` (any directory there; a
  symbolic link's target, the link kept) only when the block ends without an error, and is removed
  otherwise."""
  path = final_target(path)
  sweep(path)  # also a leftover of a killed process with this pid
  tmp = _temporary(path)
  try:
    os.makedirs(tmp)
    yield tmp
    if not os.path.lexists(path):
      os.rename(tmp, path)
    elif _exchange(tmp, path):  # tmp now holds the previous directory
      pass
    else:
      old = _temporary(path) + '.old'
      os.rename(path, old)  # two renames: a directory cannot be replaced in one
      try:
        os.rename(tmp, path)
      except OSError:
        os.rename(old, path)  # the previous complete directory back in place
        raise
      os.rename(old, tmp)  # removed below, under the name `sweep` knows as no longer needed
  except OSError as e:
    raise WriteError(describe(path, e)) from e
  except WriteError as e:  # a file inside, written with `open_for_write`: named by the directory
    if not isinstance(e.__cause__, OSError):
      raise
    raise WriteError(describe(path, e.__cause__)) from e.__cause__
  finally:
    _remove(tmp)  # the failed new directory, or the previous one it replaced
