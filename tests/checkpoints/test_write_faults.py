"""A full disk on the write path (issue 34), by fault injection: a failed train-state save is one
line naming the step, the errno and the latest complete checkpoint, which stays restorable; the
failed step leaves no directory; files and native checkpoints are written whole or not at all."""

import errno
import json
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.path import async_path

from gqa_spec import atomic, cli
from gqa_spec.checkpoints import manager, native
from gqa_spec.models.config import T5Config

STATE = {'w': jnp.arange(8, dtype=jnp.float32)}


def _full_disk(*args, **kwargs):
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_failed_save_is_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capfd):
  ckpt = manager.Checkpointer(str(tmp_path), save_period=1, keep=3)
  ckpt.save(1, STATE, {'note': 1})
  ckpt.wait()
  # Orbax's own file writes (the meta item, the commit's metadata) meet a full disk. A writer of
  # the same save that is still running (as tensorstore's threads can be) creates the failed step's
  # temporary directory again 0.1 s after the error: CI once found it left behind that way.
  late_writer = []

  def full_disk_and_a_late_writer(path, *args, **kwargs):
    if not late_writer:
      late_writer.append(threading.Timer(0.1, os.makedirs, (tmp_path / 'checkpoints' /
                                                           '2.orbax-checkpoint-tmp' / 'late',)))
      late_writer[0].start()
    _full_disk()

  monkeypatch.setattr(async_path, 'write_text', full_disk_and_a_late_writer)
  monkeypatch.setattr(async_path, 'write_bytes', full_disk_and_a_late_writer)
  message = (f'{tmp_path}/checkpoints/2: cannot save the checkpoint: No space left on device '
             '(ENOSPC); nothing was written there, and the latest complete checkpoint is step 1 '
             '(the same command resumes from it)')
  with pytest.raises(atomic.WriteError) as raised:
    ckpt.save(2, jax.tree.map(lambda x: x + 1, STATE), {'note': 2})
    ckpt.wait()
  assert str(raised.value) == message
  with pytest.raises(atomic.WriteError):  # every later save says the same, at once
    ckpt.save(3, STATE, {'note': 3})
  ckpt.close()  # does not raise again
  late_writer[0].join()
  monkeypatch.undo()
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['1']  # no uncommitted step 2 left
  assert 'Traceback' not in capfd.readouterr().err  # orbax's and asyncio's noise filtered
  again = manager.Checkpointer(str(tmp_path), save_period=1)
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=x.sharding), STATE)
  state, meta = again.restore(again.latest_step(), target)
  np.testing.assert_array_equal(state['w'], STATE['w'])
  assert meta == {'note': 1}
  again.close()


def test_atomic_files_leave_the_old_file_or_nothing(tmp_path, monkeypatch):
  path = tmp_path / 'out.jsonl'
  path.write_text('old\n')
  real_write = os.fsync

  def failing_fsync(fd):
    raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

  monkeypatch.setattr(os, 'fsync', failing_fsync)
  with pytest.raises(atomic.WriteError, match=rf'^{path}: cannot write: Disk quota exceeded '
                     r'\(EDQUOT\); nothing was written there$'):
    with atomic.open_for_write(str(path)) as f:
      f.write('new, half written')
  monkeypatch.setattr(os, 'fsync', real_write)
  assert path.read_text() == 'old\n' and os.listdir(tmp_path) == ['out.jsonl']
  with pytest.raises(KeyboardInterrupt):  # a signal while writing: the same
    with atomic.open_for_write(str(tmp_path / 'new.json')) as f:
      f.write('{')
      raise KeyboardInterrupt
  assert os.listdir(tmp_path) == ['out.jsonl']
  atomic.write_json(str(path), {'a': 1})
  assert json.loads(path.read_text()) == {'a': 1} and os.listdir(tmp_path) == ['out.jsonl']


def test_a_native_save_that_fails_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
  config = T5Config(vocab_size=32, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                    num_encoder_layers=1, num_decoder_layers=1)
  params = jax.tree.map(lambda x: jnp.full(x.shape, 0.5, x.dtype),  # no init to compile
                        native.abstract_params(config))
  path = str(tmp_path / 'best')
  native.save_checkpoint(path, config, params)
  before = sorted(os.listdir(path))
  monkeypatch.setattr(atomic.json, 'dump', _full_disk)  # integrity.json meets a full disk
  with pytest.raises(atomic.WriteError, match=(
      rf'^{path}: cannot write: No space left on device \(ENOSPC\); nothing was written there$')):
    native.save_checkpoint(path, config, jax.tree.map(lambda x: x + 1, params), overwrite=True)
  monkeypatch.undo()
  assert sorted(os.listdir(tmp_path)) == ['best'] and sorted(os.listdir(path)) == before
  _, loaded, _ = native.load_checkpoint(path)
  np.testing.assert_array_equal(loaded['decoder']['logits_dense']['kernel'],
                                params['decoder']['logits_dense']['kernel'])
  # Through the CLI, a failed output is one line and exit status 2.
  monkeypatch.setattr(atomic.json, 'dump', _full_disk)
  code = cli.main(['export-hf', path, str(tmp_path / 'hf')])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and err == [f'gqa-spec: error: {tmp_path}/hf: cannot write: No space left on '
                               'device (ENOSPC); nothing was written there']
  assert sorted(os.listdir(tmp_path)) == ['best']


def test_any_other_os_error_is_one_line_naming_path_and_errno(tmp_path, monkeypatch, capsys):
  from gqa_spec import status  # pylint: disable=g-import-not-at-top

  def appending_to_a_full_disk(directory):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(directory, 'log.jsonl'))

  monkeypatch.setattr(status, 'status', appending_to_a_full_disk)
  assert cli.main(['status', str(tmp_path)]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f'gqa-spec: error: {tmp_path}/log.jsonl: No space left on device (ENOSPC)']


def test_atomic_directories_replace_whole_or_not_at_all(tmp_path):
  target = tmp_path / 'export'
  for name in ('a', 'b'):  # a trailing slash names the directory, not a place inside it
    with atomic.directory(f'{target}/') as tmp:
      (tmp_path / tmp / name).write_text(name)
  assert os.listdir(target) == ['b'] and os.listdir(tmp_path) == ['export']
  with pytest.raises(RuntimeError):
    with atomic.directory(str(target)) as tmp:
      (tmp_path / tmp / 'c').write_text('half')
      raise RuntimeError('the caller failed while filling it')
  assert os.listdir(target) == ['b'] and os.listdir(tmp_path) == ['export']
