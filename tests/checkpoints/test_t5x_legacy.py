"""T5X legacy checkpoints: a checkpoint written here in t5x's exact layout loads unchanged."""

import os

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import serialization

from gqa_spec.checkpoints import t5x_legacy
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config

TINY = T5Config(vocab_size=40, emb_dim=16, num_heads=4, head_dim=4, mlp_dim=24,
                num_encoder_layers=1, num_decoder_layers=2)


@pytest.fixture(scope='module')
def params(init_params):
  return init_params(TINY)


@pytest.fixture
def write_t5x_checkpoint(t5x_writer):
  return t5x_writer


def test_round_trip(params, write_t5x_checkpoint, tmp_path):
  ckpt_dir = write_t5x_checkpoint(str(tmp_path), 1000, params)
  assert os.path.isdir(os.path.join(ckpt_dir, 'target.decoder.layers_0.self_attention.key.kernel'))
  # The model dir, the step dir and the msgpack file all name the same checkpoint.
  for path in (str(tmp_path), ckpt_dir, os.path.join(ckpt_dir, 'checkpoint')):
    loaded = t5x_legacy.load_t5x(path, TINY)
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_latest_step_is_chosen(params, write_t5x_checkpoint, tmp_path):
  write_t5x_checkpoint(str(tmp_path), 5, jax.tree.map(np.zeros_like, params))
  write_t5x_checkpoint(str(tmp_path), 20, params)
  os.makedirs(tmp_path / 'checkpoint_30')  # an unfinished save has no msgpack file
  loaded = t5x_legacy.load_t5x(str(tmp_path), TINY)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_bfloat16_checkpoint_is_cast_to_the_config_dtype(params, write_t5x_checkpoint, tmp_path):
  write_t5x_checkpoint(str(tmp_path), 1, params, dtype=ml_dtypes.bfloat16)
  raw = t5x_legacy.read_target(str(tmp_path))
  assert raw['decoder']['layers_0']['mlp']['wo']['kernel'].dtype == ml_dtypes.bfloat16
  loaded = t5x_legacy.load_t5x(str(tmp_path), TINY)
  expected = jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32), params)
  jax.tree.map(np.testing.assert_array_equal, loaded, expected)
  as_bf16 = t5x_legacy.load_t5x(str(tmp_path), TINY.replace(param_dtype='bfloat16'))
  assert {x.dtype for x in jax.tree.leaves(as_bf16)} == {np.dtype(ml_dtypes.bfloat16)}


def test_shape_mismatch_names_the_parameter(params, write_t5x_checkpoint, tmp_path):
  write_t5x_checkpoint(str(tmp_path), 1, params)
  with pytest.raises(UserError, match=r'parameter decoder/layers_0/mlp/wi_0/kernel has shape '
                     r'\(16, 24\), the model config needs \(16, 32\)'):
    t5x_legacy.load_t5x(str(tmp_path), TINY.replace(mlp_dim=32))
  with pytest.raises(UserError, match='decoder/layers_2/.* is missing'):
    t5x_legacy.load_t5x(str(tmp_path), TINY.replace(num_decoder_layers=3))


def test_bad_checkpoints(params, write_t5x_checkpoint, tmp_path):
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
