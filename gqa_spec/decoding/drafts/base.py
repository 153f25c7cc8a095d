"""The `Draft` protocol: what the speculative loop needs from any proposer.

A draft is a hashable, static object (a `jax.jit` static argument) plus an explicit state pytree
it creates itself (`init` differs per draft: parameters, tables, encoder tokens). Inside the loop
it sees the generated sequences only through the loop's buffer:

  sequences [b, T]: slot 0 the decoder start token, slots 1..lengths the tokens generated so far;
  lengths [b]:      generated tokens per row.

  propose(state, sequences, lengths, rng, gamma, config) -> (tokens [b, gamma], q [b, gamma, V], state)
      gamma continuation tokens of each row and the adjusted distributions they were drawn from
      (`sampling.adjust_logits` with the same `config` as the target; one-hot for deterministic
      drafts). At temperature 0 the tokens must be the argmax of q.
  commit(state, sequences, lengths) -> state
      called after verification with the updated buffer and lengths: roll back (or advance) to the
      accepted prefix. Rows that are done arrive with unchanged lengths.

Staged (tree) and Chimera drafts implement the same two methods. A draft that reads the target's
final hidden states (Chimera) also sets `reads_target_hidden = True` and defines
  observe(state, hidden [b, gamma + 1, D], start [b]) -> state
      the hidden states of the verification call's gamma + 1 inputs, fed at positions start..;
the loop then verifies with `target.tokens_to_logits_and_hidden` (the same single pass).
The staged draft (`staged.py`) implements the same two methods. Tree drafts implement
`propose_tree` / `commit_tree` instead (`decoding/tree_speculative.py`: a `tree.Tree` of tokens,
parents, depths, validity and each node's q; `tree.grow` builds one from any per-level scorer).
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


def one_hot(tokens: jax.Array, vocab_size: int) -> jax.Array:
  """`[b, gamma]` -> `[b, gamma, V]` float32: the q of a deterministic draft."""
  return jax.nn.one_hot(tokens, vocab_size, dtype=jnp.float32)
