"""Quiet the reads an orbax restore leaves behind when it fails.

When one array of a restore fails to read (damaged bytes, `integrity.raise_if_unreadable`),
orbax's `asyncio.gather` raises at once, and orbax closes its event loop with the other arrays'
reads still in flight. Three kinds of noise follow, each with a traceback, after the one-line error
this package already raised (measured: ~2,600 lines of stderr from one `gqa-spec generate` on a
checkpoint with one byte in 50 flipped, 12 runs in 12):
- asyncio logs "Task exception was never retrieved" for each read task that failed too, and
  "Future exception was never retrieved" for the tensorstore futures they awaited;
- tensorstore's threads, finishing the reads, call the closed loop's `call_soon_threadsafe`, which
  raises "Event loop is closed" (printed by `sys.unraisablehook`, from any thread, at any later
  moment, interpreter shutdown included);
- orbax's `_read_array_index_and_device_put` coroutines, closed when collected, turn the
  `GeneratorExit` into an `Exception` (printed by `sys.unraisablehook`).

A failed *save* (a full disk: tensorstore's writes fail with RESOURCE_EXHAUSTED) leaves the same
"Event loop is closed" aftermath, printed through `sys.excepthook` by tensorstore's threads, and
orbax logs each failed background operation at ERROR with its traceback (measured: ~680 lines of
stderr from `gqa-spec train` onto a full tmpfs before its one-line error). The failure itself
reaches the caller, which names it in one line (`manager.Checkpointer`).

`install()` (before every restore and save) drops exactly these, for the rest of the process: the
hooks and log filters it installs pass every other exception and record on.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import sys
import threading

_ORBAX_READ = '_read_array_index_and_device_put'
_READ_ERROR = 'Encountered error while reading array index'  # what that coroutine raises
# ... and what the tensorstore futures it awaited hold: an absl status, 'FAILED_PRECONDITION: Error
# reading "encoder.layers_0.mlp.wi_0.kernel/0.0" in OCDBT database at local file ...' (or, for a
# failed save, 'RESOURCE_EXHAUSTED: Error writing ...').
_TENSORSTORE_ERROR = re.compile(r'[A-Z_]+: Error (reading|writing) ')
_install_lock = threading.Lock()
_installed = False


def is_aftermath(unraisable) -> bool:
  """Whether a `sys.unraisablehook` argument is one of the two unraisable kinds above."""
  value, obj = unraisable.exc_value, unraisable.object
  code = getattr(obj, 'cr_code', None)
  if code is not None and code.co_name == _ORBAX_READ and f'{os.sep}orbax{os.sep}' in (
      code.co_filename):
    return True  # orbax's read coroutine, closed while its read was in flight
  return obj is None and _loop_closed(value, unraisable.exc_traceback)


def _loop_closed(value, tb) -> bool:
  """A tensorstore callback into orbax's closed event loop (`call_soon_threadsafe`)."""
  return (isinstance(value, RuntimeError) and str(value) == 'Event loop is closed'
          and tb is not None and tb.tb_frame.f_code.co_name == 'call_soon_threadsafe'
          and tb.tb_frame.f_code.co_filename == asyncio.base_events.__file__)


def install() -> None:
  """Installs the process-wide filters (once). Called before every restore: the first noise can
  come while orbax's failed restore unwinds, before the caller's `except` runs (seen in the suite)."""
  global _installed
  with _install_lock:
    if _installed:
      return
    _installed = True
    previous = sys.unraisablehook

    def hook(unraisable):
      if not is_aftermath(unraisable):
        previous(unraisable)

    sys.unraisablehook = hook
    previous_excepthook = sys.excepthook

    def excepthook(kind, value, tb):
      if not _loop_closed(value, tb):
        previous_excepthook(kind, value, tb)

    sys.excepthook = excepthook
    logging.getLogger('asyncio').addFilter(_NeverRetrieved())
    logging.getLogger('absl').addFilter(_OrbaxFailure())


def quiet() -> None:
  """After a failed orbax restore: the filters (`install`), and the failed read tasks collected now
  rather than at an unrelated later moment."""
  install()
  gc.collect()


class _NeverRetrieved(logging.Filter):
  """Drops asyncio's 'Task exception was never retrieved' records of orbax's failed reads and
  writes."""

  def filter(self, record: logging.LogRecord) -> bool:  # pylint: disable=redefined-outer-name
    error = str(record.exc_info[1]) if record.exc_info else ''
    return not ('exception was never retrieved' in record.getMessage() and
                (error.startswith(_READ_ERROR) or _TENSORSTORE_ERROR.match(error) or
                 _from_orbax(record.exc_info)))


def _from_orbax(exc_info) -> bool:
  """An OSError raised in orbax's own file writes (`async_path`: a full disk)."""
  if not exc_info or not isinstance(exc_info[1], OSError):
    return False
  tb = exc_info[2]
  while tb is not None:
    if f'{os.sep}orbax{os.sep}' in tb.tb_frame.f_code.co_filename:
      return True
    tb = tb.tb_next
  return False


class _OrbaxFailure(logging.Filter):
  """Drops orbax's ERROR records (a failed background save, with its traceback): the failure is
  raised to the caller, which names it in one line."""

  def filter(self, record: logging.LogRecord) -> bool:  # pylint: disable=redefined-outer-name
    return not (record.levelno >= logging.ERROR and f'{os.sep}orbax{os.sep}' in record.pathname)
