"""The T5.1.1 model: grouped-query attention semantics, decode cache consistency, rollback, trees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.models import decode_cache as dc
from gqa_spec.models.attention import grouped_attention
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

TINY = T5Config(vocab_size=61, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48,
                num_encoder_layers=2, num_decoder_layers=2)
ATTENTION = {'mha': 4, 'gqa2': 2, 'mqa': 1}


def _batch(seed=0, batch=3, enc_len=9, dec_len=7, pad=True):
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, TINY.vocab_size, (batch, enc_len))
  if pad:  # padding in the encoder input
    enc[1, 6:] = 0
    enc[2, 3:] = 0
  dec = rng.integers(2, TINY.vocab_size, (batch, dec_len))
  dec[:, 0] = 0  # decoder start token
  return jnp.asarray(enc, jnp.int32), jnp.asarray(dec, jnp.int32)


def _init(config, seed=0):
  enc, dec = _batch()
  model = Transformer(config)
  params = model.init(jax.random.PRNGKey(seed), enc, dec, jnp.ones_like(dec),
                      enable_dropout=False)['params']
  return model, params


@pytest.fixture(scope='module', params=sorted(ATTENTION))
def model_and_params(request):
  return _init(TINY.replace(num_kv_heads=ATTENTION[request.param]))


def _teacher_forced(model, params, enc, dec):
  return model.apply({'params': params}, enc, dec, jnp.ones_like(dec), enable_dropout=False)


def _encode(model, params, enc):
  return model.apply({'params': params}, enc, method=Transformer.encode)


def test_heads_not_divisible_by_kv_heads_is_a_clear_error():
  with pytest.raises(ValueError, match='num_heads=6 is not divisible by num_kv_heads=4'):
    T5Config(num_heads=6, num_kv_heads=4)


def test_grouped_attention_with_g_equal_h_is_plain_multi_head_attention():
  rng = np.random.default_rng(0)
  b, q, k, h, d = 2, 3, 5, 4, 8
  query = rng.normal(size=(b, q, h, d)).astype(np.float32)
  key = rng.normal(size=(b, k, h, d)).astype(np.float32)
  value = rng.normal(size=(b, k, h, d)).astype(np.float32)
  bias = rng.normal(size=(1, h, q, k)).astype(np.float32)
  mask = rng.random((b, 1, q, k)) > 0.3
  mask[..., 0] = True
  # Reference multi-head attention, written out per head.
  logits = np.einsum('bqhd,bkhd->bhqk', query, key) + bias
  logits = np.where(mask, logits, -1e10)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  expected = np.einsum('bhqk,bkhd->bqhd', weights, value)
  got = grouped_attention(query[:, :, :, None], np.transpose(key, (0, 2, 3, 1)),
                          np.swapaxes(value, 1, 2), mask, bias)  # [b, q, G=h, R=1, d]
  np.testing.assert_allclose(np.asarray(got)[:, :, :, 0], expected, atol=1e-5)


@pytest.mark.parametrize('kv_heads', [1, 2])
def test_mha_with_kv_heads_duplicated_within_groups_equals_gqa(kv_heads):
  gqa_model, gqa_params = _init(TINY.replace(num_kv_heads=kv_heads), seed=1)
  mha_model = Transformer(TINY)
  per_group = TINY.num_heads // kv_heads

  def repeat_heads(kernel):  # [d, G * hd] -> [d, H * hd], each group's head repeated consecutively
    d = kernel.shape[0]
    k = kernel.reshape(d, kv_heads, 1, TINY.head_dim)
    return jnp.broadcast_to(k, (d, kv_heads, per_group, TINY.head_dim)).reshape(d, -1)

  mha_params = jax.tree_util.tree_map(lambda x: x, gqa_params)
  for i in range(TINY.num_decoder_layers):
    for attn in ('self_attention', 'encoder_decoder_attention'):
      for kv in ('key', 'value'):
        p = mha_params['decoder'][f'layers_{i}'][attn][kv]
        p['kernel'] = repeat_heads(p['kernel'])
  enc, dec = _batch(seed=2)
  np.testing.assert_allclose(_teacher_forced(mha_model, mha_params, enc, dec),
                             _teacher_forced(gqa_model, gqa_params, enc, dec), atol=1e-5)


def test_encoder_stays_multi_head_and_decoder_kv_shapes_follow_num_kv_heads():
  _, params = _init(TINY.replace(num_kv_heads=1))
  hd = TINY.head_dim
  assert params['encoder']['layers_0']['attention']['key']['kernel'].shape == (32, 4 * hd)
  for attn in ('self_attention', 'encoder_decoder_attention'):
    layer = params['decoder']['layers_1'][attn]
    assert layer['key']['kernel'].shape == (32, hd)
    assert layer['value']['kernel'].shape == (32, hd)
    assert layer['query']['kernel'].shape == (32, 4 * hd)
    assert layer['out']['kernel'].shape == (4 * hd, 32)


def test_cache_bytes_scale_with_kv_heads():
  enc, _ = _batch()
  sizes = {}
  for name, g in ATTENTION.items():
    model, params = _init(TINY.replace(num_kv_heads=g))
    cache = dc.init_decode_cache(model, params, _encode(model, params, enc), enc, 16)
    sizes[name] = dc.self_attention_kv_bytes(cache)
    cross = cache['decoder']['layers_0']['encoder_decoder_attention']['cached_key']
    assert cross.shape == (enc.shape[0], g, TINY.head_dim, enc.shape[1])  # keys are [b, G, d, S]
  assert sizes['mha'] == 2 * sizes['gqa2'] == 4 * sizes['mqa']


# One token at a time, and multi-token calls from an empty and a filled cache ([3, 4] and [7]
# assert nothing these two do not).
@pytest.mark.parametrize('chunks', [[1] * 7, [2, 1, 4]])
def test_incremental_decoding_matches_teacher_forcing(model_and_params, chunks):
  model, params = model_and_params
  enc, dec = _batch()
  expected = _teacher_forced(model, params, enc, dec)
  cache = dc.init_decode_cache(model, params, _encode(model, params, enc), enc, 12)
  got, start = [], 0
  for k in chunks:
    logits, cache = dc.decode_tokens(model, params, cache, dec[:, start:start + k])
    got.append(logits)
    start += k
  np.testing.assert_allclose(jnp.concatenate(got, axis=1), expected, atol=2e-5)
  np.testing.assert_array_equal(dc.cache_index(cache), [7, 7, 7])


def test_rollback_leaves_no_trace(model_and_params):
  model, params = model_and_params
  enc, dec = _batch()
  encoded = _encode(model, params, enc)
  clean = dc.init_decode_cache(model, params, encoded, enc, 12)
  _, clean = dc.decode_tokens(model, params, clean, dec[:, :3])
  expected, _ = dc.decode_tokens(model, params, clean, dec[:, 3:7])

  dirty = dc.init_decode_cache(model, params, encoded, enc, 12)
  _, dirty = dc.decode_tokens(model, params, dirty, dec[:, :3])
  garbage = jnp.full((3, 5), 17, jnp.int32)
  _, dirty = dc.decode_tokens(model, params, dirty, garbage)  # rejected proposals
  dirty = dc.set_cache_index(dirty, jnp.array([3, 3, 3]))
  got, _ = dc.decode_tokens(model, params, dirty, dec[:, 3:7])
  np.testing.assert_array_equal(got, expected)


def test_ragged_rows_advance_independently(model_and_params):
  """Each row has its own index: rows at different lengths decode as if alone."""
  model, params = model_and_params
  enc, dec = _batch()
  expected = _teacher_forced(model, params, enc, dec)
  cache = dc.init_decode_cache(model, params, _encode(model, params, enc), enc, 12)
  _, cache = dc.decode_tokens(model, params, cache, dec[:, :4])
  cache = dc.set_cache_index(cache, jnp.array([4, 2, 3]))  # rows accepted different amounts
  nxt = jnp.stack([dec[0, 4:6], dec[1, 2:4], dec[2, 3:5]])
  logits, cache = dc.decode_tokens(model, params, cache, nxt)
  np.testing.assert_allclose(logits[0], expected[0, 4:6], atol=2e-5)
  np.testing.assert_allclose(logits[1], expected[1, 2:4], atol=2e-5)
  np.testing.assert_allclose(logits[2], expected[2, 3:5], atol=2e-5)
  np.testing.assert_array_equal(dc.cache_index(cache), [6, 4, 5])


def test_tree_attention_mask_and_positions_match_linear_paths(model_and_params):
  """Siblings in one call (tree verification) see only their own ancestors."""
  model, params = model_and_params
  enc, dec = _batch()
  encoded = _encode(model, params, enc)
  prefix = dec[:, :3]
  a, b, c = dec[:, 3:4], dec[:, 4:5], dec[:, 5:6]
  # Tree: a -> b and a -> c (b and c are siblings at the same depth).
  cache = dc.init_decode_cache(model, params, encoded, enc, 12)
  _, cache = dc.decode_tokens(model, params, cache, prefix)
  tokens = jnp.concatenate([a, b, c], axis=1)
  positions = jnp.broadcast_to(jnp.array([3, 4, 4]), (3, 3))
  mask = jnp.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)[None]
  tree_logits, _ = dc.decode_tokens(model, params, cache, tokens, positions, mask)

  for branch, column in ((b, 1), (c, 2)):
    path = jnp.concatenate([prefix, a, branch], axis=1)
    linear = _teacher_forced(model, params, enc, path)
    np.testing.assert_allclose(tree_logits[:, 0], linear[:, 3], atol=2e-5)
    np.testing.assert_allclose(tree_logits[:, column], linear[:, 4], atol=2e-5)


def test_packed_examples_match_unpacked():
  model, params = _init(TINY.replace(num_kv_heads=2))
  enc, dec = _batch(batch=2, enc_len=4, dec_len=3, pad=False)
  packed_enc = jnp.concatenate([enc[0], enc[1]])[None]
  packed_dec = jnp.concatenate([dec[0], dec[1]])[None]
  enc_seg = jnp.array([[1] * 4 + [2] * 4])
  dec_seg = jnp.array([[1] * 3 + [2] * 3])
  packed = model.apply({'params': params}, packed_enc, packed_dec, jnp.ones_like(packed_dec),
                       enc_seg, dec_seg, enable_dropout=False)
  alone = _teacher_forced(model, params, enc, dec)
  np.testing.assert_allclose(packed[0, :3], alone[0], atol=2e-5)
  np.testing.assert_allclose(packed[0, 3:], alone[1], atol=2e-5)


def test_bfloat16_params_and_activations():
  config = TINY.replace(num_kv_heads=2, dtype='bfloat16', param_dtype='bfloat16')
  model, params = _init(config)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(params))
  f32_model = Transformer(TINY.replace(num_kv_heads=2))
  f32_params = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)
  enc, dec = _batch()
  bf16 = _teacher_forced(model, params, enc, dec)
  f32 = _teacher_forced(f32_model, f32_params, enc, dec)
  assert bf16.dtype == jnp.float32  # logits are always float32
  # bf16 activations: close to the float32 computation with the same weights, not equal.
  assert float(jnp.max(jnp.abs(bf16 - f32))) < 0.15 * float(jnp.max(jnp.abs(f32)))
  assert not np.array_equal(bf16, f32)


def test_dropout_only_when_enabled():
  config = TINY.replace(dropout_rate=0.3)
  model, params = _init(config)
  enc, dec = _batch()
  a = _teacher_forced(model, params, enc, dec)
  b = _teacher_forced(model, params, enc, dec)
  np.testing.assert_array_equal(a, b)
  dropped = model.apply({'params': params}, enc, dec, jnp.ones_like(dec), enable_dropout=True,
                        rngs={'dropout': jax.random.PRNGKey(3)})
  assert not np.allclose(dropped, a, atol=1e-3)
