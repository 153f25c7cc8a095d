"""A model draft that grows token trees: one decode call per tree level for all of its nodes.

Cache bookkeeping extends `model.py`'s: before proposing, the cache holds s_0..s_{m-1}, m in
{n - 1, n}; the pending tokens go in as one 2-token append whose last real token gives the root's
logits, and the cache is rolled back to `base = n + 1` slots. Level d's expanded nodes are then
appended at the next slots with positions n + d and a `[b, F, L]` slot mask (the prefix, their
ancestors' slots, themselves), so a level never sees its cousins. `commit_tree` moves the accepted
path's fed nodes (a prefix of the path: a node with children was fed) to slots base, base + 1, ...
and rolls back to `min(base + moved, new length)`, leaving one or two tokens pending as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding import tree as tree_lib
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models.t5 import Transformer

PyTree = Any


@flax.struct.dataclass
class TreeDraftState:
  decoder_state: PyTree
  base: jax.Array  # [b] slot of the first tree node (n + 1 at the last proposal)
  fed: jax.Array  # [b, N] each node's index among the fed nodes of the last tree, -1 if not fed


@dataclasses.dataclass(frozen=True)
class TreeModelDraft:
  """Tree-growing draft over any decoder binding (`T5Decoder` for T5 drafts, tables in tests)."""

  decoder: Any

  @classmethod
  def t5(cls, model: Transformer) -> 'TreeModelDraft':
    return cls(T5Decoder(model))

  @staticmethod
  def cache_slots(max_decode_len: int, shape: tree_lib.TreeShape) -> int:
    """`max_decode_len + num_fed + 2` slots: the prefix, the pending pair and the fed nodes."""
    return max_decode_len + shape.num_fed + 2

  def init_state(self, decoder_state: PyTree, shape: tree_lib.TreeShape) -> TreeDraftState:
    """Wraps a decoder state (index 0) of at least `cache_slots(...)` slots."""
    batch = self.decoder.index(decoder_state).shape[0]
    return TreeDraftState(decoder_state=decoder_state, base=jnp.zeros((batch,), jnp.int32),
                          fed=jnp.full((batch, shape.num_nodes), -1, jnp.int32))

  def init(self, params: PyTree, encoder_input_tokens: jax.Array, max_decode_len: int,
           shape: tree_lib.TreeShape) -> TreeDraftState:
    """T5 drafts: encodes once and sizes the cache for `shape`."""
    state = self.decoder.init(params, encoder_input_tokens, self.cache_slots(max_decode_len, shape))
    return self.init_state(state, shape)

  def propose_tree(self, state: TreeDraftState, sequences, lengths, rng, shape, config):
    dec = state.decoder_state
    m = self.decoder.index(dec)  # [b]
    pending = lengths + 1 - m  # [b] in {1, 2}
    feed = jnp.take_along_axis(sequences, m[:, None] + jnp.arange(2), axis=1)  # [b, 2]
    logits, dec = self.decoder.tokens_to_logits(dec, feed)  # [b, 2, V]
    root = jnp.take_along_axis(logits, (pending - 1)[:, None, None], axis=1)[:, 0]  # [b, V]
    base = lengths + 1
    dec = self.decoder.rollback(dec, base)  # forget the junk slot
    slots = jnp.arange(self.decoder.cache_length(dec), dtype=jnp.int32)  # [L]
    batch = lengths.shape[0]

    def feed_level(carry, tokens, parent, d):  # tokens, parent [b, F]
      dec, prev_slots, prev_anc = carry  # [b], [b, F_prev], [b, F_prev, D]
      width = tokens.shape[1]
      if d == 1:
        anc = jnp.full((batch, width, shape.depth), -1, jnp.int32)
      else:  # the parent's ancestors, then the parent's own slot at column d - 2
        p = jnp.maximum(parent, 0)
        anc = jnp.take_along_axis(prev_anc, p[..., None], axis=1)  # [b, F, D]
        anc = anc.at[:, :, d - 2].set(jnp.take_along_axis(prev_slots, p, axis=1))
      own = self.decoder.index(dec)[:, None] + jnp.arange(width, dtype=jnp.int32)  # [b, F]
      visible = ((slots[None, None] < base[:, None, None])
                 | jnp.any(slots[None, None, :, None] == anc[:, :, None, :], axis=-1)
                 | (slots[None, None] == own[..., None]))  # [b, F, L]
      positions = jnp.broadcast_to(lengths[:, None] + d, tokens.shape)  # [b, F]
      logits, dec = self.decoder.tokens_to_logits(dec, tokens, positions, visible)  # [b, F, V]
      return logits, (dec, own, anc)

    carry = (dec, jnp.zeros((batch, 1), jnp.int32),
             jnp.full((batch, 1, shape.depth), -1, jnp.int32))
    tree, fed, (dec, _, _) = tree_lib.grow(shape, rng, root, feed_level, carry, config)
    return tree, TreeDraftState(decoder_state=dec, base=base, fed=fed)

  def commit_tree(self, state: TreeDraftState, sequences, lengths, path):
    del sequences
    fed = jnp.where(path >= 0, jnp.take_along_axis(state.fed, jnp.maximum(path, 0), axis=1), -1)
    moved = jnp.sum(jnp.cumprod((fed >= 0).astype(jnp.int32), axis=1), axis=1)  # [b]
    dest = state.base[:, None] + jnp.arange(path.shape[1], dtype=jnp.int32)  # [b, D]
    source = jnp.where(fed >= 0, state.base[:, None] + fed, dest)  # [b, D]
    dec = self.decoder.move_slots(state.decoder_state, state.base, source)
    dec = self.decoder.rollback(dec, jnp.minimum(state.base + moved, lengths))
    return state.replace(decoder_state=dec)
