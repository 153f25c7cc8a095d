"""Train-state checkpoints: an orbax `CheckpointManager` under `<model_dir>/checkpoints`.

Each step directory holds two items: `state` (the whole `TrainState`: step, params, optimizer
state, saved and restored *sharded*: every host writes its shards, restore places them by the
target shardings) and `meta` (JSON: the model config, the step the data pipeline started at,
free-form run information). Saves are asynchronous and atomic (orbax writes a temporary directory
and renames it when complete), so a run killed at any moment leaves only complete checkpoints, and
`latest_step` never names a half-written one.

The meta item also holds the integrity record (`integrity.record`: a fingerprint of every array of
the state, summed where its data lives); every restore verifies what it read
against it, and a mismatch is one line naming the checkpoint and the array. Data too damaged to
decompress is named the same way. Checkpoints written before the record existed restore with a
logged note that they cannot be verified.

  ckpt = Checkpointer('/tmp/run', save_period=1000, keep=3)
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(ckpt.latest_step(), abstract_state_with_shardings)
  ckpt.save(step, state, meta)            # every save_period steps (or force=True)
  ckpt.close()                            # waits for pending writes
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import time
from typing import Any, Optional, Tuple

import jax
import orbax.checkpoint as ocp

from gqa_spec import atomic
from gqa_spec.checkpoints import aborted_reads, integrity
from gqa_spec.checkpoints.orbax_lock import LOCK
from gqa_spec.errors import UserError
from gqa_spec.rundir import CHECKPOINTS_DIR

# Test hook: seconds every save stalls after its data is written and before orbax commits it
# (renames the temporary directory), announced by a `save_stall_<step>` file in the run directory,
# so that a test can kill a process inside an asynchronous save deterministically.
STALL_ENV = 'GQA_SPEC_TEST_SAVE_STALL_SECONDS'


def abstract_with_shardings(abstract: Any, shardings: Any) -> Any:
  """`ShapeDtypeStruct`s carrying the target shardings: restore places every shard directly."""
  return jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)


def has_checkpoints(model_dir: str) -> bool:
  """Whether `model_dir` holds trainer checkpoints."""
  return os.path.isdir(os.path.join(model_dir, CHECKPOINTS_DIR))


class Checkpointer:
  """Periodic, keep-last-N, asynchronous, sharded train-state checkpoints.

  Args:
    model_dir: the run directory; checkpoints go to `<model_dir>/checkpoints/<step>`.
    save_period: save when `step % save_period == 0` (and whenever `save(force=True)`).
    keep: how many of the latest checkpoints to keep (None: all).
    asynchronous: write in a background thread while training continues.
  """

  def __init__(self, model_dir: str, save_period: int = 1000, keep: Optional[int] = 3,
               asynchronous: bool = True):
    if save_period < 1:
      raise UserError(f'checkpoint save_period must be >= 1, got {save_period}')
    if keep is not None and keep < 1:
      raise UserError(f'checkpoint keep must be >= 1 or None, got {keep}')
    self.directory = os.path.join(os.path.abspath(model_dir), CHECKPOINTS_DIR)
    self.save_period = save_period
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True,
        enable_async_checkpointing=asynchronous, cleanup_tmp_directories=True)
    with LOCK:  # it may create the directory (an orbax operation)
      self._manager = ocp.CheckpointManager(self.directory, item_names=('state', 'meta'),
                                            options=options)
    self._params_reader = None  # `restore_params`' manager, made on first use
    self._saving = None  # the step of the last save started (asynchronous: maybe still writing)
    self._failed = None  # the `WriteError` of a failed save: raised once, then by every save
    self._failed_step = None  # its step, whose temporary directories `close` removes again
    if os.environ.get(STALL_ENV):
      _stall_commits(float(os.environ[STALL_ENV]))

  def latest_step(self) -> Optional[int]:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, meta: dict, force: bool = False) -> bool:
    """Saves if `step` is due (or `force`); returns whether a save started.

    Raises:
      WriteError: this save or the previous, asynchronous one failed (a full disk): one line naming
        the step, the errno and the latest complete checkpoint, which stays loadable.
    """
    if step in self._manager.all_steps() or not (force or step % self.save_period == 0):
      return False
    meta = dict(meta, integrity=integrity.record(state))  # before the next step donates `state`
    aborted_reads.install()  # a failed save's aftermath: orbax's ERROR logs, tensorstore's threads
    with self._write_errors(step), LOCK:
      started = self._manager.save(
          step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                        meta=ocp.args.JsonSave(meta)), force=force)
    self._saving = step
    return started

  @contextlib.contextmanager
  def _write_errors(self, step: int):
    """Turns a failed save into one line, and removes its uncommitted temporary directory."""
    if self._failed:
      raise self._failed
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except; orbax re-raises tensorstore's ValueError
      failed = re.search(r'checkpoints/(\d+)\.orbax-checkpoint-tmp', str(e))
      failed = int(failed.group(1)) if failed else (self._saving or step)
      self._failed_step = failed
      self._remove_uncommitted(failed)
      code = re.search(r"os_error_code='(\d+)'", str(e))
      code = getattr(e, 'errno', None) or (int(code.group(1)) if code else None)
      reason = (f'{os.strerror(code)} ({errno.errorcode.get(code, code)})' if code
                else integrity.first_line(e))
      latest = self._manager.latest_step()
      self._failed = atomic.WriteError(
          f'{self.directory}/{failed}: cannot save the checkpoint: {reason}; nothing was written '
          'there, and the latest complete checkpoint is ' +
          (f'step {latest} (the same command resumes from it)' if latest is not None else 'none'))
      raise self._failed from None

  def _remove_uncommitted(self, step: int) -> None:
    """Removes the temporary directories of the failed save of `step`. The save's other writers
    (tensorstore's threads, orbax's) may still be finishing and create them again after the error,
    so this repeats until none has come back for 0.2 s (2 s at most); orbax's start-up cleanup
    removes any that comes back later."""
    quiet_since, deadline = None, time.monotonic() + 2.0
    while time.monotonic() < deadline:
      names = [name for name in (os.listdir(self.directory) if os.path.isdir(self.directory) else ())
               if name.startswith(f'{step}.orbax-checkpoint-tmp')]
      for name in names:
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
      if names:
        quiet_since = None
      elif quiet_since is None:
        quiet_since = time.monotonic()
      elif time.monotonic() - quiet_since >= 0.2:
        return
      time.sleep(0.02)

  def restore(self, step: int, target: Any) -> Tuple[Any, dict]:
    """The state at `step`, laid out as `target` (`abstract_with_shardings`), and its meta."""
    aborted_reads.install()
    try:
      with LOCK:
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                          meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except; orbax raises many types for bad data
      integrity.raise_if_unreadable(self._state_dir(step), e, f'{self.directory}/{step}', 'array')
      raise UserError(f'{self.directory}/{step}: cannot restore the train state (does the model '
                      f'config match the checkpoint?): {integrity.first_line(e)}') from None
    meta = restored['meta']
    integrity.verify(meta.pop('integrity', None), restored['state'], f'{self.directory}/{step}')
    return restored['state'], meta

  def restore_meta(self, step: int) -> dict:
    """Only the meta item (config, data position) of the checkpoint at `step`."""
    with LOCK:
      meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    meta = meta['meta']
    meta.pop('integrity', None)
    return meta

  def restore_params(self, step: int, target_params: Any) -> Any:
    """Only the parameters of the checkpoint at `step` (no optimizer state is read), verified.

    Through a second, read-only manager: orbax binds an item to the first handler that restores
    it, so the manager that ran a full `restore` (StandardRestore) refuses a partial one
    (PyTreeRestore) and the other way round."""
    aborted_reads.install()
    try:
      with LOCK:
        if self._params_reader is None:
          logging.getLogger('absl').addFilter(_quiet_read_only)  # (once: a set of filters)
          self._params_reader = ocp.CheckpointManager(
              self.directory, item_names=('state', 'meta'),
              options=ocp.CheckpointManagerOptions(read_only=True, create=False,
                                                   save_interval_steps=0))
        else:
          self._params_reader.reload()  # the steps saved since
        restored = self._params_reader.restore(
            step, args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item={'params': target_params},
                    restore_args=jax.tree_util.tree_map(
                        lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype),
                        {'params': target_params}),
                    partial_restore=True),
                meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except
      integrity.raise_if_unreadable(self._state_dir(step), e, f'{self.directory}/{step}', 'array')
      raise UserError(f'{self.directory}/{step}: cannot restore the parameters (does the model '
                      f'config match the checkpoint?): {integrity.first_line(e)}') from None
    integrity.verify(restored['meta'].get('integrity'), {'params': restored['state']['params']},
                     f'{self.directory}/{step}')
    return restored['state']['params']

  def _state_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step), 'state')

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are complete (`WriteError` when one failed)."""
    with self._write_errors(self._saving or 0):
      self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves (`WriteError` when one failed, unless already raised) and closes."""
    try:
      if not self._failed:
        self.wait()
    finally:
      with contextlib.suppress(Exception):  # after a failed save, orbax re-raises it here
        self._manager.close()
      if self._failed_step is not None:  # its writers have finished now (orbax's threads joined)
        self._remove_uncommitted(self._failed_step)
      if self._params_reader is not None:
        self._params_reader.close()


def _quiet_read_only(record: logging.LogRecord) -> bool:
  """Drops orbax's warnings that the read-only manager of `restore_params` is read-only (printed on
  stderr by `generate --model RUN_DIR`)."""
  return not record.getMessage().startswith(('Given directory is read only',
                                             'CheckpointManagerOptions.read_only=True'))


def _stall_commits(seconds: float) -> None:
  """The `STALL_ENV` test hook: delays orbax's commit (the rename of the finished temporary step
  directory, in the background thread of an asynchronous save)."""
  import asyncio  # pylint: disable=g-import-not-at-top
  from orbax.checkpoint._src.path import atomicity  # pylint: disable=g-import-not-at-top
  cls = atomicity.AtomicRenameTemporaryPath
  if getattr(cls.finalize, 'stalled', False):
    return
  original = cls.finalize

  async def finalize(self):
    final = str(self.get_final())
    with open(os.path.join(os.path.dirname(os.path.dirname(final)),
                           f'save_stall_{os.path.basename(final)}'), 'w'):
      pass
    await asyncio.sleep(seconds)
    await original(self)

  finalize.stalled = True
  cls.finalize = finalize
