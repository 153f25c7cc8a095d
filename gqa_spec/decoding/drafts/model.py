"""A smaller T5 (same vocabulary) as the draft: its own encoder pass once per input, its own cache.

With n = lengths, the sequence is s_0..s_n and the draft's cache holds s_0..s_{m-1}, m in
{n - 1, n}. `propose` feeds the one or two pending tokens as one 2-token append (a junk second
token rolled back at once), reads q_1 there, then feeds x_1..x_{gamma-1} one at a time. After
verification the new sequence agrees with the cache on its first `min(index, new_lengths)` slots,
where `commit` rolls back to; two tokens are pending exactly when all gamma were accepted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from gqa_spec.decoding import sampling
from gqa_spec.decoding.targets import T5Decoder, T5State
from gqa_spec.models.t5 import Transformer

PyTree = Any


def feed_pending(decoder: Any, state: PyTree, sequences: jax.Array, lengths: jax.Array):
  """A proposal's first call: the 1 or 2 pending tokens fed as one 2-token append (module
  docstring). Returns the `[b, V]` logits after s_n and the state holding s_0..s_n."""
  m = decoder.index(state)  # [b]
  pending = lengths + 1 - m  # [b] in {1, 2}
  feed = jnp.take_along_axis(sequences, m[:, None] + jnp.arange(2), axis=1)  # [b, 2]
  logits, state = decoder.tokens_to_logits(state, feed)  # [b, 2, V]
  logits = jnp.take_along_axis(logits, (pending - 1)[:, None, None], axis=1)[:, 0]  # [b, V]
  return logits, decoder.rollback(state, lengths + 1)  # forget the junk slot


@dataclasses.dataclass(frozen=True)
class ModelDraft:
  """Autoregressive model draft over any `T5Decoder`-like decoder binding."""

  decoder: Any  # a `targets.Decoder`; T5Decoder for T5 drafts

  @classmethod
  def t5(cls, model: Transformer) -> 'ModelDraft':
    return cls(T5Decoder(model))

  def init(self, params: PyTree, encoder_input_tokens: jax.Array, max_decode_len: int,
           gamma: int) -> T5State:
    """Encodes once; cache of `max_decode_len + gamma + 2` slots so no write ever clamps."""
    return self.decoder.init(params, encoder_input_tokens, max_decode_len + gamma + 2)

  def propose(self, state, sequences, lengths, rng, gamma, config):
    logits, state = feed_pending(self.decoder, state, sequences, lengths)  # [b, V]
    rngs = jax.random.split(rng, gamma)
    token, q = sampling.choose(rngs[0], logits, config)  # [b], [b, V]

    def step(carry, step_rng):
      st, tok = carry
      lg, st = self.decoder.tokens_to_logits(st, tok[:, None])  # [b, 1, V]
      nxt, qn = sampling.choose(step_rng, lg[:, 0], config)
      return (st, nxt), (nxt, qn)

    (state, _), (rest, rest_q) = jax.lax.scan(step, (state, token), rngs[1:])  # [gamma-1, b(, V)]
    tokens = jnp.concatenate([token[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)  # [b, gamma]
    q = jnp.concatenate([q[:, None], jnp.swapaxes(rest_q, 0, 1)], axis=1)  # [b, gamma, V]
    return tokens, q, state

  def propose_upto(self, state, sequences, lengths, rng, gamma_max, config, want, confidence):
    """Up to `want[r]` tokens per row, in as many calls as the longest row needs (`adaptive.py`).

    Row r stops after x_i when i == want[r] or (confidence > 0) when the draft's top probability
    at x_i (temperature 1) is below `confidence`, x_i kept (HF's `assistant_confidence_threshold`).
    The first call, feeding the pending tokens, is always made; at `gamma_max` 1 it is all.

    Returns:
      (`[b, gamma_max]` tokens, `[b, gamma_max, V]` q (zeros past a row's proposal), `[b]` tokens
       each row proposed, `[]` decode calls made, state).
    """
    batch = lengths.shape[0]
    rngs = jax.random.split(rng, gamma_max)

    def pick(i, logits, tokens, q, live, count):
      """Draws x_{i+1} from `[b, V]` logits into slot i for the rows still proposing."""
      tok, qi = sampling.choose(rngs[i], logits, config)  # [b], [b, V]
      tokens = jax.lax.dynamic_update_slice(tokens, tok[:, None], (0, i))  # [b, gamma_max]
      q = jax.lax.dynamic_update_slice(q, (qi * live[:, None])[:, None], (0, i, 0))
      count = count + live  # [b]
      live = live & (count < want)  # [b]
      if confidence > 0:  # a static setting (`AdaptiveGamma.confidence`): no softmax without it
        live &= jnp.max(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), axis=-1) >= confidence
      return tok, tokens, q, live, count

    logits, state = feed_pending(self.decoder, state, sequences, lengths)  # [b, V]
    vocab = logits.shape[-1]
    tokens = jnp.zeros((batch, gamma_max), jnp.int32)
    q = jnp.zeros((batch, gamma_max, vocab), jnp.float32)
    live, count = want > 0, jnp.zeros((batch,), jnp.int32)
    tok, tokens, q, live, count = pick(0, logits, tokens, q, live, count)
    if gamma_max == 1:
      return tokens, q, count, jnp.ones((), jnp.int32), state

    def cond(c):
      return (c[0] < gamma_max) & jnp.any(c[5])

    def body(c):
      i, st, tok, tokens, q, live, count = c
      lg, st = self.decoder.tokens_to_logits(st, tok[:, None])  # [b, 1, V]
      tok, tokens, q, live, count = pick(i, lg[:, 0], tokens, q, live, count)
      return i + 1, st, tok, tokens, q, live, count

    i, state, _, tokens, q, _, count = jax.lax.while_loop(
        cond, body, (jnp.ones((), jnp.int32), state, tok, tokens, q, live, count))
    return tokens, q, count, i, state

  def commit(self, state, sequences, lengths):
    del sequences
    return self.decoder.rollback(state, jnp.minimum(self.decoder.index(state), lengths))
