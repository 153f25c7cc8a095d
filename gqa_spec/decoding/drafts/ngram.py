"""Unigram and bigram drafts fitted on a task's training targets (draft cost c ~ 0).

Both are deterministic: they propose the argmax continuation (q one-hot). A unigram proposes its
most frequent token gamma times; a bigram follows its most likely successor chain from the last
generated token, backing off to the unigram argmax for tokens never seen as a predecessor. Fitted
counts are saved as `.npz` (`order`, `unigram [V]`, `bigram_rows/cols/counts` sparse); the draft
only needs the `successor [V]` table derived from them.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Iterable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec import atomic
from gqa_spec.decoding.drafts.base import last_tokens, one_hot
from gqa_spec.errors import UserError

DECODER_START = 0


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
    return tokens, one_hot(tokens, self.vocab_size), state

  def commit(self, state, sequences, lengths):
    return state
