"""A deterministic bigram tree draft: each node's children are the K most frequent successors of
its token (backing off to the most frequent unigrams), q one-hot per node (`tree.grow`'s
deterministic mode). Costs no model call; the tree's levels are table lookups.
"""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import tree as tree_lib
from gqa_spec.decoding.drafts.base import last_tokens
from gqa_spec.decoding.drafts.ngram import NgramModel

_NEG = -1e9  # logit of tokens outside a row's K successors


@flax.struct.dataclass
class NgramTreeState:
  tokens: jax.Array  # [V, K] int32: the K successors of each token, most frequent first
  scores: jax.Array  # [V, K] float32: their log relative frequencies (best-first ranking)


def successor_table(model: NgramModel, k: int):
  """`([V, K] tokens, [V, K] log frequencies)`: bigram successors, then unigram back-off."""
  vocab = model.vocab_size
  uni = model.unigram.astype(np.float64) + 1e-9
  uni_order = [int(t) for t in np.argsort(-uni, kind='stable')[:k + 1]]
  succ = {}
  for (prev, nxt), count in model.bigram.items():
    succ.setdefault(prev, []).append((count, nxt))
  tokens = np.zeros((vocab, k), np.int32)
  scores = np.zeros((vocab, k), np.float32)
  for prev in range(vocab):
    pairs = sorted(succ.get(prev, []), key=lambda c: (-c[0], c[1]))[:k]
    total = sum(c for c, _ in pairs)
    row = [(nxt, np.log(c / total)) for c, nxt in pairs]
    for t in uni_order:  # back-off fills the row, ranked below every seen successor
      if len(row) == k:
        break
      if t not in {r[0] for r in row}:
        row.append((t, np.log(uni[t] / uni.sum()) - 20.0))
    tokens[prev] = [t for t, _ in row]
    scores[prev] = [sc for _, sc in row]
  return tokens, scores


@dataclasses.dataclass(frozen=True)
class NgramTreeDraft:
  """Tree draft over a fitted bigram (`propose_tree` / `commit_tree`; state: the successor table)."""

  vocab_size: int

  def init(self, model: NgramModel, shape: tree_lib.TreeShape) -> NgramTreeState:
    tokens, scores = successor_table(model, max(shape.branching))
    return NgramTreeState(tokens=jnp.asarray(tokens), scores=jnp.asarray(scores))

  def _logits(self, state: NgramTreeState, token: jax.Array) -> jax.Array:
    """`[...]` tokens -> `[..., V]` logits: the successors' scores, _NEG elsewhere."""
    out = jnp.full(token.shape + (self.vocab_size,), _NEG, jnp.float32)
    succ, score = state.tokens[token], state.scores[token]  # [..., K]
    return jnp.put_along_axis(out, succ, score, axis=-1, inplace=False)

  def propose_tree(self, state, sequences, lengths, rng, shape, config):
    root = self._logits(state, last_tokens(sequences, lengths, 1)[:, 0])  # [b, V]
    feed = lambda carry, tokens, parent, d: (self._logits(state, tokens), carry)
    tree, _, _ = tree_lib.grow(shape, rng, root, feed, None, config, deterministic=True)
    return tree, state

  def commit_tree(self, state, sequences, lengths, path):
    del sequences, lengths, path
    return state
