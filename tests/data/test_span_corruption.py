"""Span corruption: noise statistics, sentinel order, exact reconstruction, segment lengths."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from gqa_spec.data import span_corruption
from gqa_spec.data import vocabulary


@pytest.fixture(scope='module')
def vocab():
  return vocabulary.get_vocabulary(vocabulary.test_vocabulary_path())


def _sentinels(vocab):
  return vocab.vocab_size - 1 - np.arange(vocab.extra_ids)  # <extra_id_0>, <extra_id_1>, ...


def _reconstruct(inputs, targets, vocab):
  """Fills each input sentinel with the target tokens that follow the same sentinel."""
  base = vocab.vocab_size - vocab.extra_ids
  spans, current = {}, None
  for t in targets:
    if t >= base:
      current = t
      spans[current] = []
    else:
      spans[current].append(t)
  out = []
  for t in inputs:
    out.extend(spans[t] if t >= base else [t])
  return out


def test_tokens_length_matches_t5():
  # T5's published numbers: 512 inputs -> 568 raw tokens and 114 targets.
  assert span_corruption.random_spans_tokens_length(512) == (568, 114)
  assert span_corruption.random_spans_tokens_length(128) == (141, 29)  # 21 noise in 7 spans


def test_noise_mask_statistics():
  lengths, fractions, span_lengths, starts_clean = 200, [], [], []
  for i in range(200):
    seeds = tf.constant([[i, 1], [i, 2]], tf.int32)
    mask = span_corruption.random_spans_noise_mask(tf.constant(lengths), 0.15, seeds, 3.0).numpy()
    fractions.append(mask.mean())
    starts_clean.append(not mask[0])
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    span_lengths.extend(edges[1::2] - edges[::2])
  # round(200 * 0.15) = 30 noise tokens in round(30 / 3) = 10 spans, exactly, every time.
  assert np.allclose(fractions, 0.15)
  assert all(starts_clean)
  assert abs(np.mean(span_lengths) - 3.0) < 1e-9
  # Spans vary (a random composition), not all of length 3.
  assert 1 == min(span_lengths) and max(span_lengths) >= 7


def test_noise_mask_is_deterministic_per_seed():
  seeds = tf.constant([[3, 4], [5, 6]], tf.int32)
  a = span_corruption.random_spans_noise_mask(tf.constant(50), 0.15, seeds).numpy()
  b = span_corruption.random_spans_noise_mask(tf.constant(50), 0.15, seeds).numpy()
  c = span_corruption.random_spans_noise_mask(tf.constant(50), 0.15, seeds + 1).numpy()
  assert (a == b).all() and (a != c).any()


def test_sentinels_replace_spans_in_order(vocab):
  tokens = tf.constant([10, 11, 12, 13, 14, 15, 16, 17])
  noise = tf.constant([False, False, True, True, False, False, True, False])
  inputs = span_corruption.noise_span_to_unique_sentinel(tokens, noise, vocab).numpy()
  targets = span_corruption.nonnoise_span_to_unique_sentinel(tokens, noise, vocab).numpy()
  x0, x1, x2 = _sentinels(vocab)[:3]
  assert inputs.tolist() == [10, 11, x0, 14, 15, x1, 17]
  assert targets.tolist() == [x0, 12, 13, x1, 16, x2]


def _documents(n=40, seed=0):
  rng = np.random.default_rng(seed)
  # Token ids 3..20: never pad (0), eos (1) or a sentinel.
  return [rng.integers(3, 20, size=rng.integers(20, 400)).astype(np.int32) for _ in range(n)]


def test_span_corruption_reconstructs_documents_exactly(vocab):
  docs = _documents()
  ds = tf.data.Dataset.from_generator(lambda: ({'targets': d} for d in docs),
                                      output_signature={'targets': tf.TensorSpec([None], tf.int32)})
  features = {'inputs': seqio.Feature(vocab), 'targets': seqio.Feature(vocab)}
  with seqio.map_seed_manager(42):
    out = list(span_corruption.span_corruption(
        ds, {'inputs': 64, 'targets': 16}, features).as_numpy_iterator())
  tokens_length, targets_length = span_corruption.random_spans_tokens_length(64)
  # No chunking (documents < 65536), one concat batch: segments are the concatenation, in order.
  rebuilt = np.concatenate([_reconstruct(x['inputs'], x['targets'], vocab) for x in out])
  assert rebuilt.tolist() == np.concatenate(docs).tolist()
  noise, total = 0, 0
  for x in out[:-1]:  # every full segment fills the inputs (+ EOS added later) and the targets
    assert len(x['inputs']) + 1 == 64 and len(x['targets']) + 1 == targets_length
    base = vocab.vocab_size - vocab.extra_ids
    sentinels_in = [t for t in x['inputs'] if t >= base]
    assert sentinels_in == _sentinels(vocab)[:len(sentinels_in)].tolist()
    noise += sum(t < base for t in x['targets'])
    total += tokens_length
  assert abs(noise / total - 0.15) < 0.01


def test_span_corruption_rejects_short_targets(vocab):
  features = {'inputs': seqio.Feature(vocab), 'targets': seqio.Feature(vocab)}
  ds = tf.data.Dataset.from_tensors({'targets': tf.constant([5, 6, 7])})
  with pytest.raises(ValueError, match='targets length of at least 114'):
    span_corruption.span_corruption(ds, {'inputs': 512, 'targets': 64}, features)
