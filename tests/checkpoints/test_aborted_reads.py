"""What a failed orbax restore leaves behind stays quiet (`checkpoints.aborted_reads`): a damaged
checkpoint is one line of stderr from the CLI, and only orbax's aftermath is dropped."""

import asyncio
import json
import os
import subprocess
import sys
import types

from gqa_spec.checkpoints import aborted_reads, native
from tests.decoding.conftest import model_and_params


def test_a_damaged_checkpoint_is_one_line_of_stderr(tmp_path):
  # Before `aborted_reads`, this printed ~2,600 lines of tracebacks after the one-line error (12
  # runs in 12): tensorstore's reads calling back into orbax's closed event loop, orbax's read
  # coroutines raising when collected, asyncio's "Task exception was never retrieved".
  model, params = model_and_params(2)
  directory = str(tmp_path / 'ckpt')
  native.save_checkpoint(directory, model.config, params)
  data = os.path.join(directory, 'params', 'ocdbt.process_0', 'd')
  for path in (os.path.join(data, n) for n in os.listdir(data)):
    if os.path.getsize(path) > 1024:  # every data file, not the index (as test_native's)
      raw = bytearray(open(path, 'rb').read())
      for i in range(100, len(raw), 50):  # a damaged compressed chunk: orbax's read fails
        raw[i] ^= 0xff
      open(path, 'wb').write(bytes(raw))
  (tmp_path / 'in.jsonl').write_text(json.dumps({'input_ids': [5, 6, 7, 1]}) + '\n')
  result = subprocess.run(
      [sys.executable, '-m', 'gqa_spec', 'generate', '--model', directory,
       '--inputs', str(tmp_path / 'in.jsonl'), '--out', str(tmp_path / 'out.jsonl')],
      env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr[:3000]
  assert lines[0].startswith(f'gqa-spec: error: {directory}: parameter ') and (
      'its stored data cannot be read' in lines[0])  # the read failed: its aftermath was there


def _unraisable(value, traceback=None, obj=None):
  return types.SimpleNamespace(exc_type=type(value), exc_value=value, exc_traceback=traceback,
                               err_msg=None, object=obj)


def test_only_orbax_aftermath_is_recognised():
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(lambda: None)
  except RuntimeError as e:
    closed = e
  # Called from C (tensorstore's thread), the traceback starts in `call_soon_threadsafe`;
  # called from Python code, it starts in that code: someone else's bug, passed on.
  assert aborted_reads.is_aftermath(_unraisable(closed, closed.__traceback__.tb_next))
  assert not aborted_reads.is_aftermath(_unraisable(closed, closed.__traceback__))
  assert not aborted_reads.is_aftermath(
      _unraisable(RuntimeError('Event loop is closed'), closed.__traceback__.tb_next, obj=loop))
  assert not aborted_reads.is_aftermath(_unraisable(ValueError('x'), closed.__traceback__.tb_next))

  async def _read_array_index_and_device_put():  # same name as orbax's, but not orbax's file
    pass

  coroutine = _read_array_index_and_device_put()
  coroutine.close()
  assert not aborted_reads.is_aftermath(_unraisable(Exception('x'), obj=coroutine))
  from orbax.checkpoint._src.serialization import serialization  # pylint: disable=g-import-not-at-top
  read = serialization._read_array_index_and_device_put  # pylint: disable=protected-access
  code = read.__code__
  names = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
  orbax_read = read(*[None] * code.co_argcount, **dict.fromkeys(names))  # created, never run
  try:
    assert aborted_reads.is_aftermath(_unraisable(Exception('x'), obj=orbax_read))
  finally:
    orbax_read.close()


def test_a_never_retrieved_record_is_dropped_only_for_orbax_and_tensorstore_read_errors():
  never = aborted_reads._NeverRetrieved()  # pylint: disable=protected-access

  def record(error):
    return types.SimpleNamespace(getMessage=lambda: 'Task exception was never retrieved',
                                 exc_info=(type(error), error, None))

  assert not never.filter(record(Exception(
      'Encountered error while reading array index: (slice(0, 16, 1),). See full TensorStore')))
  assert not never.filter(record(ValueError(
      'FAILED_PRECONDITION: Error reading "encoder.layers_0.mlp.wi_0.kernel/0.0" in OCDBT database '
      'at local file "/tmp/ckpt/params/": ZSTD_decompressStream failed')))
  assert never.filter(record(ValueError('a task of the user')))
