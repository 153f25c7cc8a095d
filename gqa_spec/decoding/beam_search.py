"""Beam search with t5x's length penalty ((5 + len) / 6)^alpha: one loop, two faces.

`search` is the loop (its docstring). `beam_search` drives gqa-spec's `Decoder` protocol (the
evaluator's beam decoding) and returns beams best first; `t5x_compat.beam_search` is
`t5x.decoding.beam_search`'s signature over the same loop.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Tuple

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding import xla_options
from gqa_spec.decoding.autoregressive import EOS
from gqa_spec.decoding.sampling import NEG_INF
from gqa_spec.decoding.targets import Decoder

PyTree = Any


def brevity_penalty(alpha: float, length) -> jax.Array:
  """t5x's length penalty ((5 + length) / 6) ** alpha."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


@flax.struct.dataclass
class BeamState:
  """t5x's `BeamState`: sequences `[b, k, W]` (W = max_decode_len + 1, slot 0 the start token),
  every `[b, k]` field in ascending score order; `cache` the decoder state of `b * k` rows."""

  cur_index: jax.Array  # []
  live_logprobs: jax.Array  # [b, k]
  finished_scores: jax.Array  # [b, k]
  live_seqs: jax.Array  # [b, k, W]
  finished_seqs: jax.Array  # [b, k, W]
  finished_flags: jax.Array  # [b, k]
  cache: PyTree


def _gather(x: jax.Array, idx: jax.Array) -> jax.Array:
  """`x [b, m, ...]`, `idx [b, j]` -> `[b, j, ...]`."""
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, jnp.broadcast_to(idx, idx.shape[:2] + x.shape[2:]), axis=1)


def search(logits_fn: Callable[[PyTree, jax.Array, jax.Array], Tuple[jax.Array, PyTree]],
           reorder: Callable[[PyTree, jax.Array], PyTree], state: PyTree, *, batch: int,
           beam_size: int, max_decode_len: int, alpha: float, eos_id: int,
           prompt: Optional[jax.Array] = None) -> BeamState:
  """The beam search loop; traceable, jit it around.

  Every step scores the k x V continuations of the live beams and keeps the 2k best (inside a
  forced prompt only the best, continuing with the prompt token at log-prob 0); those ending in
  EOS join the finished set (scored log p / penalty), the best k others stay alive, their state
  rows gathered. It stops after `max_decode_len` tokens or when no live beam can beat the worst
  finished one. Beams are kept in ascending score order (best last), so ties break as in t5x.

  Args:
    logits_fn: `(state, sequences [b * k, W], cur_index []) -> ([b * k, V] logits, state)`: the
      next-token logits of each row, fed `sequences[:, cur_index]`.
    reorder: `(state, rows [b * k]) -> state`, gathering rows.
    state: the decoder state of `b * k` rows (each input's `k` rows adjacent).
    batch, beam_size: b, k.
    max_decode_len: tokens per beam (W - 1).
    alpha: length-penalty exponent.
    eos_id: end-of-sequence id.
    prompt: `[b, W + 1]` token forced at each position (slot 0 the start), 0 where free; None: all
      free.

  Returns:
    The final `BeamState`.
  """
  k, width = beam_size, max_decode_len + 1
  seqs0 = jnp.zeros((batch, k, width), jnp.int32)
  init = BeamState(
      cur_index=jnp.zeros((), jnp.int32),
      live_logprobs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1)),
      finished_scores=jnp.full((batch, k), NEG_INF, jnp.float32),
      live_seqs=seqs0, finished_seqs=seqs0, finished_flags=jnp.zeros((batch, k), bool),
      cache=state)

  def cond(s: BeamState):
    best_live = s.live_logprobs[:, -1:] / brevity_penalty(alpha, width)  # [b, 1]
    worst_finished = jnp.min(s.finished_scores, axis=1, keepdims=True)  # [b, 1]
    worst_finished = jnp.where(s.finished_flags, worst_finished, NEG_INF)  # [b, k]
    return (s.cur_index < width - 1) & ~jnp.all(worst_finished > best_live)

  def body(s: BeamState) -> BeamState:
    cur = s.cur_index
    logits, cache = logits_fn(s.cache, s.live_seqs.reshape(batch * k, width), cur)  # [b*k, V]
    vocab = logits.shape[-1]
    log_probs = (jax.nn.log_softmax(logits.astype(jnp.float32).reshape(batch, k, vocab))
                 + s.live_logprobs[:, :, None])  # [b, k, V]
    top_lp, top_idx = jax.lax.top_k(log_probs.reshape(batch, k * vocab), 2 * k)  # [b, 2k]
    top_ids = (top_idx % vocab).astype(jnp.int32)  # [b, 2k]
    if prompt is not None:
      forced = jax.lax.dynamic_index_in_dim(prompt, cur + 1, axis=1, keepdims=False)  # [b]
      free = (forced == 0)[:, None]  # [b, 1]
      inside = jnp.full((batch, 2 * k), NEG_INF, top_lp.dtype).at[:, 0].set(0.0)
      top_lp = jnp.where(free, top_lp, inside)  # [b, 2k]
      top_ids = jnp.where(free, top_ids, forced[:, None]).astype(jnp.int32)
    origin = top_idx // vocab  # [b, 2k] the live beam each candidate extends
    top_seqs = _gather(s.live_seqs, origin)  # [b, 2k, W]
    top_seqs = jax.lax.dynamic_update_slice_in_dim(top_seqs, top_ids[:, :, None], cur + 1, axis=2)
    new_finished = top_ids == eos_id  # [b, 2k]

    alive_lp = top_lp + new_finished * NEG_INF  # [b, 2k]
    pick = jnp.flip(jax.lax.top_k(alive_lp, k)[1], axis=1)  # [b, k] ascending
    parents = _gather(origin, pick)  # [b, k]
    cache = reorder(cache, (jnp.arange(batch)[:, None] * k + parents).reshape(batch * k))

    scores = top_lp / brevity_penalty(alpha, cur + 1) + (~new_finished) * NEG_INF  # [b, 2k]
    all_seqs = jnp.concatenate([s.finished_seqs, top_seqs], axis=1)  # [b, 3k, W]
    all_scores = jnp.concatenate([s.finished_scores, scores], axis=1)  # [b, 3k]
    all_flags = jnp.concatenate([s.finished_flags, new_finished], axis=1)  # [b, 3k]
    keep = jnp.flip(jax.lax.top_k(all_scores, k)[1], axis=1)  # [b, k] ascending
    return BeamState(cur_index=cur + 1, live_logprobs=_gather(alive_lp, pick),
                     finished_scores=_gather(all_scores, keep),
                     live_seqs=_gather(top_seqs, pick), finished_seqs=_gather(all_seqs, keep),
                     finished_flags=_gather(all_flags, keep), cache=cache)

  return jax.lax.while_loop(cond, body, init)


@functools.partial(xla_options.jit, static_argnames=('decoder', 'beam_size', 'max_decode_len',
                                                     'alpha', 'eos_id'))
def beam_search(decoder: Decoder, decoder_state: PyTree, *, beam_size: int, max_decode_len: int,
                alpha: float = 0.6, eos_id: int = EOS) -> Tuple[jax.Array, jax.Array]:
  """Beam search on a `Decoder`.

  Args:
    decoder: static decoder binding with `reorder`.
    decoder_state: state of `batch * beam_size` rows (inputs repeated per beam), index 0,
      >= `max_decode_len` slots.
    beam_size: k.
    max_decode_len: most tokens per beam (EOS included).
    alpha: length penalty exponent (t5x default 0.6).
    eos_id: end-of-sequence token.

  Returns:
    (`[b, k, 1 + max_decode_len]` beams best first, slot 0 the start token, PAD after EOS;
     `[b, k]` their length-normalised scores).
  """
  rows = decoder.index(decoder_state).shape[0]

  def logits_fn(state, seqs, cur):
    logits, state = decoder.tokens_to_logits(state, jax.lax.dynamic_slice_in_dim(seqs, cur, 1, 1))
    return logits[:, 0], state  # [b*k, V]

  final = search(logits_fn, decoder.reorder, decoder_state, batch=rows // beam_size,
                 beam_size=beam_size, max_decode_len=max_decode_len, alpha=alpha, eos_id=eos_id)
  any_fin = jnp.any(final.finished_flags, axis=1)  # [b]
  live_scores = final.live_logprobs / brevity_penalty(alpha, final.cur_index)  # [b, k]
  seqs = jnp.where(any_fin[:, None, None], final.finished_seqs, final.live_seqs)
  scores = jnp.where(any_fin[:, None], final.finished_scores, live_scores)
  return jnp.flip(seqs, axis=1), jnp.flip(scores, axis=1)
