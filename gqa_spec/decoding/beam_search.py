"""Beam search for the evaluation tasks (t5x's `beam_search`: length penalty ((5 + len) / 6)^alpha).

One `jax.jit` over a `lax.while_loop` on a `Decoder` whose state holds `batch * beam_size` rows
(init it from the encoder inputs repeated `beam_size` times, `jnp.repeat(x, k, axis=0)`). Every
step scores all k x V continuations of the alive beams, keeps the best 2k, sends those ending in
EOS to the finished set (scored log p / penalty) and the best k others on as alive beams, gathering
the cache rows they came from (`Decoder.reorder`). It stops at `max_decode_len` or when no alive
beam can beat the worst finished one; batch entries without a finished beam return their alive ones.
"""

from __future__ import annotations

import functools
from typing import Any, Tuple

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding.targets import Decoder
from gqa_spec.decoding import xla_options

PyTree = Any
NEG_INF = -1.0e7
DECODER_START = 0
EOS = 1


def brevity_penalty(alpha: float, length) -> jax.Array:
  """t5x's length penalty ((5 + length) / 6) ** alpha."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


@flax.struct.dataclass
class _State:
  step: jax.Array  # []
  alive_seqs: jax.Array  # [b, k, 1 + L]
  alive_lp: jax.Array  # [b, k]
  fin_seqs: jax.Array  # [b, k, 1 + L]
  fin_scores: jax.Array  # [b, k]
  fin_flags: jax.Array  # [b, k]
  decoder_state: PyTree


@functools.partial(xla_options.jit, static_argnames=('decoder', 'beam_size', 'max_decode_len',
                                                     'alpha', 'eos_id'))
def beam_search(decoder: Decoder, decoder_state: PyTree, *, beam_size: int, max_decode_len: int,
                alpha: float = 0.6, eos_id: int = EOS) -> Tuple[jax.Array, jax.Array]:
  """Beam search.

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
  k = beam_size
  rows = decoder.index(decoder_state).shape[0]
  batch = rows // k
  width = 1 + max_decode_len
  seqs0 = jnp.zeros((batch, k, width), jnp.int32)  # start token 0 = PAD = 0
  init = _State(step=jnp.zeros((), jnp.int32), alive_seqs=seqs0,
                alive_lp=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (batch, 1)),
                fin_seqs=seqs0, fin_scores=jnp.full((batch, k), NEG_INF),
                fin_flags=jnp.zeros((batch, k), bool), decoder_state=decoder_state)

  def cond(s: _State):
    best_alive = s.alive_lp[:, 0] / brevity_penalty(alpha, max_decode_len)  # [b]
    worst_fin = jnp.where(s.fin_flags, s.fin_scores, NEG_INF).min(axis=1)  # [b]
    done = jnp.all(s.fin_flags, axis=1) & (worst_fin > best_alive)  # [b]
    return (s.step < max_decode_len) & ~jnp.all(done)

  def body(s: _State) -> _State:
    tokens = s.alive_seqs[:, :, s.step].reshape(rows, 1)  # [b*k, 1]
    logits, dstate = decoder.tokens_to_logits(s.decoder_state, tokens)  # [b*k, 1, V]
    vocab = logits.shape[-1]
    lp = jax.nn.log_softmax(logits[:, 0].astype(jnp.float32)).reshape(batch, k, vocab)
    cand = (s.alive_lp[:, :, None] + lp).reshape(batch, k * vocab)  # [b, k*V]
    top_lp, top_idx = jax.lax.top_k(cand, 2 * k)  # [b, 2k]
    origin, token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)  # [b, 2k]
    cand_seqs = jnp.take_along_axis(s.alive_seqs, origin[:, :, None], axis=1)  # [b, 2k, W]
    cand_seqs = cand_seqs.at[:, :, s.step + 1].set(token)
    is_eos = token == eos_id  # [b, 2k]

    alive_score = jnp.where(is_eos, NEG_INF, top_lp)  # [b, 2k]
    new_alive_lp, pick = jax.lax.top_k(alive_score, k)  # [b, k]
    alive_seqs = jnp.take_along_axis(cand_seqs, pick[:, :, None], axis=1)  # [b, k, W]
    alive_origin = jnp.take_along_axis(origin, pick, axis=1)  # [b, k]
    flat = (jnp.arange(batch)[:, None] * k + alive_origin).reshape(rows)  # [b*k]
    dstate = decoder.reorder(dstate, flat)

    fin_new = jnp.where(is_eos, top_lp / brevity_penalty(alpha, s.step + 1), NEG_INF)  # [b, 2k]
    all_scores = jnp.concatenate([s.fin_scores, fin_new], axis=1)  # [b, 3k]
    all_seqs = jnp.concatenate([s.fin_seqs, cand_seqs], axis=1)  # [b, 3k, W]
    all_flags = jnp.concatenate([s.fin_flags, is_eos & (top_lp > NEG_INF / 2)], axis=1)
    fin_scores, fin_pick = jax.lax.top_k(jnp.where(all_flags, all_scores, NEG_INF * 2), k)
    return _State(step=s.step + 1, alive_seqs=alive_seqs, alive_lp=new_alive_lp,
                  fin_seqs=jnp.take_along_axis(all_seqs, fin_pick[:, :, None], axis=1),
                  fin_scores=fin_scores,
                  fin_flags=jnp.take_along_axis(all_flags, fin_pick, axis=1),
                  decoder_state=dstate)

  final = jax.lax.while_loop(cond, body, init)
  any_fin = jnp.any(final.fin_flags, axis=1)  # [b]
  alive_scores = final.alive_lp / brevity_penalty(alpha, final.step)  # [b, k]
  seqs = jnp.where(any_fin[:, None, None], final.fin_seqs, final.alive_seqs)
  scores = jnp.where(any_fin[:, None], final.fin_scores, alive_scores)
  return seqs, scores
