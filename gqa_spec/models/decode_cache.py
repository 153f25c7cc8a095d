"""Functional access to the decoder's cache: create it, append k tokens, read and move its index.

These are the only operations the decoding loops need, so autoregressive, speculative and tree
decoding share one implementation of the cache protocol documented in `t5.py`.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

from gqa_spec.models.t5 import SCANNED_NAME, Transformer

Cache = Any


def init_decode_cache(model: Transformer, params: Any, encoded: jax.Array,
                      encoder_input_tokens: jax.Array, max_decode_length: int) -> Cache:
  """Creates the cache for a batch: cross-attention K/V from `encoded`, empty self-attention.

  Args:
    model: the Transformer.
    params: its parameters.
    encoded: `[batch, S, emb]` encoder output.
    encoder_input_tokens: `[batch, S]` (0 = padding, masked out of cross-attention).
    max_decode_length: self-attention cache length L; every later call must keep
      `index + k <= L`.

  Returns:
    The cache, with index 0 in every row.
  """
  batch = encoder_input_tokens.shape[0]
  dummy = jnp.zeros((batch, 1), jnp.int32)
  # Creating the cache runs one decode call; its write at slot 0 is overwritten by the first real
  # call because the index is reset to 0.
  _, variables = model.apply({'params': params}, encoded, encoder_input_tokens, dummy,
                             decode=True, max_decode_length=max_decode_length,
                             method=Transformer.decode, mutable=['cache'])
  return set_cache_index(variables['cache'], jnp.zeros((batch,), jnp.int32))


def decode_tokens(model: Transformer, params: Any, cache: Cache, tokens: jax.Array,
                  positions: Optional[jax.Array] = None,
                  attention_mask: Optional[jax.Array] = None) -> Tuple[jax.Array, Cache]:
  """Appends `tokens [batch, k]` to the cache; returns `([batch, k, vocab] logits, cache)`.

  `positions [batch, k]` and `attention_mask [batch, k, k]` (bool, which of the k new tokens each
  new token sees) default to consecutive positions after the index and a causal mask.
  """
  logits, variables = model.apply({'params': params, 'cache': cache}, None, None, tokens,
                                  decode=True, decoder_positions=positions,
                                  decoder_attention_mask=attention_mask,
                                  method=Transformer.decode, mutable=['cache'])
  return logits, variables['cache']


def decode_tokens_with_hidden(model: Transformer, params: Any, cache: Cache, tokens: jax.Array,
                              positions: Optional[jax.Array] = None,
                              attention_mask: Optional[jax.Array] = None
                              ) -> Tuple[jax.Array, jax.Array, Cache]:
  """`decode_tokens` that also returns the final hidden states `[batch, k, emb]` of the k tokens.

  Same single decoder pass: the hidden states are the logits layer's input (see
  `Transformer.decode`), so verifying with this costs what `decode_tokens` costs.
  """
  (logits, hidden), variables = model.apply(
      {'params': params, 'cache': cache}, None, None, tokens, decode=True,
      decoder_positions=positions, decoder_attention_mask=attention_mask, return_hidden=True,
      method=Transformer.decode, mutable=['cache'])
  return logits, hidden, variables['cache']


def cache_index(cache: Cache) -> jax.Array:
  """`[batch]` number of cached positions per row."""
  return cache['decoder']['cache_index']


def set_cache_index(cache: Cache, index: jax.Array) -> Cache:
  """Moves every row's index (rollback when moved back: later writes overwrite the slots)."""
  decoder = dict(cache['decoder'])
  decoder['cache_index'] = jnp.asarray(index, jnp.int32)
  return {**cache, 'decoder': decoder}


def cache_length(cache: Cache) -> int:
  """Self-attention cache length L."""
  return cache['decoder']['positions'].shape[1]


def self_attention_kv_bytes(cache: Cache) -> int:
  """Bytes of self-attention K/V held in the cache (scales with num_kv_heads)."""
  return sum(arr.size * arr.dtype.itemsize for layer in _layer_caches(cache).values()
             for arr in layer['self_attention'].values())


def _layer_caches(cache: Cache):
  """`{name: per-layer cache}` of every decoder layer: `layers_i` unrolled, or the one scanned
  `layers` whose leaves hold all layers at axis 1 (`t5.CACHE_SCAN_AXIS`)."""
  return {name: layer for name, layer in cache['decoder'].items()
          if name == SCANNED_NAME or name.startswith('layers_')}


def move_slots(cache: Cache, start: jax.Array, source: jax.Array) -> Cache:
  """Copies self-attention slots `source [batch, P]` to slots `start [batch] + 0..P-1`, per row.

  Tree decoding compacts a row's accepted root-to-node path, scattered over the tree's slots, into
  the contiguous slots after its prefix; K/V and slot positions move together. Callers keep
  `start + P <= L` (a clamped write would shift). Slots past the new index are junk and later
  overwritten, so a row may move anything into them.
  """
  def move(x: jax.Array, axis: int) -> jax.Array:  # x [batch, ..., L (at axis), ...]
    idx = source.reshape(source.shape + (1,) * (x.ndim - 2))  # [batch, P, 1...]
    idx = jnp.moveaxis(idx, 1, axis)
    taken = jnp.take_along_axis(x, idx, axis=axis)  # [batch, ..., P, ...]
    return jax.vmap(lambda row, upd, i: jax.lax.dynamic_update_slice(
        row, upd, tuple(i if a == axis - 1 else 0 for a in range(row.ndim))))(x, taken, start)

  decoder = dict(cache['decoder'])
  for name, layer in _layer_caches(cache).items():
    attn = dict(layer['self_attention'])
    key, value = attn['cached_key'], attn['cached_value']
    attn['cached_key'] = move(key, key.ndim - 1)  # [batch, (layers,) G, d, L] (attention.py)
    attn['cached_value'] = move(value, value.ndim - 2)  # [batch, (layers,) G, L, d]
    decoder[name] = {**layer, 'self_attention': attn}
  decoder['positions'] = move(decoder['positions'], 1)  # [batch, L]
  return {**cache, 'decoder': decoder}
