"""Train-state checkpoints carry fingerprints that every restore verifies; damage is one line naming
the checkpoint and the array; checkpoints written before the record existed restore with a note. (Sharded arrays, saved on one
mesh and verified on restore into another: tests/training/test_sharding.py.)"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.checkpoints import integrity
from gqa_spec.checkpoints import manager
from gqa_spec.errors import UserError
from gqa_spec.training.train_step import TrainState


def _state():
  rng = np.random.default_rng(0)
  params = {'decoder': {'kernel': jnp.asarray(rng.standard_normal((64, 48)), jnp.float32),
                        'scale': jnp.asarray(rng.standard_normal(48), jnp.bfloat16)},
            'embedding': jnp.asarray(rng.standard_normal((96, 32)), jnp.float32)}
  opt_state = ({'mu': jax.tree.map(jnp.zeros_like, params)}, jnp.asarray(7, jnp.int32))
  return TrainState(step=jnp.asarray(5, jnp.int32), params=params, opt_state=opt_state)


def _target(state):
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return manager.abstract_with_shardings(jax.eval_shape(lambda: state),
                                         jax.tree.map(lambda _: device, state))


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
  run = str(tmp_path_factory.mktemp('run'))
  state = _state()
  ckpt = manager.Checkpointer(run, save_period=5, asynchronous=True)
  assert ckpt.save(5, state, {'data_start_step': 0})
  ckpt.close()
  return run, state


def _copy(saved, tmp_path):
  run = str(tmp_path / 'run')
  shutil.copytree(saved[0], run)
  return run


def _meta_path(run):
  return os.path.join(run, 'checkpoints', '5', 'meta', 'metadata')


def test_fingerprint_detects_every_single_bit_flip_and_moved_elements():
  x = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
  base = integrity.fingerprints({'x': x})['x']['fingerprint']
  words = x.view(np.uint32)
  for index in [(0, 0), (2, 3), (4, 6)]:
    for bit in range(32):
      flipped = words.copy()
      flipped[index] ^= np.uint32(1 << bit)
      assert integrity.fingerprints({'x': flipped.view(np.float32)})['x']['fingerprint'] != base
  assert integrity.fingerprints({'x': x.T.copy().reshape(5, 7)})['x']['fingerprint'] != base
  swapped = x.copy()
  swapped[[0, 1]] = swapped[[1, 0]]
  assert integrity.fingerprints({'x': swapped})['x']['fingerprint'] != base


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16', 'int32', 'uint8', 'bool'])
def test_numpy_and_xla_give_the_same_fingerprint(dtype):
  # CPU arrays are summed with numpy, others by XLA where their shards live: the same number.
  # (XLA over a 2x4 mesh: tests/training/test_sharding.py.)
  rng = np.random.default_rng(2)
  values = [rng.standard_normal((33, 7)) * 100, rng.standard_normal(5), rng.standard_normal(())]
  arrays = [jnp.asarray(v > 0 if dtype == 'bool' else v).astype(dtype) for v in values]
  on_device = jax.device_get(integrity._device_fingerprints(arrays))  # pylint: disable=protected-access
  assert [int(v) for v in on_device] == [
      integrity._host_fingerprint(x) for x in arrays]  # pylint: disable=protected-access


def test_round_trip_verifies_and_meta_hides_the_record(saved, caplog, tmp_path):
  state = saved[1]
  run = _copy(saved, tmp_path)  # this test saves a step 6
  ckpt = manager.Checkpointer(run)
  restored, meta = ckpt.restore(5, _target(state))
  assert meta == {'data_start_step': 0}
  assert ckpt.restore_meta(5) == {'data_start_step': 0}
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  params = ckpt.restore_params(5, _target(state).params)  # after a full restore, by one manager
  jax.tree.map(np.testing.assert_array_equal, params, state.params)
  restored, _ = ckpt.restore(5, _target(state))  # and a full one after it
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  ckpt.save(6, state, {}, force=True)
  ckpt.wait()
  params = ckpt.restore_params(6, _target(state).params)  # a step saved since the last one
  jax.tree.map(np.testing.assert_array_equal, params, state.params)
  ckpt.close()
  assert 'cannot be verified' not in caplog.text
  record = json.load(open(_meta_path(run)))['integrity']
  assert record['algorithm'] == integrity.ALGORITHM
  assert set(record['arrays']) == {'step', 'params/decoder/kernel', 'params/decoder/scale',
                                   'params/embedding', 'opt_state/0/mu/decoder/kernel',
                                   'opt_state/0/mu/decoder/scale', 'opt_state/0/mu/embedding',
                                   'opt_state/1'}


def _flip(run, every):
  data = os.path.join(run, 'checkpoints', '5', 'state', 'ocdbt.process_0', 'd')
  path = max((os.path.join(data, n) for n in os.listdir(data)), key=os.path.getsize)
  raw = bytearray(open(path, 'rb').read())
  for i in range(100, len(raw), every):
    raw[i] ^= 0xff
  open(path, 'wb').write(bytes(raw))


@pytest.mark.parametrize('every', [5000, 50])
def test_flipped_bytes_name_the_checkpoint_and_the_array(saved, tmp_path, capfd, every):
  # Bytes flipped in the largest data file: either data that still decompresses (its fingerprint
  # differs) or a compressed chunk that no longer does (orbax's read fails); both name the array.
  run = _copy(saved, tmp_path)
  _flip(run, every)
  for restore in ['restore', 'restore_params']:
    ckpt = manager.Checkpointer(run)
    target = _target(saved[1])
    with pytest.raises(UserError, match=f'{run}/checkpoints/5: array [\\w/]+ is corrupt') as info:
      if restore == 'restore':
        ckpt.restore(5, target)
      else:
        ckpt.restore_params(5, target.params)
    assert '\n' not in str(info.value)
    ckpt.close()
  import gc  # pylint: disable=g-import-not-at-top
  gc.collect()
  assert 'never retrieved' not in capfd.readouterr().err


def test_a_changed_fingerprint_names_the_array(saved, tmp_path):
  run = _copy(saved, tmp_path)
  meta = json.load(open(_meta_path(run)))
  meta['integrity']['arrays']['params/embedding']['fingerprint'] = '00000000'
  json.dump(meta, open(_meta_path(run), 'w'))
  ckpt = manager.Checkpointer(run)
  with pytest.raises(UserError, match='array params/embedding is corrupt .fingerprint [0-9a-f]{8}, '
                     'saved 00000000.'):
    ckpt.restore(5, _target(saved[1]))
  ckpt.close()


def test_checkpoint_without_a_record_restores_with_a_note(saved, tmp_path, caplog):
  run = _copy(saved, tmp_path)
  meta = json.load(open(_meta_path(run)))
  del meta['integrity']  # as written before the record existed
  json.dump(meta, open(_meta_path(run), 'w'))
  ckpt = manager.Checkpointer(run)
  restored, _ = ckpt.restore(5, _target(saved[1]))
  ckpt.close()
  jax.tree.map(np.testing.assert_array_equal, restored, saved[1])
  assert 'cannot be verified' in caplog.text
