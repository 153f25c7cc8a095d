"""Unigram and bigram drafts fitted on a task's training targets (draft cost c ~ 0).

Both are deterministic: they propose the argmax continuation (q one-hot). A unigram proposes its
most frequent token gamma times; a bigram follows its most likely successor chain from the last
generated token, backing off to the unigram argmax for tokens never seen as a predecessor. Fitted
counts are saved as `.npz` (`order`, `unigram [V]`, `bigram_rows/cols/counts` sparse); the draft
only needs the `successor [V]` table derived from them.

`NgramTreeDraft` grows token trees from a bigram: each node's children are the K most frequent
successors of its token (backing off to the most frequent unigrams), q one-hot per node
(`tree.grow`'s deterministic mode). It costs no model call; the tree's levels are table lookups.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Iterable, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec import atomic
from gqa_spec.decoding import tree as tree_lib
from gqa_spec.decoding.autoregressive import DECODER_START
from gqa_spec.decoding.drafts.base import last_tokens
from gqa_spec.errors import UserError


@dataclasses.dataclass(frozen=True)
class NgramModel:
  """Fitted counts. `bigram` maps (previous, next) -> count; previous 0 is the decoder start."""

  order: int
  unigram: np.ndarray  # [V] int64
  bigram: dict

  @property
  def vocab_size(self) -> int:
    return int(self.unigram.shape[0])

  def for_model(self, vocab_size: int, path: str) -> 'NgramModel':
    """These counts over a model's `vocab_size` ids (an embedding is often larger than the
    vocabulary: the counts are padded with zeros); a larger n-gram vocabulary is refused."""
    if self.vocab_size > vocab_size:
      raise UserError(f'{path}: n-gram vocabulary {self.vocab_size} > model vocabulary {vocab_size}'
                      ' (fitted on another vocabulary?)')
    unigram = np.pad(self.unigram, (0, vocab_size - self.vocab_size))  # [vocab_size]
    return dataclasses.replace(self, unigram=unigram)

  def successor(self) -> np.ndarray:
    """`[V]` int32: the proposed next token after each token."""
    fallback = int(np.argmax(self.unigram)) if self.unigram.sum() else 1
    table = np.full((self.vocab_size,), fallback, np.int32)
    if self.order >= 2:
      best = {}
      for (prev, nxt), count in self.bigram.items():
        if prev not in best or (count, -nxt) > (best[prev][0], -best[prev][1]):
          best[prev] = (count, nxt)
      for prev, (_, nxt) in best.items():
        table[prev] = nxt
    return table


def fit_ngram(sequences: Iterable[Sequence[int]], order: int, vocab_size: int) -> NgramModel:
  """Counts unigrams (and bigrams, with the decoder start as the first predecessor) of targets."""
  if order not in (1, 2):
    raise UserError(f'n-gram order must be 1 or 2, got {order}')
  unigram = np.zeros((vocab_size,), np.int64)
  bigram = collections.Counter()
  for seq in sequences:
    seq = [int(t) for t in seq]
    if any(t < 0 or t >= vocab_size for t in seq):
      raise UserError(f'token id outside the vocabulary of size {vocab_size} in {seq[:10]}...')
    np.add.at(unigram, seq, 1)
    if order >= 2:
      bigram.update(zip([DECODER_START] + seq[:-1], seq))
  return NgramModel(order=order, unigram=unigram, bigram=dict(bigram))


def fit_ngram_on_task(task_name: str, order: int, split: str = 'train',
                      max_examples: Optional[int] = None) -> NgramModel:
  """Fits on the target token ids of a registered seqio task's split (vocab: the task's, padded),
  or of an exported one (`exported:DIR/TASK`, read without TensorFlow)."""
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if exported.is_exported(task_name):
    (task,), _ = exported.resolve(task_name)
    tokens, offsets = task._arrays(split, 'targets')  # pylint: disable=protected-access
    count = task.num_examples(split) if max_examples is None else min(max_examples,
                                                                       task.num_examples(split))
    rows = ([int(x) for x in tokens[offsets[i]:offsets[i + 1]]] for i in range(count))
    return fit_ngram(rows, order, -(-task.manifest['vocab_size'] // 128) * 128)
  from gqa_spec.data import batches, tasks  # pylint: disable=g-import-not-at-top  (TensorFlow)
  from gqa_spec.data.vocabulary import padded_vocab_size  # pylint: disable=g-import-not-at-top
  vocab_size = padded_vocab_size(tasks.get(task_name).output_features['targets'].vocabulary)
  ds = batches.get_dataset(task_name, split, pack=False)
  if max_examples is not None:
    ds = ds.take(max_examples)

  def targets():
    for ex in ds.as_numpy_iterator():
      t = ex['decoder_target_tokens']
      yield [int(x) for x in t[t > 0]]

  return fit_ngram(targets(), order, vocab_size)


def save_ngram(model: NgramModel, path: str) -> None:
  items = sorted(model.bigram.items())
  rows = np.array([k[0] for k, _ in items], np.int32)
  cols = np.array([k[1] for k, _ in items], np.int32)
  counts = np.array([v for _, v in items], np.int64)
  with atomic.open_for_write(path, 'wb') as f:  # np.savez would append '.npz' to a bare path
    np.savez(f, order=model.order, unigram=model.unigram, bigram_rows=rows, bigram_cols=cols,
             bigram_counts=counts)


def load_ngram(path: str) -> NgramModel:
  if not os.path.isfile(path):
    raise UserError(f'n-gram file not found: {path}')
  try:
    with np.load(path) as z:
      order = int(z['order'])
      bigram = {(int(r), int(c)): int(n) for r, c, n in
                zip(z['bigram_rows'], z['bigram_cols'], z['bigram_counts'])}
      return NgramModel(order=order, unigram=np.asarray(z['unigram']), bigram=bigram)
  except (OSError, KeyError, ValueError) as e:
    raise UserError(f'{path} is not an n-gram file written by `gqa-spec ngram fit`: {e}') from None


@dataclasses.dataclass(frozen=True)
class NgramDraft:
  """Deterministic n-gram draft; its state is the `[V]` successor table."""

  vocab_size: int

  def init(self, model: NgramModel) -> jax.Array:
    return jnp.asarray(model.successor())  # [V]

  def propose(self, state, sequences, lengths, rng, gamma, config):
    del rng, config  # deterministic: the argmax continuation at every temperature
    token = last_tokens(sequences, lengths, 1)[:, 0]  # [b]
    out = []
    for _ in range(gamma):
      token = state[token]  # [b]
      out.append(token)
    tokens = jnp.stack(out, axis=1)  # [b, gamma]
    return tokens, jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32), state  # q

  def commit(self, state, sequences, lengths):
    return state


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
