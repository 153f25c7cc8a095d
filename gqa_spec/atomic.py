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

Directories (native checkpoints, exports) use the same idea with `directory`: the caller fills a
temporary directory beside the target, which replaces the target only when complete.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from typing import Any, Iterator

from gqa_spec.errors import UserError


class WriteError(UserError):
  """A file or directory could not be written; nothing partial is left at its path."""


def describe(path: str, error: OSError) -> str:
  """'PATH: cannot write: No space left on device (ENOSPC); nothing was written there'."""
  name = errno.errorcode.get(error.errno or 0, 'unknown errno')
  reason = error.strerror or str(error)
  return f'{path}: cannot write: {reason} ({name}); nothing was written there'


def _temporary(path: str) -> str:
  head, tail = os.path.split(os.path.normpath(path))  # 'out/' is 'out', not a name inside it
  return os.path.join(head, f'.{tail}.tmp{os.getpid()}')


def _remove(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    with contextlib.suppress(OSError):
      os.remove(path)


@contextlib.contextmanager
def open_for_write(path: str, mode: str = 'w', encoding: str = 'utf-8') -> Iterator[Any]:
  """A file object whose contents appear at `path` only when the block ends without an error."""
  tmp = _temporary(path)
  done = False
  try:
    with open(tmp, mode, **({} if 'b' in mode else {'encoding': encoding})) as f:
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


@contextlib.contextmanager
def directory(path: str) -> Iterator[str]:
  """A temporary directory for the caller to fill; it replaces `path` (any directory there) only
  when the block ends without an error, and is removed otherwise."""
  path = os.path.normpath(path)
  tmp = _temporary(path)
  _remove(tmp)  # a leftover of a killed process with this pid
  done = False
  try:
    os.makedirs(tmp)
    yield tmp
    old = None
    if os.path.lexists(path):
      old = _temporary(path) + '.old'
      os.rename(path, old)  # two renames: a directory cannot be replaced in one
    try:
      os.rename(tmp, path)
    except OSError:
      if old:
        os.rename(old, path)  # the previous complete directory back in place
      raise
    done = True
    if old:
      _remove(old)
  except OSError as e:
    raise WriteError(describe(path, e)) from e
  except WriteError as e:  # a file inside, written with `open_for_write`: named by the directory
    if not isinstance(e.__cause__, OSError):
      raise
    raise WriteError(describe(path, e.__cause__)) from e.__cause__
  finally:
    if not done:
      _remove(tmp)
