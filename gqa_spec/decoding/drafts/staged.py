"""Staged speculation (Spector & Re 2023, sec. 3.2): a model draft whose own generation is itself
speculated by an n-gram draft-of-draft.

`StagedDraft` proposes what `ModelDraft` proposes (the tokens and the draft's full q at each
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
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models.t5 import Transformer

PyTree = Any


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
