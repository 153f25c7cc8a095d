"""T5X legacy checkpoints: a checkpoint written here in t5x's exact layout loads unchanged."""

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
from flax import serialization

from gqa_spec.checkpoints import t5x_legacy
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

TINY = T5Config(vocab_size=40, emb_dim=16, num_heads=4, head_dim=4, mlp_dim=24,
                num_encoder_layers=1, num_decoder_layers=2)


def _flatten(tree, prefix=()):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _flatten(value, prefix + (key,))
    else:
      yield prefix + (key,), value


def _unflatten(flat):
  tree = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def write_t5x_checkpoint(model_dir, step, params, dtype=np.float32, inline=('scale',)):
  """Writes `params` as t5x's `Checkpointer.save` does (format version 3).

  Parameters whose last name is in `inline` go into the msgpack file itself (as t5x does for
  unpartitioned arrays); all others into gzip zarr TensorStores named `target.<path with dots>`,
  referenced from the msgpack by their spec's JSON with a relative path. An Adafactor-like
  `state` (step + factored second moments, also in TensorStores) rides along.
  """
  ckpt_dir = os.path.join(model_dir, f'checkpoint_{step}')
  os.makedirs(ckpt_dir)

  def written(name, value):
    value = np.asarray(value).astype(dtype)
    if name.split('/')[-1] in inline:
      return value
    spec = {'driver': 'zarr', 'dtype': jnp.dtype(dtype).name,
            'kvstore': {'driver': 'file', 'path': name.replace('/', '.')},
            'metadata': {'compressor': {'id': 'gzip'}, 'shape': list(value.shape),
                         'chunks': list(value.shape)}}
    absolute = dict(spec, kvstore={'driver': 'file', 'path': os.path.join(ckpt_dir, name.replace('/', '.'))})
    ts.open(absolute, create=True, open=True).result().write(value).result()
    return ts.Spec(spec).to_json()  # what flax serialises for a ts.Spec (orbax registration)

  target = {path: written('/'.join(('target',) + path), v) for path, v in _flatten(params)}
  param_states = {}
  for path, value in _flatten(params):
    name = '/'.join(('state', 'param_states') + path)
    param_states[path + ('v_row',)] = written(name + '/v_row', np.ones(value.shape[:1]))
    param_states[path + ('v_col',)] = np.zeros((0,), np.float32)
  optimizer = {'target': _unflatten(target),
               'state': {'step': np.asarray(step, np.int32),
                         'param_states': _unflatten(param_states)}}
  with open(os.path.join(ckpt_dir, 'checkpoint'), 'wb') as f:
    f.write(serialization.msgpack_serialize({'version': 3, 'optimizer': optimizer}))
  return ckpt_dir


@pytest.fixture(scope='module')
def params():
  tokens = jnp.ones((1, 3), jnp.int32)
  return jax.tree.map(np.asarray, Transformer(TINY).init(
      jax.random.PRNGKey(0), tokens, tokens, tokens, enable_dropout=False)['params'])


def test_round_trip(params, tmp_path):
  ckpt_dir = write_t5x_checkpoint(str(tmp_path), 1000, params)
  assert os.path.isdir(os.path.join(ckpt_dir, 'target.decoder.layers_0.self_attention.key.kernel'))
  # The model dir, the step dir and the msgpack file all name the same checkpoint.
  for path in (str(tmp_path), ckpt_dir, os.path.join(ckpt_dir, 'checkpoint')):
    loaded = t5x_legacy.load_t5x(path, TINY)
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_latest_step_is_chosen(params, tmp_path):
  write_t5x_checkpoint(str(tmp_path), 5, jax.tree.map(np.zeros_like, params))
  write_t5x_checkpoint(str(tmp_path), 20, params)
  os.makedirs(tmp_path / 'checkpoint_30')  # an unfinished save has no msgpack file
  loaded = t5x_legacy.load_t5x(str(tmp_path), TINY)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_bfloat16_checkpoint_is_cast_to_the_config_dtype(params, tmp_path):
  write_t5x_checkpoint(str(tmp_path), 1, params, dtype=ml_dtypes.bfloat16)
  raw = t5x_legacy.read_target(str(tmp_path))
  assert raw['decoder']['layers_0']['mlp']['wo']['kernel'].dtype == ml_dtypes.bfloat16
  loaded = t5x_legacy.load_t5x(str(tmp_path), TINY)
  expected = jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32), params)
  jax.tree.map(np.testing.assert_array_equal, loaded, expected)
  as_bf16 = t5x_legacy.load_t5x(str(tmp_path), TINY.replace(param_dtype='bfloat16'))
  assert {x.dtype for x in jax.tree.leaves(as_bf16)} == {np.dtype(ml_dtypes.bfloat16)}


def test_shape_mismatch_names_the_parameter(params, tmp_path):
  write_t5x_checkpoint(str(tmp_path), 1, params)
  with pytest.raises(UserError, match=r'parameter decoder/layers_0/mlp/wi_0/kernel has shape '
                     r'\(16, 24\), the model config needs \(16, 32\)'):
    t5x_legacy.load_t5x(str(tmp_path), TINY.replace(mlp_dim=32))
  with pytest.raises(UserError, match='decoder/layers_2/.* is missing'):
    t5x_legacy.load_t5x(str(tmp_path), TINY.replace(num_decoder_layers=3))


def test_bad_checkpoints(params, tmp_path):
  with pytest.raises(UserError, match='no T5X checkpoint file'):
    t5x_legacy.load_t5x(str(tmp_path), TINY)
  ckpt_dir = write_t5x_checkpoint(str(tmp_path), 1, params)
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(os.path.join(ckpt_dir, 'target.encoder.layers_0.mlp.wo.kernel'))
  with pytest.raises(UserError, match='target/encoder/layers_0/mlp/wo/kernel: cannot read'):
    t5x_legacy.load_t5x(ckpt_dir, TINY)
  with open(os.path.join(ckpt_dir, 'checkpoint'), 'wb') as f:
    f.write(b'\xc1 not msgpack')
  with pytest.raises(UserError, match='corrupt T5X msgpack checkpoint'):
    t5x_legacy.load_t5x(ckpt_dir, TINY)
  with open(os.path.join(ckpt_dir, 'checkpoint'), 'wb') as f:
    f.write(serialization.msgpack_serialize({'version': 3, 'optimizer': {'state': {}}}))
  with pytest.raises(UserError, match="no 'target'"):
    t5x_legacy.load_t5x(ckpt_dir, TINY)
