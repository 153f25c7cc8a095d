"""A smaller T5 (same vocabulary) as the draft: its own encoder pass once per input, its own cache.

Which tokens the draft's cache holds (the classic off-by-one): with `n = lengths` generated tokens,
the sequence is s_0 = start, s_1..s_n. Before proposing, the cache holds s_0..s_{m-1} with
m in {n - 1, n}: one or two tokens (s_m..s_n) are pending. The first call of `propose` feeds the
pending tokens as one 2-token append (a row with one pending token appends a junk second token
whose slot is rolled back at once and which its real token cannot see, the mask being causal) and
reads q_1 at the last pending token; the next gamma - 1 calls feed x_1..x_{gamma-1} one at a time.
The cache then holds s_0..s_n, x_1..x_{gamma-1}: index n + gamma. After verification accepts
k tokens and appends t, the new sequence agrees with the cache on its first n + 1 + min(k, gamma-1)
slots, which is `min(index, new_lengths)`: `commit` rolls back to that. Two tokens are pending
exactly when all gamma were accepted (x_gamma was never fed to the draft), else one.

On batched hardware every row is computed each step; done rows are rolled back by `commit` so they
never change, but they do not save draft compute (the loop ends when all rows are done).
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
    m = self.decoder.index(state)  # [b]
    pending = lengths + 1 - m  # [b] in {1, 2}
    feed = jnp.take_along_axis(sequences, m[:, None] + jnp.arange(2), axis=1)  # [b, 2]
    logits, state = self.decoder.tokens_to_logits(state, feed)  # [b, 2, V]
    logits = jnp.take_along_axis(logits, (pending - 1)[:, None, None], axis=1)[:, 0]  # [b, V]
    state = self.decoder.rollback(state, m + pending)  # forget the junk slot
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

  def commit(self, state, sequences, lengths):
    del sequences
    return self.decoder.rollback(state, jnp.minimum(self.decoder.index(state), lengths))
