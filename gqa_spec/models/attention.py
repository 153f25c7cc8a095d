"""Grouped-query attention (MHA / GQA-G / MQA in one module) and T5's relative position biases.

Head layout: query head `h` belongs to key/value group `h // (H // G)`, i.e. consecutive query heads
share a group. This is the order in which `convert.py` mean-pools MHA heads and in which HF export
repeats K/V heads, so the three agree by construction.

Attention never materialises repeated K/V heads: the query heads of a group are folded with the
query positions into one matrix `[batch, G, R * q, d]` (R = H/G), contracted against `[batch, G, d, k]`
keys and then `[batch, G, k, d]` values, so the bytes read per decode step scale with G, not H.
That is the whole point of GQA. Keys are kept transposed (`d` before `k`) so that both contractions
are plain batched matmuls in XLA's standard dot layout (`[B, M, K] x [B, K, N]`): any other layout
makes XLA:CPU copy or transpose the whole K/V per call or leave its fast matmul path, and the step
time then stops following the bytes (measured in `benchmarks/decode.py`).

Decode cache (the design's centre), per attention layer, in flax's 'cache' collection:
  self-attention:   cached_key [batch, G, head_dim, max_length], cached_value [batch, G, max_length, head_dim]
  cross-attention:  cached_key [batch, G, head_dim, encoder_length], cached_value [batch, G, encoder_length, head_dim]
Self-attention writes the k >= 1 new positions at per-row slots `[index, index + k)` by overwriting
(`dynamic_update_slice`), so moving the index back is a complete rollback. The index itself, the
positions of the cached slots and the attention mask are owned by the decoder (`t5.py`) and passed in.
"""

from __future__ import annotations

import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.models.layers import Dense, default_kernel_init, softmax

_MASK_VALUE = -1e10


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> jax.Array:
  """T5's bucketing of `key_position - query_position` (t5x / mesh-tensorflow)."""
  ret = jnp.zeros_like(relative_position)
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(relative_position.dtype) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  val_if_large = max_exact + (
      jnp.log(n.astype(jnp.float32) / max_exact + np.finfo(np.float32).eps)
      / math.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(relative_position.dtype)
  val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
  return ret + jnp.where(is_small, n, val_if_large)


class RelativePositionBiases(nn.Module):
  """Per-head learned bias from bucketed relative positions; one table shared by a whole stack."""

  num_buckets: int
  max_distance: int
  num_heads: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, query_positions: jax.Array, key_positions: jax.Array,
               bidirectional: bool) -> jax.Array:
    """Biases for all (query, key) pairs.

    Args:
      query_positions: int `[batch, q]` (batch may be 1 to broadcast).
      key_positions: int `[batch, k]`.
      bidirectional: encoder (True) or causal decoder (False) bucketing.

    Returns:
      `[batch, heads, q, k]` biases.
    """
    table = self.param('rel_embedding',
                       nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform'),
                       (self.num_heads, self.num_buckets), self.param_dtype)
    relative = key_positions[:, None, :] - query_positions[:, :, None]  # [batch, q, k]
    buckets = relative_position_bucket(relative.astype(jnp.int32), bidirectional,
                                       self.num_buckets, self.max_distance)
    bias = jnp.take(table.astype(self.dtype), buckets, axis=1)  # [heads, batch, q, k]
    return jnp.transpose(bias, (1, 0, 2, 3))  # [batch, heads, q, k]


def grouped_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                      mask: Optional[jax.Array], bias: Optional[jax.Array],
                      float32_logits: bool = True, dropout=None) -> jax.Array:
  """Softmax attention of grouped queries over shared K/V heads.

  Args:
    query: `[batch, q, G, R, d]` (R = H / G query heads per group).
    key: `[batch, G, d, k]` (transposed, see the module docstring).
    value: `[batch, G, k, d]`.
    mask: bool, broadcastable to `[batch, 1, q, k]`; True = may attend.
    bias: broadcastable to `[batch, H, q, k]`.
    float32_logits: compute logits and softmax in float32.
    dropout: optional callable applied to the attention weights.

  Returns:
    `[batch, q, G, R, d]`.
  """
  batch, q_len, groups, per_group, head_dim = query.shape
  if float32_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  # Fold (R, q) into the matmul's M dimension: head-major, so the bias reshapes without a copy.
  folded = jnp.transpose(query, (0, 2, 3, 1, 4)).reshape(batch, groups, per_group * q_len, head_dim)
  logits = jnp.einsum('bgmd,bgdk->bgmk', folded, key)  # [batch, G, R * q, k]
  logits = logits.reshape(batch, groups, per_group, q_len, -1)  # [batch, G, R, q, k]
  if bias is not None:
    b = bias.reshape(bias.shape[0], groups, per_group, *bias.shape[-2:])  # [batch, G, R, q, k]
    logits = logits + b.astype(logits.dtype)
  if mask is not None:
    m = mask.reshape(mask.shape[0], 1, 1, *mask.shape[-2:])  # [batch, 1, 1, q, k]
    logits = jnp.where(m, logits, jnp.asarray(_MASK_VALUE, logits.dtype))
  weights = softmax(logits).astype(value.dtype)  # [batch, G, R, q, k] (order-fixed sum on CPU)
  if dropout is not None:
    weights = dropout(weights)
  weights = weights.reshape(batch, groups, per_group * q_len, -1)  # [batch, G, R * q, k]
  out = jnp.einsum('bgmk,bgkd->bgmd', weights, value)  # [batch, G, R * q, d]
  out = out.reshape(batch, groups, per_group, q_len, head_dim)
  return jnp.transpose(out, (0, 3, 1, 2, 4))  # [batch, q, G, R, d]


def write_cache(cache: jax.Array, update: jax.Array, index: jax.Array, axis: int = 2) -> jax.Array:
  """Overwrites `update` into `cache` along `axis` at per-row slots `index [batch]`.

  Values are `[batch, G, k, d]` into `[batch, G, L, d]` (axis 2); keys `[batch, G, d, k]` into
  `[batch, G, d, L]` (axis 3); the decoder's slot positions `[batch, k]` into `[batch, L]` (axis 1).

  Writes overwrite (no one-hot accumulate), so rolling the index back and writing again leaves no
  trace of the discarded entries. Callers guarantee `index + k <= L` (`dynamic_update_slice` would
  otherwise clamp the start and shift the write).
  """
  def one_row(c, u, i):  # per row, the slot axis is axis - 1
    start = [0] * c.ndim
    start[axis - 1] = i
    return jax.lax.dynamic_update_slice(c, u.astype(c.dtype), start)
  return jax.vmap(one_row)(cache, update, index)


class MultiHeadAttention(nn.Module):
  """T5 attention with `num_kv_heads` key/value heads (MHA if == num_heads, MQA if 1).

  As in T5 there is no 1/sqrt(d) in the dot product; the query kernel's initialisation is scaled
  instead (t5x's `depth_scaling`), which keeps checkpoints interchangeable with T5X and HF.
  """

  num_heads: int
  num_kv_heads: int
  head_dim: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  dropout_rate: float = 0.0
  float32_logits: bool = True

  @nn.compact
  def __call__(self, inputs_q: jax.Array, inputs_kv: Optional[jax.Array],
               mask: Optional[jax.Array] = None, bias: Optional[jax.Array] = None, *,
               enable_dropout: bool = False, cache_mode: Optional[str] = None,
               cache_index: Optional[jax.Array] = None, cache_length: Optional[int] = None
               ) -> jax.Array:
    """Attends `inputs_q [batch, q, emb]` to `inputs_kv [batch, k, emb]`.

    Args:
      inputs_q: queries' inputs.
      inputs_kv: keys'/values' inputs. With `cache_mode='cross'` only read when the cache is created.
      mask: bool, broadcastable to `[batch, 1, q, k]` (k = cache length in 'self' mode).
      bias: broadcastable to `[batch, H, q, k]`.
      enable_dropout: apply attention dropout.
      cache_mode: None (no cache), 'self' (append this call's K/V at `cache_index` and attend the
        whole cache) or 'cross' (K/V projected once from `inputs_kv` and cached).
      cache_index: `[batch]` int slots where 'self' mode writes.
      cache_length: cache length L, used only when the 'self' cache is created.

    Returns:
      `[batch, q, emb]`.
    """
    h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
    if h % g:
      raise ValueError(f'num_heads={h} is not divisible by num_kv_heads={g}')
    batch, q_len, emb = inputs_q.shape
    def query_init(rng, shape, dtype=jnp.float32):
      return (default_kernel_init(rng, shape, dtype) / np.sqrt(d)).astype(dtype)

    dense = lambda f, name, init=default_kernel_init: Dense(f, self.dtype, self.param_dtype, init, name=name)

    query = dense(h * d, 'query', query_init)(inputs_q).reshape(batch, q_len, g, h // g, d)

    def project_kv(x):  # [batch, k, emb] -> keys [batch, G, d, k], values [batch, G, k, d]
      k = dense(g * d, 'key')(x).reshape(x.shape[0], x.shape[1], g, d)
      v = dense(g * d, 'value')(x).reshape(x.shape[0], x.shape[1], g, d)
      return jnp.transpose(k, (0, 2, 3, 1)), jnp.swapaxes(v, 1, 2)

    if cache_mode is None:
      key, value = project_kv(inputs_kv)
    elif cache_mode == 'cross':
      initialised = self.has_variable('cache', 'cached_key')
      if initialised:
        key = self.get_variable('cache', 'cached_key')
        value = self.get_variable('cache', 'cached_value')
      else:
        if inputs_kv is None:
          raise ValueError('the cross-attention cache is empty: the first decode call needs `encoded`')
        key, value = project_kv(inputs_kv)
        self.put_variable('cache', 'cached_key', key)
        self.put_variable('cache', 'cached_value', value)
    elif cache_mode == 'self':
      new_key, new_value = project_kv(inputs_q)  # [batch, G, d, q], [batch, G, q, d]
      length = cache_length or 0
      cached_key = self.variable('cache', 'cached_key', jnp.zeros, (batch, g, d, length), self.dtype)
      cached_value = self.variable('cache', 'cached_value', jnp.zeros, (batch, g, length, d),
                                   self.dtype)
      cached_key.value = write_cache(cached_key.value, new_key, cache_index, axis=3)
      cached_value.value = write_cache(cached_value.value, new_value, cache_index, axis=2)
      key, value = cached_key.value, cached_value.value  # [batch, G, d, L], [batch, G, L, d]
    else:
      raise ValueError(f'unknown cache_mode {cache_mode!r}')

    dropout = None
    if enable_dropout and self.dropout_rate > 0:
      dropout = lambda w: nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(w, deterministic=False)
    out = grouped_attention(query, key, value, mask, bias, self.float32_logits, dropout)
    out = out.reshape(batch, q_len, h * d)  # [batch, q, H * d]
    return dense(emb, 'out')(out)
