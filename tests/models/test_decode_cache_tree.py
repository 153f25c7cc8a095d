"""Decode-cache operations of tree decoding: `[b, k, L]` slot masks and path compaction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.models import decode_cache
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer



class dc:  # pylint: disable=invalid-name  (jitted: eager flax dispatch is slow on a loaded machine)
  decode_tokens = staticmethod(jax.jit(decode_cache.decode_tokens, static_argnames='model'))
  init_decode_cache = staticmethod(decode_cache.init_decode_cache)
  move_slots = staticmethod(jax.jit(decode_cache.move_slots))
  set_cache_index = staticmethod(decode_cache.set_cache_index)


TINY = T5Config(vocab_size=61, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48,
                num_encoder_layers=1, num_decoder_layers=2)


def test_slot_mask_hides_cousins_and_moved_path_decodes_like_a_linear_prefix():
  model = Transformer(TINY.replace(num_kv_heads=2))
  rng = np.random.default_rng(0)
  enc = jnp.asarray(rng.integers(2, 61, (2, 6)), jnp.int32).at[1, 4:].set(0)
  dec = jnp.asarray(rng.integers(2, 61, (2, 7)), jnp.int32).at[:, 0].set(0)
  params = model.init(jax.random.PRNGKey(0), enc, dec, jnp.ones_like(dec),
                      enable_dropout=False)['params']
  encoded = model.apply({'params': params}, enc, method=Transformer.encode)
  forced = lambda d: model.apply({'params': params}, enc, d, jnp.ones_like(d),
                                 enable_dropout=False)  # [b, len, V]
  prefix, a1, a2, b, c = dec[:, :3], dec[:, 3:4], dec[:, 4:5], dec[:, 5:6], dec[:, 6:7]
  cache = dc.init_decode_cache(model, params, encoded, enc, 12)
  _, cache = dc.decode_tokens(model, params, cache, prefix)
  # Level 1: siblings a1, a2 (slots 3, 4), both at position 3.
  _, cache = dc.decode_tokens(model, params, cache, jnp.concatenate([a1, a2], axis=1),
                              jnp.full((2, 2), 3), jnp.eye(2, dtype=bool)[None])
  # Level 2: b under a2 at slot 5, position 4: sees the prefix, a2 and itself, never a1.
  visible = jnp.zeros((2, 1, 12), bool).at[:, :, jnp.array([0, 1, 2, 4, 5])].set(True)
  logits_b, cache = dc.decode_tokens(model, params, cache, b, jnp.full((2, 1), 4), visible)
  linear = forced(jnp.concatenate([prefix, a2, b, c], axis=1))  # [b, 6, V]
  np.testing.assert_allclose(logits_b[:, 0], linear[:, 4], atol=2e-5)
  with pytest.raises(AssertionError):  # a1 visible would change the logits
    wrong, _ = dc.decode_tokens(model, params, dc.set_cache_index(cache, jnp.array([5, 5])), b,
                                jnp.full((2, 1), 4), visible.at[:, :, 3].set(True))
    np.testing.assert_allclose(wrong[:, 0], linear[:, 4], atol=2e-5)
  # Accept a2, b: move slots 4, 5 to 3, 4; the next token decodes as after the linear prefix.
  tree_cache = cache
  cache = dc.move_slots(tree_cache, jnp.array([3, 3]), jnp.array([[4, 5], [4, 5]]))
  cache = dc.set_cache_index(cache, jnp.array([5, 5]))
  logits_c, _ = dc.decode_tokens(model, params, cache, c)
  np.testing.assert_allclose(logits_c[:, 0], linear[:, 5], atol=2e-5)
  # Ragged: row 1 accepts only a2 (slot 4 -> 3); its next token b at slot 4 then sees a2.
  cache2 = dc.move_slots(tree_cache, jnp.array([3, 3]), jnp.array([[4, 5], [4, 4]]))
  cache2 = dc.set_cache_index(cache2, jnp.array([5, 4]))
  nxt, _ = dc.decode_tokens(model, params, cache2, jnp.concatenate([c[:1], b[1:]], axis=0))
  np.testing.assert_allclose(nxt[0, 0], linear[0, 5], atol=2e-5)
  np.testing.assert_allclose(nxt[1, 0], linear[1, 4], atol=2e-5)
