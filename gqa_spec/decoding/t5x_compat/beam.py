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

A separate loop from `gqa_spec.decoding.beam_search` (which drives gqa-spec's `Decoder` protocol
and has no prompt forcing); the finished-set and stopping rules are the same.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding.beam_search import brevity_penalty
from gqa_spec.decoding.t5x_compat.common import (NEG_INF, DecodingState,
                                                 TokensIdsToLogitsCallable, cache_map)

PyTree = Any


@flax.struct.dataclass
class BeamState:
  """t5x's `BeamState` (sequences `[b, k, W]`, W = max_decode_len + 1, slot 0 the start token)."""

  cur_index: jax.Array  # []
  live_logprobs: jax.Array  # [b, k] ascending
  finished_scores: jax.Array  # [b, k] ascending
  live_seqs: jax.Array  # [b, k, W]
  finished_seqs: jax.Array  # [b, k, W]
  finished_flags: jax.Array  # [b, k]
  cache: PyTree  # leaves [..., b, k, ...] (beam axis at cache_offset + 1)


def _gather(x: jax.Array, idx: jax.Array, axis: int = 1) -> jax.Array:
  """`x [.., b, m, ...]` (beam axis `axis`), `idx [b, j]` -> `[.., b, j, ...]`."""
  shape = [1] * x.ndim
  shape[axis - 1], shape[axis] = idx.shape
  idx = idx.reshape(shape)
  return jnp.take_along_axis(x, jnp.broadcast_to(idx, x.shape[:axis] + idx.shape[axis:axis + 1]
                                                 + x.shape[axis + 1:]), axis=axis)


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
  seqs0 = jnp.zeros((batch, k, width), jnp.int32)
  init = BeamState(
      cur_index=jnp.zeros((), jnp.int32),
      live_logprobs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1)),
      finished_scores=jnp.full((batch, k), NEG_INF, jnp.float32),
      live_seqs=seqs0, finished_seqs=seqs0, finished_flags=jnp.zeros((batch, k), bool),
      cache=cache_map(lambda x: jnp.repeat(jnp.expand_dims(x, off + 1), k, axis=off + 1), cache,
                      off))

  def flatten(x):  # [.., b, k, ...] -> [.., b * k, ...]
    return x.reshape(x.shape[:off] + (-1,) + x.shape[off + 2:])

  def unflatten(x):  # [.., b * k, ...] -> [.., b, k, ...]
    return x.reshape(x.shape[:off] + (batch, k) + x.shape[off + 1:])

  def cond(s: BeamState):
    best_live = s.live_logprobs[:, -1:] / brevity_penalty(alpha, width)  # [b, 1]
    worst_finished = jnp.min(s.finished_scores, axis=1, keepdims=True)  # [b, 1]
    worst_finished = jnp.where(s.finished_flags, worst_finished, NEG_INF)  # [b, k]
    terminated = jnp.all(worst_finished > best_live)
    return (s.cur_index < width - 1) & ~terminated

  def body(s: BeamState) -> BeamState:
    cur = s.cur_index
    ids = jax.lax.dynamic_slice_in_dim(s.live_seqs, cur, 1, axis=2).reshape(batch * k, 1)
    logits, new_cache = tokens_to_logits(DecodingState(
        cur_index=cur, sequences=s.live_seqs.reshape(batch * k, width), cur_token=ids,
        cache=cache_map(flatten, s.cache, off)))  # [b * k, V]
    new_cache = cache_map(unflatten, new_cache, off)
    vocab = logits.shape[-1]
    log_probs = (jax.nn.log_softmax(logits.reshape(batch, k, vocab))
                 + s.live_logprobs[:, :, None])  # [b, k, V]
    top_lp, top_idx = jax.lax.top_k(log_probs.reshape(batch, k * vocab), 2 * k)  # [b, 2k]
    forced = jax.lax.dynamic_index_in_dim(prompt, cur + 1, axis=1, keepdims=False)  # [b]
    free = (forced == 0)[:, None]  # [b, 1]
    # Inside the prompt only the best candidate survives, with the prompt token at +0.
    inside = jnp.full((batch, 2 * k), NEG_INF, top_lp.dtype).at[:, 0].set(0.0)
    top_lp = jnp.where(free, top_lp, inside)  # [b, 2k]
    top_ids = jnp.where(free, top_idx % vocab, forced[:, None]).astype(jnp.int32)  # [b, 2k]
    origin = top_idx // vocab  # [b, 2k] live beam each candidate extends
    top_seqs = _gather(s.live_seqs, origin)  # [b, 2k, W]
    top_seqs = jax.lax.dynamic_update_slice_in_dim(top_seqs, top_ids[:, :, None], cur + 1, axis=2)
    new_finished = top_ids == eos_id  # [b, 2k]

    alive_lp = top_lp + new_finished * NEG_INF  # [b, 2k]
    pick = jnp.flip(jax.lax.top_k(alive_lp, k)[1], axis=1)  # [b, k] ascending
    live_seqs, live_lp = _gather(top_seqs, pick), _gather(alive_lp, pick)
    parents = _gather(origin, pick)  # [b, k]
    cache = cache_map(lambda x: _gather(x, parents, off + 1), new_cache, off)

    scores = top_lp / brevity_penalty(alpha, cur + 1) + (~new_finished) * NEG_INF  # [b, 2k]
    all_seqs = jnp.concatenate([s.finished_seqs, top_seqs], axis=1)  # [b, 3k, W]
    all_scores = jnp.concatenate([s.finished_scores, scores], axis=1)  # [b, 3k]
    all_flags = jnp.concatenate([s.finished_flags, new_finished], axis=1)  # [b, 3k]
    keep = jnp.flip(jax.lax.top_k(all_scores, k)[1], axis=1)  # [b, k] ascending
    return BeamState(cur_index=cur + 1, live_logprobs=live_lp,
                     finished_scores=_gather(all_scores, keep),
                     live_seqs=live_seqs, finished_seqs=_gather(all_seqs, keep),
                     finished_flags=_gather(all_flags, keep), cache=cache)

  final = jax.lax.while_loop(cond, body, init)
  any_finished = jnp.any(final.finished_flags, axis=1)  # [b]
  seqs = jnp.where(any_finished[:, None, None], final.finished_seqs, final.live_seqs)
  scores = jnp.where(any_finished[:, None], final.finished_scores, final.live_logprobs)
  return seqs[:, :, 1:], scores
