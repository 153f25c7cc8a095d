"""Copy / prompt-lookup draft: find the last generated n-gram in the encoder input, propose what followed.

For n = max_ngram down to 1, the first n for which the row's last n generated tokens occur in the
encoder input wins, at their first
occurrence; the proposal is the gamma input tokens after it (EOS past the input's end or padding).
Without any match the proposal is gamma EOS tokens. Deterministic: q is one-hot.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from gqa_spec.decoding.autoregressive import EOS, PAD
from gqa_spec.decoding.drafts.base import last_tokens


@dataclasses.dataclass(frozen=True)
class CopyDraft:
  """Prompt lookup over `[b, S]` encoder input tokens (the state)."""

  vocab_size: int
  max_ngram: int = 3
  eos_id: int = EOS

  def init(self, encoder_input_tokens: jax.Array) -> jax.Array:
    return jnp.asarray(encoder_input_tokens, jnp.int32)  # [b, S]

  def propose(self, state, sequences, lengths, rng, gamma, config):
    del rng, config
    enc = state  # [b, S]
    batch, length = enc.shape
    padded = jnp.concatenate([enc, jnp.full((batch, gamma + self.max_ngram), PAD, jnp.int32)],
                             axis=1)  # [b, S + gamma + N]
    starts = jnp.arange(length)  # [S] candidate match starts
    found = jnp.zeros((batch,), bool)
    follow = jnp.zeros((batch,), jnp.int32)  # index of the first proposed input token
    for n in range(self.max_ngram, 0, -1):
      tail = last_tokens(sequences, lengths, n)  # [b, n]
      windows = jnp.stack([padded[:, j:j + length] for j in range(n)], axis=-1)  # [b, S, n]
      match = jnp.all(windows == tail[:, None, :], axis=-1)  # [b, S]
      match &= (starts[None] + n <= length) & (lengths[:, None] >= n)  # inside the input; enough history
      match &= windows[..., -1] != PAD
      hit = jnp.any(match, axis=1)  # [b]
      first = jnp.argmax(match, axis=1) + n  # [b]
      follow = jnp.where(~found & hit, first, follow)
      found |= hit
    idx = follow[:, None] + jnp.arange(gamma)  # [b, gamma]
    tokens = jnp.take_along_axis(padded, idx, axis=1)  # [b, gamma]
    tokens = jnp.where(found[:, None] & (tokens != PAD), tokens, self.eos_id)
    # After the first EOS keep proposing EOS (a row cannot continue past it anyway).
    return tokens, jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32), state  # q

  def commit(self, state, sequences, lengths):
    return state
