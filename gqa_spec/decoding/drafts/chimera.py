"""Chimera as a draft: heads 1..gamma of one draft forward propose the next gamma tokens (a chain),
or head d's top-k tokens the children of every depth d - 1 node (a token tree, `ChimeraTreeDraft`).

The draft reads the target's final hidden states from each verification call
(`reads_target_hidden`: no second target pass). `observe` writes the hidden states of the call's
inputs (chain: s_n, x_1..x_gamma; tree: the root and the accepted path) to slots n.. of the
draft's buffer; slots past the accepted prefix hold junk the network never reads (a query at
position N sees h_i, i < N), so `commit` has nothing to roll back. Each q_i is conditioned on the
accepted prefix only, which chain and tree verification both allow. The first iteration has no
hidden state yet: h_{-1} = 0, as in training.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding import sampling, tree as tree_lib
from gqa_spec.models.chimera import Chimera, ChimeraConfig, trigram_table

PyTree = Any


@flax.struct.dataclass
class ChimeraDraftState:
  params: PyTree
  table: jax.Array  # [3, V, F] the trigram lookup table (`models.chimera.trigram_table`)
  hidden: jax.Array  # [b, W, D] target final hidden states by position (W = the loop's width)


@dataclasses.dataclass(frozen=True)
class ChimeraDraft:
  """A trained Chimera network as a `Draft` of the chain speculative loop."""

  config: ChimeraConfig
  reads_target_hidden: ClassVar[bool] = True

  def init(self, params: PyTree, embedding: jax.Array, batch: int, max_decode_len: int,
           table: Optional[jax.Array] = None) -> ChimeraDraftState:
    """An empty hidden-state buffer wide enough for the loop at any gamma <= num_draft_heads, and
    the trigram lookup table from `embedding` (the target's, frozen): drafting gathers from it.
    `table`: `trigram_table(params, embedding)` computed once by a caller that inits many times
    (the paper precomputes it once per draft)."""
    width = 2 + max_decode_len + self.config.num_draft_heads  # >= `speculative.decode`'s buffer
    if table is None:
      table = jax.jit(trigram_table)(params, jnp.asarray(embedding, jnp.float32))  # [3, V, F]
    return ChimeraDraftState(params=params, table=table,
                             hidden=jnp.zeros((batch, width, self.config.emb_dim), jnp.float32))

  def _check_depth(self, gamma: int) -> None:
    if not 1 <= gamma <= self.config.num_draft_heads:
      raise ValueError(f'gamma {gamma} needs 1..{self.config.num_draft_heads} Chimera heads '
                       f'(the draft was trained with {self.config.num_draft_heads})')

  def head_logits(self, state: ChimeraDraftState, sequences: jax.Array, lengths: jax.Array,
                  num_heads: int) -> jax.Array:
    """`[b, n, V]`: head i's logits for s_{N+i} at each row's position N = `lengths`, i <= n.

    Only the first `num_heads` heads are projected onto the vocabulary (the paper drafts gamma
    tokens with gamma heads), and the trigram encoder reads the state's lookup table.
    """
    width = state.hidden.shape[1]
    # The loop's buffer is narrower (2 + max_decode_len + gamma); slots past a row's length are
    # never read, so padding (or cropping a wider caller's buffer) changes nothing.
    tokens = jnp.pad(sequences, ((0, 0), (0, max(0, width - sequences.shape[1]))))[:, :width]
    _, logits = Chimera(self.config).apply(
        {'params': state.params}, None, tokens, state.hidden, lengths[:, None],
        num_heads=num_heads, table=state.table)  # [b, 1, n, V]
    return logits[:, 0]

  def propose(self, state, sequences, lengths, rng, gamma, config):
    self._check_depth(gamma)
    logits = self.head_logits(state, sequences, lengths, gamma)  # [b, gamma, V]
    tokens, q = sampling.choose(rng, logits, config)  # [b, gamma], [b, gamma, V]
    return tokens, q, state

  def observe(self, state: ChimeraDraftState, hidden: jax.Array,
              start: jax.Array) -> ChimeraDraftState:
    """Stores a verification call's hidden states `[b, k, D]`, fed at positions `start [b]`."""
    buffer = jax.vmap(lambda row, new, i: jax.lax.dynamic_update_slice(row, new, (i, 0)))(
        state.hidden, hidden.astype(jnp.float32), start)  # [b, W, D]
    return state.replace(hidden=buffer)

  def commit(self, state, sequences, lengths):
    del sequences, lengths  # the buffer is read below each row's length only
    return state


@dataclasses.dataclass(frozen=True)
class ChimeraTreeDraft(ChimeraDraft):
  """Chimera as a tree draft (`propose_tree` / `commit_tree`): depth d's children from head d."""

  def propose_tree(self, state, sequences, lengths, rng, shape, config):
    self._check_depth(shape.depth)
    logits = self.head_logits(state, sequences, lengths, shape.depth)  # [b, depth, V]

    def feed(carry, tokens, parent, d):  # the children of depth-d nodes: head d + 1, any parent
      del parent
      return jnp.broadcast_to(logits[:, None, d], tokens.shape + logits.shape[-1:]), carry

    tree, _, _ = tree_lib.grow(shape, rng, logits[:, 0], feed, None, config)  # [b, N] nodes
    return tree, state

  def commit_tree(self, state, sequences, lengths, path):
    del sequences, lengths, path  # as `commit`: the buffer is read below each row's length only
    return state
