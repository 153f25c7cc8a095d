"""A smaller T5 (same vocabulary) as the draft: its own encoder pass once per input, its own cache;
with a second stage, its own generation speculated by a bigram (`StagedDraft`).

With n = lengths, the sequence is s_0..s_n and the draft's cache holds s_0..s_{m-1}, m in
{n - 1, n}. `propose` feeds the one or two pending tokens as one 2-token append (a junk second
token rolled back at once), reads q_1 there, then feeds x_1..x_{gamma-1} one at a time. After
verification the new sequence agrees with the cache on its first `min(index, new_lengths)` slots,
where `commit` rolls back to; two tokens are pending exactly when all gamma were accepted.

Staged speculation (Spector & Re 2023, sec. 3.2): `StagedDraft` proposes what `ModelDraft` proposes (the tokens and the draft's full q at each
position), but by an inner speculative loop: the bigram proposes g2 tokens after the draft's last
token and the draft scores them in one call, accepting a prefix (greedy: while they are its argmax;
sampling: speculative sampling of q against the bigram's one-hot proposal) and adding its own next
token. The cache follows `ModelDraft`'s rule, rolled back after the inner loop to hold at most
s_0..s_n, x_1..x_{gamma - 1}, so `ModelDraft.commit` applies.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
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


@flax.struct.dataclass
class StagedState:
  decoder_state: PyTree
  successor: jax.Array  # [V] the bigram's next token after each token
  draft_calls: jax.Array  # [] draft decode calls made so far (all rows together)


@dataclasses.dataclass(frozen=True)
class StagedDraft:
  """Model draft with an n-gram second stage.

  Attributes:
    decoder: the draft's decoder binding (`T5Decoder`; `TableDecoder` in tests).
    inner_gamma: g2, bigram tokens the draft verifies per call (>= 1).
  """

  decoder: Any
  inner_gamma: int = 3

  def __post_init__(self):
    if self.inner_gamma < 1:
      raise ValueError(f'inner_gamma must be >= 1, got {self.inner_gamma}')

  @classmethod
  def t5(cls, model: Transformer, inner_gamma: int = 3) -> 'StagedDraft':
    return cls(T5Decoder(model), inner_gamma)

  def cache_slots(self, max_decode_len: int, gamma: int) -> int:
    """Slots so that no write clamps, however far the inner loop runs past gamma."""
    return max_decode_len + gamma + 2 * self.inner_gamma + 3

  def init_state(self, decoder_state: PyTree, successor: jax.Array) -> StagedState:
    return StagedState(decoder_state=decoder_state, successor=jnp.asarray(successor, jnp.int32),
                       draft_calls=jnp.zeros((), jnp.int32))

  def init(self, params: PyTree, encoder_input_tokens: jax.Array, max_decode_len: int, gamma: int,
           successor: jax.Array) -> StagedState:
    """T5 drafts: encodes once; `successor [V]` from `NgramModel.successor()`."""
    state = self.decoder.init(params, encoder_input_tokens, self.cache_slots(max_decode_len, gamma))
    return self.init_state(state, successor)

  def propose(self, state: StagedState, sequences, lengths, rng, gamma, config):
    g2 = self.inner_gamma
    dec = state.decoder_state
    m = self.decoder.index(dec)  # [b] in {n - 1, n}
    # Append s_{n-1} where pending (a row with m = n rewrites s_n at slot n, then forgets it).
    _, dec = self.decoder.tokens_to_logits(
        dec, jnp.take_along_axis(sequences, m[:, None], axis=1))  # [b, 1]
    dec = self.decoder.rollback(dec, lengths)  # holds s_0..s_{n-1}
    batch, vocab = lengths.shape[0], state.successor.shape[0]
    steps = jnp.arange(g2 + 1)  # [g2 + 1]
    exact = dataclasses.replace(config, lenience=1.0)  # the inner loop: lenience is the target's
    width = gamma + g2 + 1  # produced tokens never exceed gamma - 1 + g2 + 1

    def body(carry):
      dec, z, count, tokens, qs, rng, calls = carry  # z [b]: produced, not yet cached
      rng, accept_rng = jax.random.split(rng)
      ys, y = [], z
      for _ in range(g2):  # the bigram's chain after z
        y = state.successor[y]
        ys.append(y)
      y = jnp.stack(ys, axis=1)  # [b, g2]
      index = self.decoder.index(dec)  # [b]
      logits, dec = self.decoder.tokens_to_logits(
          dec, jnp.concatenate([z[:, None], y], axis=1))  # [b, g2 + 1, V]
      q = sampling.adjust_logits(logits, config)  # [b, g2 + 1, V]
      # The draft verifies the bigram's one-hot proposal exactly: y_1..y_j accepted, then t.
      j, t, _ = sampling.verify(accept_rng, y, jax.nn.one_hot(y, vocab, dtype=jnp.float32), logits,
                                exact)  # [b], [b]
      live = count < gamma  # [b] rows still producing
      new = jnp.where(steps[None] < j[:, None], jnp.pad(y, ((0, 0), (0, 1))), t[:, None])  # [b, g2+1]
      put = lambda buf, upd: jax.vmap(lambda row, u, i: jax.lax.dynamic_update_slice(
          row, u, (i,) + (0,) * (row.ndim - 1)))(buf, upd, count)
      new_tokens, new_qs = put(tokens, new), put(qs, q)  # q_0..q_j belong to y_1..y_j, t
      tokens = jnp.where(live[:, None], new_tokens, tokens)
      qs = jnp.where(live[:, None, None], new_qs, qs)
      dec = self.decoder.rollback(dec, jnp.where(live, index + 1 + j, index))  # z, y_1..y_j
      z = jnp.where(live, t, z)
      count = jnp.where(live, count + j + 1, count)
      return dec, z, count, tokens, qs, rng, calls + 1

    z = jnp.take_along_axis(sequences, lengths[:, None], axis=1)[:, 0]  # [b] s_n
    init = (dec, z, jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, width), jnp.int32),
            jnp.zeros((batch, width, vocab), jnp.float32), rng, state.draft_calls + 1)
    dec, _, _, tokens, qs, _, calls = jax.lax.while_loop(
        lambda c: jnp.any(c[2] < gamma), body, init)
    dec = self.decoder.rollback(dec, jnp.minimum(self.decoder.index(dec), lengths + gamma))
    return tokens[:, :gamma], qs[:, :gamma], state.replace(decoder_state=dec, draft_calls=calls)

  def commit(self, state: StagedState, sequences, lengths):
    del sequences
    dec = state.decoder_state
    return state.replace(decoder_state=self.decoder.rollback(
        dec, jnp.minimum(self.decoder.index(dec), lengths)))
