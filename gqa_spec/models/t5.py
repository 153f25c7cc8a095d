"""T5.1.1 encoder-decoder in flax.linen with grouped-query attention in the decoder.

Mirrors t5x's `examples/t5/network.py` (module names, parameter names and shapes), so T5X and HF
T5.1.1 checkpoints map onto it one to one, and its `Transformer` has the module API that t5x's
`EncoderDecoderModel` drives: `__call__`, `encode`, `decode`.

Decode cache (flax collection 'cache'), beyond the per-layer K/V described in `attention.py`:
  decoder/cache_index   [batch]     int32   per-row number of cached positions (next write slot)
  decoder/positions     [batch, L]  int32   position of the token held in each self-attention slot
  decoder/encoder_mask  [batch, S]  bool    which encoder positions cross-attention may see
A decode call appends k >= 1 tokens at slots [cache_index, cache_index + k) of every row and then
advances cache_index by k. Writes overwrite, so `set_cache_index` (moving the index back) is a
complete rollback. Optional explicit `decoder_positions [batch, k]` and `decoder_attention_mask
[batch, k, k]` (which of this call's tokens each of them may see; earlier slots are all visible)
serve tree verification; a `[batch, k, L]` mask instead names every visible slot (tree drafts). By
default positions continue from the index and the mask is causal.

The first decode call, made with no cache, creates it: cross-attention K/V are projected once from
`encoded` (with `num_kv_heads` heads), self-attention K/V are zeros of length `max_decode_length`.
`init_decode_cache` wraps this.

Layer layout (`T5Config.scan_layers`): unrolled stacks are a Python loop of modules `layers_0`,
`layers_1`, ... (T5X's names); scanned stacks are one `nn.scan` named `layers` whose parameters gain
a `layers` axis at `PARAM_SCAN_AXIS` (1, as flaxformer's and MaxText's `param_scan_axis`: a kernel
`[in, out]` becomes `[in, layers, out]`, a norm scale `[emb]` becomes `[emb, layers]`) and whose
per-layer cache leaves gain it at `CACHE_SCAN_AXIS` (1, so every cache leaf stays batch-major:
`cached_key [batch, layers, G, head_dim, L]`). The relative-position bias (one table per stack) and
the decoder's index/positions/mask are computed once, outside the scan. Both layouts compute the
same function; `models/layout.py` converts parameters between them.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from gqa_spec.models.attention import MultiHeadAttention, RelativePositionBiases, write_cache
from gqa_spec.models.config import T5Config
from gqa_spec.models.layers import Dense, Embed, MlpBlock, RMSNorm

Cache = Any  # the 'cache' collection: nested dicts of arrays

PARAM_SCAN_AXIS = 1  # where a scanned stack's parameters hold the layer axis
CACHE_SCAN_AXIS = 1  # where its cache leaves hold it (after batch)
SCANNED_NAME = 'layers'  # the scanned stack's module name (unrolled: layers_0, layers_1, ...)

# T5Config.remat_policy -> what the backward pass may keep of a layer's forward pass.
_REMAT_POLICIES = {
    'minimal': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    'full': jax.checkpoint_policies.nothing_saveable,
}


def _dropout(config: T5Config, x: jax.Array, enable_dropout: bool) -> jax.Array:
  return nn.Dropout(config.dropout_rate, broadcast_dims=(-2,))(x, deterministic=not enable_dropout)


def _norm(config: T5Config, name: str) -> RMSNorm:
  return RMSNorm(config.layer_norm_epsilon, config.activation_dtype, config.parameter_dtype, name=name)


def _attention(config: T5Config, num_kv_heads: int, name: str) -> MultiHeadAttention:
  return MultiHeadAttention(config.num_heads, num_kv_heads, config.head_dim,
                            config.activation_dtype, config.parameter_dtype, config.dropout_rate,
                            config.float32_attention_logits, name=name)


def _relpos(config: T5Config) -> RelativePositionBiases:
  return RelativePositionBiases(config.relative_attention_num_buckets,
                                config.relative_attention_max_distance, config.num_heads,
                                config.activation_dtype, config.parameter_dtype, name='relpos_bias')


def _mlp(config: T5Config) -> MlpBlock:
  return MlpBlock(config.mlp_dim, config.mlp_activations, config.dropout_rate,
                  config.activation_dtype, config.parameter_dtype, name='mlp')


def make_attention_mask(query_valid: jax.Array, key_valid: jax.Array) -> jax.Array:
  """`[batch, q]` x `[batch, k]` bools -> `[batch, 1, q, k]`."""
  return (query_valid[:, :, None] & key_valid[:, None, :])[:, None]


def make_segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
  """Packed examples see only their own segment: `[batch, 1, q, k]`."""
  return (query_segments[:, :, None] == key_segments[:, None, :])[:, None]


def _layer_stack(cfg: T5Config, layer_cls, num_layers: int, x: jax.Array, *args,
                 train: bool, **static) -> jax.Array:
  """`x` through `num_layers` layers `layer_cls(cfg)(x, *args, **static)` in `cfg`'s layout.

  `args` (arrays or None) are the same for every layer; `static` are Python values. `train` applies
  `cfg.remat_policy` (remat only matters under a gradient; decoding never remats).
  """
  def body(layer, carry, *xs):
    return layer(carry, *xs, **static), None

  if train and cfg.remat_policy != 'none':
    body = nn.remat(body, policy=_REMAT_POLICIES[cfg.remat_policy],
                    prevent_cse=not cfg.scan_layers)  # scan already keeps XLA from CSE-ing remat
  if cfg.scan_layers:
    scanned = nn.scan(body, variable_axes={'params': PARAM_SCAN_AXIS, 'cache': CACHE_SCAN_AXIS},
                      split_rngs={'params': True, 'dropout': True},
                      in_axes=(nn.broadcast,) * len(args), length=num_layers)
    x, _ = scanned(layer_cls(cfg, name=SCANNED_NAME), x, *args)
    return x
  for i in range(num_layers):
    x, _ = body(layer_cls(cfg, name=f'layers_{i}'), x, *args)
  return x


class EncoderLayer(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x, bias, mask, *, enable_dropout: bool = False):
    cfg = self.config
    h = _norm(cfg, 'pre_attention_layer_norm')(x)
    # The encoder is always multi-head: GQA applies to the decoder only (Ainslie et al. 2023).
    h = _attention(cfg, cfg.num_heads, 'attention')(h, h, mask, bias, enable_dropout=enable_dropout)
    x = x + _dropout(cfg, h, enable_dropout)
    h = _mlp(cfg)(_norm(cfg, 'pre_mlp_layer_norm')(x), enable_dropout)
    return x + _dropout(cfg, h, enable_dropout)


class DecoderLayer(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x, encoded, self_bias, self_mask, cross_mask, cache_index=None, *,
               enable_dropout: bool = False, decode: bool = False, cache_length=None):
    cfg = self.config
    h = _norm(cfg, 'pre_self_attention_layer_norm')(x)
    h = _attention(cfg, cfg.num_kv_heads, 'self_attention')(
        h, h, self_mask, self_bias, enable_dropout=enable_dropout,
        cache_mode='self' if decode else None, cache_index=cache_index, cache_length=cache_length)
    x = x + _dropout(cfg, h, enable_dropout)
    h = _norm(cfg, 'pre_cross_attention_layer_norm')(x)
    h = _attention(cfg, cfg.num_kv_heads, 'encoder_decoder_attention')(
        h, encoded, cross_mask, None, enable_dropout=enable_dropout,
        cache_mode='cross' if decode else None)
    x = x + _dropout(cfg, h, enable_dropout)
    h = _mlp(cfg)(_norm(cfg, 'pre_mlp_layer_norm')(x), enable_dropout)
    return x + _dropout(cfg, h, enable_dropout)


class Encoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, encoder_input_tokens, encoder_mask, enable_dropout: bool = False):
    cfg = self.config
    length = encoder_input_tokens.shape[1]
    positions = jnp.arange(length)[None]  # [1, length]; relative bias is offset-invariant under packing
    bias = _relpos(cfg)(positions, positions, bidirectional=True)  # [1, heads, length, length]
    x = _dropout(cfg, self.shared_embedding(encoder_input_tokens), enable_dropout)
    x = _layer_stack(cfg, EncoderLayer, cfg.num_encoder_layers, x, bias, encoder_mask,
                     train=True, enable_dropout=enable_dropout)
    x = _norm(cfg, 'encoder_norm')(x)
    return _dropout(cfg, x, enable_dropout)  # [batch, length, emb]


class Decoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, encoded, decoder_input_tokens, decoder_mask=None, encoder_decoder_mask=None,
               enable_dropout: bool = False, decode: bool = False,
               max_decode_length: Optional[int] = None, decoder_positions=None,
               decoder_attention_mask=None, encoder_valid=None, return_hidden: bool = False):
    cfg = self.config
    batch, length = decoder_input_tokens.shape
    relpos = _relpos(cfg)
    cache_index = cache_length = None
    if decode:
      if max_decode_length is None and not self.has_variable('cache', 'cache_index'):
        raise ValueError('the first decode call creates the cache and needs max_decode_length')
      index_var = self.variable('cache', 'cache_index', jnp.zeros, (batch,), jnp.int32)
      slot_positions = self.variable('cache', 'positions', jnp.zeros, (batch, max_decode_length or 0),
                                     jnp.int32)
      enc_mask = self.variable('cache', 'encoder_mask', lambda: encoder_valid.astype(bool))
      cache_index = index_var.value  # [batch]
      cache_length = slot_positions.value.shape[1]
      if decoder_positions is None:
        decoder_positions = cache_index[:, None] + jnp.arange(length, dtype=jnp.int32)  # [batch, k]
      decoder_positions = decoder_positions.astype(jnp.int32)
      self_mask, self_bias = self._append(relpos, index_var, slot_positions, decoder_positions,
                                          decoder_attention_mask)
      cross_mask = enc_mask.value[:, None, None, :]  # [batch, 1, 1, S]
    else:
      positions = jnp.arange(length)[None]
      self_bias = relpos(positions, positions, bidirectional=False)  # [1, heads, length, length]
      self_mask, cross_mask = decoder_mask, encoder_decoder_mask

    x = _dropout(cfg, self.shared_embedding(decoder_input_tokens), enable_dropout)
    x = _layer_stack(cfg, DecoderLayer, cfg.num_decoder_layers, x, encoded, self_bias, self_mask,
                     cross_mask, cache_index, train=not decode, enable_dropout=enable_dropout,
                     decode=decode, cache_length=cache_length)
    x = _norm(cfg, 'decoder_norm')(x)
    x = _dropout(cfg, x, enable_dropout)
    if cfg.logits_via_embedding:
      logits = self.shared_embedding.attend(x) / jnp.sqrt(x.shape[-1]).astype(x.dtype)
    else:
      logits = Dense(cfg.vocab_size, jnp.float32, cfg.parameter_dtype, name='logits_dense')(x)
    if return_hidden:  # the logits layer's input, a by-product: no extra computation
      return logits.astype(jnp.float32), x  # [batch, k, vocab], [batch, k, emb]
    return logits.astype(jnp.float32)  # [batch, k, vocab]

  def _append(self, relpos, index_var, slot_positions, decoder_positions, decoder_attention_mask):
    """Writes the k new tokens' positions at each row's index and advances it by k; returns the
    self-attention mask `[batch, 1, k, L]` and bias `[batch, H, k, L]` over the cache's slots."""
    cache_index = index_var.value  # [batch]
    batch, length = decoder_positions.shape
    cache_length = slot_positions.value.shape[1]
    offsets = jnp.arange(length, dtype=jnp.int32)
    slot_positions.value = write_cache(slot_positions.value, decoder_positions, cache_index,
                                       axis=1)  # [batch, L]
    # Which slots each new token sees: all earlier slots, plus this call's slots per the mask.
    slots = jnp.arange(cache_length, dtype=jnp.int32)[None]  # [1, L]
    rel_slot = slots - cache_index[:, None]  # [batch, L]; 0..k-1 for this call's slots
    is_new = (rel_slot >= 0) & (rel_slot < length)  # [batch, L]
    if decoder_attention_mask is None:
      new_visible = rel_slot[:, None, :] <= offsets[None, :, None]  # causal, [batch, k, L]
    elif decoder_attention_mask.shape[-1] == cache_length:
      # A `[batch, k, L]` mask names every visible slot (a draft growing a token tree level by
      # level must hide earlier levels' non-ancestors); when k == L both readings coincide.
      new_visible = None
      visible = decoder_attention_mask.astype(bool) & (rel_slot < length)[:, None, :]
    else:
      tree = jnp.broadcast_to(decoder_attention_mask.astype(bool), (batch, length, length))
      new_visible = jnp.take_along_axis(
          tree, jnp.broadcast_to(jnp.clip(rel_slot, 0, length - 1)[:, None, :],
                                 (batch, length, cache_length)), axis=2)  # [batch, k, L]
    if new_visible is not None:
      visible = (rel_slot < 0)[:, None, :] | (is_new[:, None, :] & new_visible)  # [batch, k, L]
    index_var.value = cache_index + length
    self_bias = relpos(decoder_positions, slot_positions.value, bidirectional=False)
    return visible[:, None], self_bias  # [batch, 1, k, L], [batch, H, k, L]


class Transformer(nn.Module):
  """T5.1.1 encoder-decoder; the module t5x's `EncoderDecoderModel` drives."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype,
                                cfg.parameter_dtype)
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

  def encode(self, encoder_input_tokens, encoder_segment_ids=None, encoder_positions=None, *,
             enable_dropout: bool = False):
    """`[batch, S]` tokens (0 = padding) -> `[batch, S, emb]` encodings."""
    del encoder_positions  # relative position biases need no absolute positions
    valid = encoder_input_tokens > 0
    mask = make_attention_mask(valid, valid)
    if encoder_segment_ids is not None:
      mask &= make_segment_mask(encoder_segment_ids, encoder_segment_ids)
    return self.encoder(encoder_input_tokens, mask, enable_dropout)

  def decode(self, encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens=None,
             encoder_segment_ids=None, decoder_segment_ids=None, decoder_positions=None, *,
             enable_dropout: bool = False, decode: bool = False,
             max_decode_length: Optional[int] = None, decoder_attention_mask=None,
             return_hidden: bool = False):
    """Decoder logits `[batch, k, vocab]` (float32).

    Teacher-forced (`decode=False`): causal over `decoder_input_tokens`, padding from
    `decoder_target_tokens`, packing from the segment ids. Incremental (`decode=True`, 'cache'
    mutable): appends the k tokens to the cache; `encoded`/`encoder_input_tokens` are read only by
    the call that creates the cache. `decoder_positions` / `decoder_attention_mask [batch, k, k]`
    override the default positions and causal mask of the new tokens (tree verification).
    `return_hidden=True` returns `(logits, hidden [batch, k, emb])`: the decoder's final hidden
    states, i.e. the logits layer's input (after `decoder_norm`; dropout is off when decoding), which
    trained drafts such as Chimera read.
    """
    if decode:
      encoder_valid = None if encoder_input_tokens is None else encoder_input_tokens > 0
      return self.decoder(encoded, decoder_input_tokens, enable_dropout=enable_dropout, decode=True,
                          max_decode_length=max_decode_length, decoder_positions=decoder_positions,
                          decoder_attention_mask=decoder_attention_mask, encoder_valid=encoder_valid,
                          return_hidden=return_hidden)
    length = decoder_input_tokens.shape[1]
    if decoder_target_tokens is None:
      decoder_target_tokens = jnp.ones_like(decoder_input_tokens)
    target_valid = decoder_target_tokens > 0
    causal = jnp.tril(jnp.ones((length, length), bool))[None, None]  # [1, 1, k, k]
    decoder_mask = make_attention_mask(target_valid, target_valid) & causal
    cross_mask = make_attention_mask(target_valid, encoder_input_tokens > 0)
    if decoder_segment_ids is not None:
      decoder_mask &= make_segment_mask(decoder_segment_ids, decoder_segment_ids)
      cross_mask &= make_segment_mask(decoder_segment_ids, encoder_segment_ids)
    return self.decoder(encoded, decoder_input_tokens, decoder_mask, cross_mask,
                        enable_dropout=enable_dropout, return_hidden=return_hidden)

  def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
               encoder_segment_ids=None, decoder_segment_ids=None, encoder_positions=None,
               decoder_positions=None, *, enable_dropout: bool = True, decode: bool = False,
               max_decode_length: Optional[int] = None):
    """Teacher-forced logits `[batch, k, vocab]` for a (possibly packed) batch."""
    if decode:
      raise ValueError('Transformer.__call__ is teacher-forced; use `decode(..., decode=True)` '
                       'for incremental decoding')
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                          enable_dropout=enable_dropout)
    return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                       encoder_segment_ids, decoder_segment_ids, decoder_positions,
                       enable_dropout=enable_dropout)
