"""MHA -> GQA/MQA conversion: mean / first / random semantics, identity, and bad head counts."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.convert import convert_params, group_kv_heads, repeat_kv_heads
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

# Six heads, so GQA-2 groups hold three heads (a mean that is not a power-of-two division).
MHA = T5Config(vocab_size=50, emb_dim=24, num_heads=6, head_dim=4, mlp_dim=32,
               num_encoder_layers=1, num_decoder_layers=2)
KV = [('decoder', f'layers_{i}', a, p, 'kernel') for i in range(2)
      for a in ('self_attention', 'encoder_decoder_attention') for p in ('key', 'value')]


@functools.lru_cache(maxsize=None)
def _init(config, seed=0):
  """The parameters of `config` (the same arrays for the same arguments: JAX arrays are immutable,
  and every test builds new trees around them)."""
  tokens = jnp.ones((1, 3), jnp.int32)
  # Jitted: one compilation instead of one per eager op keeps the suite fast on CPU.
  return jax.jit(lambda: Transformer(config).init(jax.random.PRNGKey(seed), tokens, tokens, tokens,
                                                  enable_dropout=False)['params'])()


def _get(params, path):
  for key in path:
    params = params[key]
  return np.asarray(params)


@functools.lru_cache(maxsize=None)
def _apply(config):
  """`config`'s forward pass on a fixed padded batch, compiled once per config."""
  rng = np.random.default_rng(0)
  enc = jnp.asarray(rng.integers(2, 50, (2, 7)), jnp.int32).at[1, 4:].set(0)
  dec = jnp.asarray(rng.integers(2, 50, (2, 5)), jnp.int32).at[:, 0].set(0)
  return jax.jit(lambda p: Transformer(config).apply({'params': p}, enc, dec, jnp.ones_like(dec),
                                                     enable_dropout=False))


def _logits(config, params):
  return np.asarray(_apply(config)(params))


def _non_kv_leaves(params):
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {jax.tree_util.keystr(k): v for k, v in flat
          if not (k[0].key == 'decoder' and k[-2].key in ('key', 'value'))}


def test_group_and_repeat_are_inverse():
  kernel = np.random.default_rng(0).normal(size=(5, 2 * 4)).astype(np.float32)  # [d, G*hd]
  repeated = repeat_kv_heads(kernel, head_dim=4, num_heads=6)  # [d, 6*hd]
  assert repeated.shape == (5, 24)
  np.testing.assert_array_equal(repeated[:, 8:12], kernel[:, :4])  # head 2 is in group 0
  np.testing.assert_array_equal(repeated[:, 12:16], kernel[:, 4:])  # head 3 is in group 1
  for method in ('mean', 'first'):
    np.testing.assert_array_equal(group_kv_heads(repeated, 4, 2, method), kernel)


@pytest.mark.parametrize('kv_heads', [3, 2, 1])
def test_mean_is_lossless_when_group_heads_are_equal(kv_heads):
  params, grouped = _init(MHA), {}
  for path in KV:  # make every head of a group identical: an MHA model that is really GQA
    grouped[path] = _get(params, path)[:, :kv_heads * MHA.head_dim]  # [d, G*hd]
    params = _replace(params, path, repeat_kv_heads(grouped[path], MHA.head_dim, MHA.num_heads))
  converted, config = convert_params(params, MHA, kv_heads, 'mean')
  assert config == MHA.replace(num_kv_heads=kv_heads)
  for path in KV:
    np.testing.assert_array_equal(_get(converted, path), grouped[path])
  np.testing.assert_allclose(_logits(config, converted), _logits(MHA, params), atol=1e-5, rtol=0)


def _replace(params, path, value):
  if len(path) == 1:
    return {**params, path[0]: value}
  return {**params, path[0]: _replace(params[path[0]], path[1:], value)}


def test_mean_and_first_pool_consecutive_heads():
  params = _init(MHA)
  mean, _ = convert_params(params, MHA, 2, 'mean')
  first, config = convert_params(params, MHA, 2, 'first')
  for path in KV:
    heads = _get(params, path).reshape(24, 6, 4)  # [d, H, hd]
    mean64 = heads.reshape(24, 2, 3, 4).astype(np.float64).mean(axis=2)  # [d, G, hd]
    np.testing.assert_array_equal(_get(mean, path).reshape(24, 2, 4), mean64.astype(np.float32))
    np.testing.assert_array_equal(_get(first, path).reshape(24, 2, 4), heads[:, [0, 3]])
  assert _logits(config, first).shape == (2, 5, 50)
  for converted in (mean, first):
    before, after = _non_kv_leaves(params), _non_kv_leaves(converted)
    assert before.keys() == after.keys()
    assert all(after[k] is before[k] for k in before)  # everything else is untouched


def test_random_is_seeded_fresh_init():
  params = _init(MHA)
  a, config = convert_params(params, MHA, 1, 'random', seed=3)
  b, _ = convert_params(params, MHA, 1, 'random', seed=3)
  c, _ = convert_params(params, MHA, 1, 'random', seed=4)
  for path in KV:
    kernel = _get(a, path)
    assert kernel.shape == (24, 4) and kernel.dtype == np.float32
    np.testing.assert_array_equal(kernel, _get(b, path))
    assert not np.array_equal(kernel, _get(c, path))
    assert not np.allclose(kernel, _get(params, path)[:, :4])
    # The model's own initialiser: truncated normal with variance 1 / fan_in.
    assert 0.5 / np.sqrt(24) < kernel.std() < 1.5 / np.sqrt(24)
  assert _non_kv_leaves(a).keys() == _non_kv_leaves(params).keys()
  assert np.isfinite(_logits(config, a)).all()


def test_same_head_count_is_identity():
  params = _init(MHA)
  converted, config = convert_params(params, MHA, 6, 'mean')
  assert converted is params and config == MHA


def test_gqa_to_mqa_pools_groups():
  gqa = MHA.replace(num_kv_heads=2)
  params = _init(gqa)
  mqa, config = convert_params(params, gqa, 1, 'mean')
  assert config.num_kv_heads == 1
  for path in KV:
    np.testing.assert_allclose(_get(mqa, path), _get(params, path).reshape(24, 2, 4).mean(axis=1),
                               rtol=1e-6)


@pytest.mark.parametrize('kv_heads,method,match', [
    (4, 'mean', 'must be a positive divisor of the number of heads 6'),
    (0, 'first', 'must be a positive divisor'),
    (2, 'median', 'unknown conversion method'),
])
def test_bad_arguments(kv_heads, method, match):
  with pytest.raises(UserError, match=match):
    convert_params(_init(MHA), MHA, kv_heads, method)


def test_cannot_pool_into_more_groups():
  gqa = MHA.replace(num_kv_heads=2)
  with pytest.raises(UserError, match='cannot pool 2 K/V heads into 3 groups'):
    convert_params(_init(gqa), gqa, 3, 'mean')
