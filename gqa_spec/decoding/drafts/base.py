"""The `Draft` protocol: what the speculative loop needs from any proposer.

A draft is a hashable, static object (a `jax.jit` static argument) with an explicit state pytree
it creates itself (`init`). It sees the generated tokens only through the loop's buffer
(`sequences [b, T]`, slot 0 the start token, and `lengths [b]`):

  propose(state, sequences, lengths, rng, gamma, config) -> (tokens [b, gamma], q [b, gamma, V], state)
      each row's gamma next tokens and the adjusted distributions they were drawn from (one-hot
      for deterministic drafts); at temperature 0 the tokens are the argmax of q.
  commit(state, sequences, lengths) -> state
      after verification: roll back (or advance) to the accepted prefix.

A draft that reads the target's hidden states (Chimera) sets `reads_target_hidden = True` and has
`observe(state, hidden [b, gamma + 1, D], start [b]) -> state`. Tree drafts implement
`propose_tree` / `commit_tree` instead (`tree_speculative.TreeDraft`).
"""

from __future__ import annotations

from typing import Any, Protocol, Tuple

import jax
import jax.numpy as jnp

from gqa_spec.decoding.sampling import SamplingConfig

PyTree = Any


class Draft(Protocol):
  """Proposes gamma tokens per row; rolls back to the accepted prefix."""

  def propose(self, state: PyTree, sequences: jax.Array, lengths: jax.Array, rng: jax.Array,
              gamma: int, config: SamplingConfig) -> Tuple[jax.Array, jax.Array, PyTree]:
    ...

  def commit(self, state: PyTree, sequences: jax.Array, lengths: jax.Array) -> PyTree:
    ...


def last_tokens(sequences: jax.Array, lengths: jax.Array, n: int) -> jax.Array:
  """`[b, n]` the last n tokens of each row (slot 0 = start token; earlier slots clip to 0)."""
  offsets = lengths[:, None] - (n - 1) + jnp.arange(n)  # [b, n]
  return jnp.take_along_axis(sequences, jnp.maximum(offsets, 0), axis=1)  # [b, n]
