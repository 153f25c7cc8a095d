"""`beam_search` with `t5x.decoding.beam_search`'s signature, defaults and semantics.

Reference: t5x's `t5x/decoding.py` (`beam_search`, `beam_init`, `gather_topk_beams`) and the
scenarios of its `decoding_test.py`. Every step scores the k x V continuations of the live beams,
keeps the 2k best (prompt positions are forced: the best candidate continues with the prompt token
at log-prob +0, the others get NEG_INF), sends those ending in EOS to the finished set (scored
log p / ((5 + len) / 6) ** alpha) and keeps the best k others alive, gathering their cache rows.
It stops after `max_decode_len` tokens or when no live beam (bounded by the penalty at the
maximal length) can beat the worst finished one. Returns `[b, k, max_decode_len]` sequences and
`[b, k]` scores, both in ascending score order (best last, as t5x); batch entries without a
finished beam return their live beams with raw log-probs.

One difference, outside t5x's documented behaviour: t5x reads the forced token at
`inputs[:, cur_index + 1]` and so, at the last step, clamps that read to `inputs[:, L - 1]`; here
the prompt is zero-padded, so a position past the prompt is always free.

The loop is `gqa_spec.decoding.beam_search.search` (the one gqa-spec's own beam search runs);
this module adapts t5x's arguments, cache and return order to it. Its `BeamState.cache` holds the
cache with the beams flattened into the batch axis (`[.., b * k, ...]`), as `tokens_to_logits`
sees it.
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
  """Beam search, t5x's semantics (see the module docstring).

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
    initial_index, min_log_prob: arguments of later t5x versions whose semantics this port has
      not been checked against: anything but None raises NotImplementedError.

  Returns:
    (`[b, k, max_decode_len]` beams, `[b, k]` scores), ascending.
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
  # [b, W + 1]: zero-padded so that the prompt read at cur_index + 1 never clamps.
  prompt = jnp.zeros((batch, width + 1), jnp.int32).at[:, :min(length, width + 1)].set(
      jnp.asarray(inputs, jnp.int32)[:, :width + 1])
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
