"""A model draft that grows token trees: one decode call per tree level for all of its nodes,
optionally with an n-gram second stage that lets it skip levels (staged trees, Spector & Re 2023).

Cache: as `model.py`'s, the pending tokens go in as one 2-token append giving the root's logits,
and the cache rolls back to `base = n + 1` slots. Level d's expanded nodes are appended at the
next slots with positions n + d and a slot mask (prefix, ancestors, self). `commit_tree` moves the
accepted path's slots to base, base + 1, ... and rolls back to `min(base + moved, new length)`.

Second stage (`inner_gamma` g2 > 0, a bigram successor table): each expanded node is fed with the
bigram's chain of g2 tokens after it in the same call, so the call also computes the draft's
logits at those tokens as x's descendants. A node of the next level whose token is its parent's
next chain token is covered (logits and slot exist); a level whose nodes are all covered skips its
draft call (`lax.cond`). The proposals are exactly those without the second stage; `draft_calls`
counts the calls made.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding import tree as tree_lib
from gqa_spec.decoding.drafts.model import feed_pending
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.errors import UserError
from gqa_spec.models.t5 import Transformer

PyTree = Any


@flax.struct.dataclass
class TreeDraftState:
  decoder_state: PyTree
  base: jax.Array  # [b] slot of the first tree node (n + 1 at the last proposal)
  slots: jax.Array  # [b, N] each node's cache slot in the last tree (own or chain), -1 if none
  successor: jax.Array  # [V] the bigram's next token after each token ([1], unused, without g2)
  draft_calls: jax.Array  # [] draft decode calls made so far (all rows together)


@flax.struct.dataclass
class _Level:
  """The expanded nodes of one level, as the next level needs them."""
  slot: jax.Array  # [b, F] each node's cache slot
  anc: jax.Array  # [b, F, D] its ancestors' slots by depth (-1: none)
  chain: jax.Array  # [b, F, g2] its remaining bigram chain (first `remaining` entries valid)
  chain_slot: jax.Array  # [b, F, g2] their slots
  chain_logits: jax.Array  # [b, F, g2, V] the draft's logits at them
  remaining: jax.Array  # [b, F] valid chain entries


@dataclasses.dataclass(frozen=True)
class TreeModelDraft:
  """Tree-growing draft over any decoder binding (`T5Decoder` for T5 drafts, tables in tests).

  Attributes:
    decoder: the draft's decoder binding.
    inner_gamma: g2, bigram tokens fed after each expanded node (0: no second stage).
  """

  decoder: Any
  inner_gamma: int = 0

  def __post_init__(self):
    if self.inner_gamma < 0:
      raise UserError(f'inner_gamma must be >= 0, got {self.inner_gamma}')

  @classmethod
  def t5(cls, model: Transformer, inner_gamma: int = 0) -> 'TreeModelDraft':
    return cls(T5Decoder(model), inner_gamma)

  def cache_slots(self, max_decode_len: int, shape: tree_lib.TreeShape) -> int:
    """The prefix, the pending pair and every level fed with its chains (the worst case)."""
    return max_decode_len + shape.num_fed * (1 + self.inner_gamma) + 2

  def init_state(self, decoder_state: PyTree, shape: tree_lib.TreeShape,
                 successor: Optional[Any] = None) -> TreeDraftState:
    """Wraps a decoder state (index 0) of at least `cache_slots(...)` slots; `successor [V]`
    (`NgramModel.successor()`) is required with `inner_gamma > 0` and refused without."""
    if (successor is None) != (self.inner_gamma == 0):
      raise UserError(f'a tree draft with inner_gamma {self.inner_gamma} needs '
                      f'{"a" if self.inner_gamma else "no"} bigram successor table')
    batch = self.decoder.index(decoder_state).shape[0]
    succ = jnp.zeros((1,), jnp.int32) if successor is None else jnp.asarray(successor, jnp.int32)
    return TreeDraftState(decoder_state=decoder_state, base=jnp.zeros((batch,), jnp.int32),
                          slots=jnp.full((batch, shape.num_nodes), -1, jnp.int32),
                          successor=succ, draft_calls=jnp.zeros((), jnp.int32))

  def init(self, params: PyTree, encoder_input_tokens: jax.Array, max_decode_len: int,
           shape: tree_lib.TreeShape, successor: Optional[Any] = None) -> TreeDraftState:
    """T5 drafts: encodes once and sizes the cache for `shape`."""
    state = self.decoder.init(params, encoder_input_tokens, self.cache_slots(max_decode_len, shape))
    return self.init_state(state, shape, successor)

  def propose_tree(self, state: TreeDraftState, sequences, lengths, rng, shape, config):
    g2 = self.inner_gamma
    root, dec = feed_pending(self.decoder, state.decoder_state, sequences, lengths)  # [b, V]
    base = lengths + 1
    slots = jnp.arange(self.decoder.cache_length(dec), dtype=jnp.int32)  # [L]
    batch = lengths.shape[0]
    group = jnp.arange(1 + g2, dtype=jnp.int32)  # [1 + g2]: the node, then its chain

    def fresh(dec, tokens, anc, d):  # tokens [b, F], anc [b, F, D]: one call, chains included
      width = tokens.shape[1]
      chain = [tokens]
      for _ in range(g2):
        chain.append(state.successor[chain[-1]])
      fed = jnp.stack(chain, axis=2)  # [b, F, 1 + g2]
      own = (self.decoder.index(dec)[:, None, None] + (1 + g2) * jnp.arange(width)[:, None]
             + group)  # [b, F, 1 + g2]
      earlier = jnp.where(group[None, :] <= group[:, None], own[:, :, None, :],
                          -1)  # [b, F, 1 + g2 (token), 1 + g2 (seen)]
      seen = jnp.concatenate([jnp.broadcast_to(anc[:, :, None], (batch, width, 1 + g2, anc.shape[-1])),
                              earlier], axis=-1)  # [b, F, 1 + g2, D + 1 + g2] visible slots
      visible = ((slots < base[:, None, None, None])
                 | jnp.any(slots[:, None] == seen[..., None, :], axis=-1))  # [b, F, 1 + g2, L]
      positions = jnp.broadcast_to(lengths[:, None, None] + d + group,
                                   (batch, width, 1 + g2))  # [b, F, 1 + g2]
      total = width * (1 + g2)
      logits, dec = self.decoder.tokens_to_logits(
          dec, fed.reshape(batch, total), positions.reshape(batch, total),
          visible.reshape(batch, total, -1))  # [b, F (1 + g2), V]
      logits = logits.reshape(batch, width, 1 + g2, -1)  # [b, F, 1 + g2, V]
      level = _Level(slot=own[:, :, 0], anc=anc, chain=fed[:, :, 1:], chain_slot=own[:, :, 1:],
                     chain_logits=logits[:, :, 1:],
                     remaining=jnp.full((batch, width), g2, jnp.int32))
      return logits[:, :, 0], level, dec

    def feed_level(carry, tokens, parent, d):  # tokens, parent [b, F]
      dec, prev, calls, fed_slots = carry
      if d == 1:
        anc = jnp.full(tokens.shape + (shape.depth,), -1, jnp.int32)
      else:  # the parent's ancestors, then the parent's own slot at column d - 2
        p = jnp.maximum(parent, 0)
        anc = jnp.take_along_axis(prev.anc, p[..., None], axis=1)  # [b, F, D]
        anc = anc.at[:, :, d - 2].set(jnp.take_along_axis(prev.slot, p, axis=1))
      if g2 == 0 or d == 1:
        logits, level, dec = fresh(dec, tokens, anc, d)
        calls = calls + 1
      else:
        of_parent = lambda x: jnp.take_along_axis(
            x, p.reshape(p.shape + (1,) * (x.ndim - 2)), axis=1)  # [b, F_prev, ...] -> [b, F, ...]
        chain, remaining = of_parent(prev.chain), of_parent(prev.remaining)  # [b, F, g2], [b, F]
        covered = (remaining > 0) & (tokens == chain[:, :, 0])  # [b, F]

        def cached(dec):
          shift = lambda x: jnp.roll(x, -1, axis=2)  # drop the first entry (the last is junk)
          chain_slot, chain_logits = of_parent(prev.chain_slot), of_parent(prev.chain_logits)
          level = _Level(slot=chain_slot[:, :, 0], anc=anc, chain=shift(chain),
                         chain_slot=shift(chain_slot), chain_logits=shift(chain_logits),
                         remaining=remaining - 1)
          return chain_logits[:, :, 0], level, dec

        skip = jnp.all(covered)
        logits, level, dec = jax.lax.cond(skip, cached,
                                          lambda dec: fresh(dec, tokens, anc, d), dec)
        calls = calls + 1 - skip.astype(jnp.int32)
      return logits, (dec, level, calls, fed_slots + (level.slot,))

    carry = (dec, None, state.draft_calls + 1, ())  # + 1: the root's call
    tree, fed, (dec, _, calls, fed_slots) = tree_lib.grow(shape, rng, root, feed_level, carry,
                                                         config)
    if fed_slots:
      slot_of_fed = jnp.concatenate(fed_slots, axis=1)  # [b, num_fed]
      node_slots = jnp.where(fed >= 0, jnp.take_along_axis(slot_of_fed, jnp.maximum(fed, 0),
                                                           axis=1), -1)  # [b, N]
    else:  # depth 1: nothing fed
      node_slots = jnp.full_like(fed, -1)
    return tree, state.replace(decoder_state=dec, base=base, slots=node_slots, draft_calls=calls)

  def commit_tree(self, state: TreeDraftState, sequences, lengths, path):
    del sequences
    slot = jnp.where(path >= 0, jnp.take_along_axis(state.slots, jnp.maximum(path, 0), axis=1),
                     -1)  # [b, D]
    moved = jnp.sum(jnp.cumprod((slot >= 0).astype(jnp.int32), axis=1), axis=1)  # [b]
    dest = state.base[:, None] + jnp.arange(path.shape[1], dtype=jnp.int32)  # [b, D]
    source = jnp.where(slot >= 0, slot, dest)  # [b, D]
    dec = self.decoder.move_slots(state.decoder_state, state.base, source)
    dec = self.decoder.rollback(dec, jnp.minimum(state.base + moved, lengths))
    return state.replace(decoder_state=dec)
