"""Pending decode calls (`decode_cache.score_tokens`, `pad_pending`, `append_pending`): scoring k
tokens without writing, then writing, is `decode_tokens`, in both layer layouts."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.models import decode_cache
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

TINY = T5Config(vocab_size=61, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48,
                num_encoder_layers=1, num_decoder_layers=2)
L = 12


@functools.lru_cache(maxsize=None)
def _setup(scan_layers: bool, dtype: str):
  """A model, its parameters and a cache whose rows hold 3 and 5 tokens (ragged indexes)."""
  model = Transformer(TINY.replace(scan_layers=scan_layers, dtype=dtype))
  rng = np.random.default_rng(0)
  enc = jnp.asarray(rng.integers(2, 61, (2, 6)), jnp.int32).at[1, 4:].set(0)
  dec = jnp.asarray(rng.integers(2, 61, (2, 5)), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), enc, dec, jnp.ones_like(dec),
                      enable_dropout=False)['params']
  encoded = model.apply({'params': params}, enc, method=Transformer.encode)
  cache = decode_cache.init_decode_cache(model, params, encoded, enc, L)
  _, cache = decode_cache.decode_tokens(model, params, cache, dec)
  cache = decode_cache.set_cache_index(cache, jnp.array([3, 5]))  # row 0 forgets 2 tokens
  return model, params, cache


decode = jax.jit(decode_cache.decode_tokens, static_argnames='model')
score = jax.jit(decode_cache.score_tokens, static_argnames='model')
append = jax.jit(decode_cache.append_pending)
score_hidden = jax.jit(functools.partial(decode_cache.score_tokens, return_hidden=True),
                       static_argnames='model')
decode_hidden = jax.jit(decode_cache.decode_tokens_with_hidden, static_argnames='model')


def _assert_caches_close(got, want, atol):
  flat_got = dict(jax.tree_util.tree_flatten_with_path(got)[0])
  for path, value in jax.tree_util.tree_flatten_with_path(want)[0]:
    np.testing.assert_allclose(np.asarray(flat_got[path], np.float32),
                               np.asarray(value, np.float32), atol=atol,
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize('scan_layers,dtype', [(False, 'float32'), (True, 'float32'),
                                               (False, 'bfloat16')])
@pytest.mark.parametrize('tree', [False, True])
def test_score_then_append_is_decode_tokens(scan_layers, dtype, tree):
  model, params, cache = _setup(scan_layers, dtype)
  tokens = jnp.array([[7, 8, 9, 10], [11, 12, 13, 14]], jnp.int32)
  positions = mask = None
  if tree:  # a token tree: root, two children of it, a grandchild under the second
    positions = jnp.array([[3, 4, 4, 5], [5, 6, 6, 7]], jnp.int32)
    mask = jnp.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], bool)[None]
  want_logits, want_cache = decode(model, params, cache, tokens, positions, mask)
  logits, pending = score(model, params, cache, tokens, positions, mask)
  # The same keys in another order: the softmax's sum may round differently (bf16 activations).
  tol = 2e-5 if dtype == 'float32' else 5e-2
  np.testing.assert_allclose(logits, want_logits, atol=tol, rtol=tol)
  assert np.abs(np.asarray(want_logits)).max() > 10 * tol  # the logits are not all near zero
  assert set(pending) == {'decoder'} and pending['decoder']['positions'].shape == (2, 4)
  # Written, the cache decode_tokens left: the same slots, positions and index; the K/V of layers
  # after the first went through the reordered softmax.
  got_cache = append(cache, pending)
  np.testing.assert_array_equal(decode_cache.cache_index(got_cache), [7, 9])
  _assert_caches_close(got_cache, want_cache, tol)
  # The cache the pending call read is unchanged: a second score gives the same logits.
  again, _ = score(model, params, cache, tokens, positions, mask)
  np.testing.assert_array_equal(again, logits)
  if dtype == 'float32' and not tree:  # with the hidden states (Chimera's calls): the same pass
    hidden_logits, hidden, pending_h = score_hidden(model, params, cache, tokens)
    _, want_hidden, _ = decode_hidden(model, params, cache, tokens)
    np.testing.assert_array_equal(hidden_logits, logits)
    np.testing.assert_allclose(hidden, want_hidden, atol=tol)
    _assert_caches_close(pending_h, pending, 0.0)


@pytest.mark.parametrize('scan_layers', [False, True])
def test_padded_pending_rolled_back_decodes_as_unpadded(scan_layers):
  """`pad_pending` to a wider width, written, then the index moved back to the k tokens: the
  next call sees what an unpadded write left (the padding's zeros sit in masked slots)."""
  model, params, cache = _setup(scan_layers, 'float32')
  tokens = jnp.array([[7, 8], [11, 12]], jnp.int32)
  _, pending = score(model, params, cache, tokens)
  padded = decode_cache.pad_pending(pending, 5)
  assert padded['decoder']['positions'].shape == (2, 5)
  plain = append(cache, pending)
  wide = decode_cache.set_cache_index(append(cache, padded), decode_cache.cache_index(plain))
  nxt = jnp.array([[3], [4]], jnp.int32)
  np.testing.assert_array_equal(decode(model, params, wide, nxt)[0],
                                decode(model, params, plain, nxt)[0])
  with pytest.raises(ValueError, match='cannot pad 2 pending tokens to 1'):
    decode_cache.pad_pending(pending, 1)


def test_pending_calls_refuse_what_they_cannot_score():
  model, params, cache = _setup(False, 'float32')
  tokens = jnp.array([[7, 8], [11, 12]], jnp.int32)
  with pytest.raises(ValueError, match=r'\[batch, k, k\] attention mask'):
    decode_cache.score_tokens(model, params, cache, tokens, None, jnp.ones((2, 2, L), bool))
  with pytest.raises(ValueError, match='reads the cache: create it first'):
    model.apply({'params': params}, None, None, tokens, decode=True, pending=True,
                method=Transformer.decode, mutable=['pending'])
