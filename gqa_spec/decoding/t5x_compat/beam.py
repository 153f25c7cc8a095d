"""`beam_search` with `t5x.decoding.beam_search`'s signature, over `beam_search.search`.

The adapter gives the loop t5x's `tokens_to_logits` and cache (beams flattened into the batch
axis, `[.., b * k, ...]`) and returns t5x's order (ascending, best last). The prompt is
zero-padded, so the last step's forced-token read never clamps to `inputs[:, L - 1]` as t5x's does.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

from gqa_spec.decoding.beam_search import BeamState, search
from gqa_spec.decoding.t5x_compat.common import DecodingState, TokensIdsToLogitsCallable, cache_map

PyTree = Any
__all__ = ['BeamState', 'beam_search']


def beam_search(inputs: jax.Array, cache: PyTree, tokens_to_logits: TokensIdsToLogitsCallable,
                eos_id: int, num_decodes: int = 4, alpha: float = 0.6,
                max_decode_len: Optional[int] = None, decode_rng: Optional[jax.Array] = None,
                cache_offset: int = 0, initial_index: Optional[jax.Array] = None,
                min_log_prob: Optional[float] = None) -> Tuple[jax.Array, jax.Array]:
  """Beam search, t5x's semantics.

  Args:
    inputs: `[b, L]` decoder prompt, shifted right (slot 0 = start), 0 = free position.
    cache: t5x-style cache mapping for `b` rows (tiled to `b * k` here).
    tokens_to_logits: `DecodingState -> ([b * k, V] logits, new cache)`; `cur_index` is a scalar.
    eos_id: end-of-sequence id.
    num_decodes: beam size k (>= 1).
    alpha: length-penalty exponent.
    max_decode_len: tokens per beam (default L).
    decode_rng: unused (as in t5x).
    cache_offset: axis of the batch in the cache leaves.
    initial_index, min_log_prob: later t5x versions' arguments; anything but None raises
      NotImplementedError.

  Returns:
    (`[b, k, max_decode_len]` beams, `[b, k]` scores), ascending; a batch entry without a
    finished beam returns its live beams with raw log-probs.
  """
  del decode_rng
  for name, value in (('initial_index', initial_index), ('min_log_prob', min_log_prob)):
    if value is not None:
      raise NotImplementedError(f'beam_search({name}=...) is not supported by gqa-spec\'s t5x port')
  if jnp.ndim(inputs) != 2:
    raise ValueError(f'inputs must be [batch, length], got shape {jnp.shape(inputs)}')
  if int(num_decodes) != num_decodes or num_decodes < 1:
    raise ValueError(f'num_decodes (the beam size) must be a positive integer, got {num_decodes}')
  k = int(num_decodes)
  batch, length = inputs.shape
  max_decode_len = length if max_decode_len is None else int(max_decode_len)
  width = max_decode_len + 1  # the start slot first
  prompt = jnp.zeros((batch, width + 1), jnp.int32).at[:, :min(length, width + 1)].set(
      jnp.asarray(inputs, jnp.int32)[:, :width + 1])  # [b, W + 1]
  off = cache_offset

  def logits_fn(state, seqs, cur):
    ids = jax.lax.dynamic_slice_in_dim(seqs, cur, 1, axis=1)  # [b * k, 1]
    return tokens_to_logits(DecodingState(cur_index=cur, sequences=seqs, cur_token=ids,
                                          cache=state))  # ([b * k, V], cache)

  def reorder(state, rows):  # rows [b * k] of the flattened beams
    return cache_map(lambda x: jnp.take(x, rows, axis=off), state, off)

  final = search(logits_fn, reorder, cache_map(lambda x: jnp.repeat(x, k, axis=off), cache, off),
                 batch=batch, beam_size=k, max_decode_len=max_decode_len, alpha=alpha,
                 eos_id=eos_id, prompt=prompt)
  any_finished = jnp.any(final.finished_flags, axis=1)  # [b]
  seqs = jnp.where(any_finished[:, None, None], final.finished_seqs, final.live_seqs)
  scores = jnp.where(any_finished[:, None], final.finished_scores, final.live_logprobs)
  return seqs[:, :, 1:], scores
