"""`--param-dtype bfloat16`: parameters cast once at load (`checkpoints/param_dtype.py`).

With float32 parameters and bfloat16 activations the decode loop's body converts every kernel on
every step; with cast parameters it converts none, and the tokens and logits are bit-identical.
"""

import re

import jax
import numpy as np
import pytest

from gqa_spec.checkpoints import param_dtype
from gqa_spec.decoding import autoregressive
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from tests.decoding.conftest import INPUTS, MAX_LEN, model_and_params

# `stablehlo.convert %iterArg_N : (tensor<SHAPExFROM>) -> tensor<SHAPExTO>`: a conversion of a
# value the while loop carries (the parameters ride in the decoder state).
_LOOP_CONVERT = re.compile(r'stablehlo\.convert %iterArg\w* : \(tensor<([\dx]+)x(\w+)>\) -> '
                           r'tensor<[\dx]+x(\w+)>')


def _loop_param_converts(decoder, state, param_shapes):
  text = autoregressive.decode.lower(decoder, state, jax.random.PRNGKey(0),
                                     max_decode_len=MAX_LEN).as_text()
  assert 'stablehlo.while' in text  # %iterArg names exist only inside a while loop's regions
  return [(shape, a, b) for shape, a, b in _LOOP_CONVERT.findall(text) if shape in param_shapes]


def test_cast_params_convert_nothing_in_the_loop_and_decode_identically():
  base, params = model_and_params(2)  # float32 parameters (the other decoding tests' model)
  model = Transformer(base.config.replace(dtype='bfloat16'))
  config, cast = param_dtype.cast(model.config, params, 'bfloat16')
  assert config.param_dtype == 'bfloat16'
  dtypes = {'/'.join(k.key for k in path): x.dtype
            for path, x in jax.tree_util.tree_leaves_with_path(cast)}
  assert dtypes.pop('decoder/logits_dense/kernel') == np.float32  # computes in float32
  assert set(dtypes.values()) == {np.dtype(jax.numpy.bfloat16)}
  shapes = {'x'.join(map(str, x.shape)) for x in jax.tree_util.tree_leaves(params)}
  decoder = T5Decoder(model)
  results = {}
  for name, p in (('float32', params), ('bfloat16', cast)):
    state = decoder.init(p, INPUTS, MAX_LEN + 1)
    results[name] = (_loop_param_converts(decoder, state, shapes),
                     autoregressive.decode(decoder, state, jax.random.PRNGKey(0),
                                           max_decode_len=MAX_LEN))
  f32_converts, f32_out = results['float32']
  bf16_converts, bf16_out = results['bfloat16']
  # The control: with float32 parameters the body converts the decoder's kernels each step (the
  # detector sees them); with cast parameters it converts no parameter at all.
  kernels = {'x'.join(map(str, x.shape)) for path, x in jax.tree_util.tree_leaves_with_path(
      params['decoder']) if path[-1].key == 'kernel' and path[0].key != 'logits_dense'}
  assert kernels and kernels <= {shape for shape, _, _ in f32_converts}
  assert all(c[1:] == ('f32', 'bf16') for c in f32_converts)
  assert bf16_converts == []
  np.testing.assert_array_equal(np.asarray(bf16_out.sequences), np.asarray(f32_out.sequences))
  np.testing.assert_array_equal(np.asarray(bf16_out.lengths), np.asarray(f32_out.lengths))


def test_only_floating_parameters_are_cast_and_bad_dtypes_are_user_errors():
  config = T5Config(vocab_size=8, emb_dim=4)
  params = {'a': np.ones((2,), np.float32), 'steps': np.ones((2,), np.int32)}
  cast = param_dtype.cast(config, params, 'bfloat16')[1]
  assert cast['a'].dtype == jax.numpy.bfloat16 and cast['steps'].dtype == np.int32
  with pytest.raises(UserError, match='--param-dtype must be one of float32, bfloat16'):
    param_dtype.cast(config, params, 'float16')
  assert param_dtype.cast(config, params, None) == (config, params)
