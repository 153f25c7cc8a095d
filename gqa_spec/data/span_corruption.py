"""T5's span corruption objective as tf.data preprocessors (the `t5` package is not installable).

A tokenized document is cut to a random chunk, documents are concatenated and re-split into
segments sized so that the corrupted inputs fill `sequence_length['inputs']`, then 15% of each
segment's tokens (in spans of mean length 3) are replaced, span by span, by unique sentinels:

  tokens:  a b c d e f g h          noise mask: . . x x . . x .
  inputs:  a b <X0> e f <X1> h      targets:   <X0> c d <X1> g

`<X0>` = `<extra_id_0>` = vocab_size - 1, `<X1>` = vocab_size - 2, ... (seqio's reversed extra ids),
so a vocabulary with 100 extra ids covers up to 100 spans per segment. EOS is appended afterwards by
`seqio.preprocessors.append_eos_after_trim`, as in T5's `span_corruption` tasks.

Random choices use seqio's stateless per-example seeds (`seqio.map_over_dataset(num_seeds=...)`):
under `seqio.map_seed_manager(seed)` the output is deterministic.
"""

from __future__ import annotations

from typing import Callable, Mapping, Tuple

import seqio
import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def random_spans_tokens_length(inputs_length: int, noise_density: float = 0.15,
                               mean_noise_span_length: float = 3.0) -> Tuple[int, int]:
  """The raw segment length whose corrupted inputs (with sentinels and EOS) fit `inputs_length`.

  Returns:
    (tokens_length, targets_length): the segment length to split documents into, and the length of
    the targets it yields (sentinels and EOS included).
  """
  def lengths(tokens_length):
    num_noise = int(round(tokens_length * noise_density))
    num_spans = int(round(num_noise / mean_noise_span_length))
    # inputs: non-noise tokens + a sentinel per span + EOS; targets: noise + sentinels + EOS.
    return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

  tokens_length = inputs_length - 1
  while lengths(tokens_length + 1)[0] <= inputs_length:
    tokens_length += 1
  return tokens_length, lengths(tokens_length)[1]


def random_spans_noise_mask(length: tf.Tensor, noise_density: float, seeds: tf.Tensor,
                            mean_noise_span_length: float = 3.0) -> tf.Tensor:
  """A noise mask of `round(length * noise_density)` tokens in spans, starting with non-noise.

  The noise tokens are cut into `round(num_noise / mean_noise_span_length)` spans (at least one) and
  the non-noise tokens into as many; both partitions are uniformly random, then interleaved.

  Args:
    length: scalar int32, the number of tokens.
    noise_density: fraction of tokens to mask.
    seeds: [2, 2] int32 stateless seeds (one per partition).
    mean_noise_span_length: mean span length.

  Returns:
    [length] bool, True at noise tokens.
  """
  orig_length = length
  length = tf.maximum(length, 2)  # a 1-token segment still gets one noise and one non-noise token
  num_noise = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
  num_noise = tf.minimum(tf.maximum(num_noise, 1), length - 1)
  num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length), tf.int32)
  num_spans = tf.maximum(num_spans, 1)

  def random_segmentation(num_items, num_segments, seed):
    # A uniformly random composition: choose num_segments - 1 of the num_items - 1 cut points.
    first_in_segment = tf.pad(
        seqio.utils.stateless_shuffle(
            tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32), seed), [[1, 0]])
    segment_id = tf.cumsum(first_in_segment)  # [num_items]
    return tf.math.segment_sum(tf.ones_like(segment_id), segment_id)  # [num_segments]

  noise_lengths = random_segmentation(num_noise, num_spans, seeds[0])
  nonnoise_lengths = random_segmentation(length - num_noise, num_spans, seeds[1])
  interleaved = tf.reshape(tf.stack([nonnoise_lengths, noise_lengths], axis=1),
                           [num_spans * 2])  # [2 * num_spans]
  span_starts = tf.cumsum(interleaved)[:-1]
  span_start_indicator = tf.math.unsorted_segment_sum(tf.ones_like(span_starts), span_starts,
                                                      length)  # [length]
  span_num = tf.cumsum(span_start_indicator)
  return tf.equal(span_num % 2, 1)[:orig_length]


def noise_span_to_unique_sentinel(tokens: tf.Tensor, noise_mask: tf.Tensor,
                                  vocabulary: seqio.Vocabulary) -> tf.Tensor:
  """Replaces each noise span by one sentinel: the first `<extra_id_0>`, then `<extra_id_1>`, ..."""
  prev_is_noise = tf.pad(noise_mask[:-1], [[1, 0]])
  first_noise = tf.logical_and(noise_mask, tf.logical_not(prev_is_noise))
  subsequent_noise = tf.logical_and(noise_mask, prev_is_noise)
  sentinel = vocabulary.vocab_size - tf.cumsum(tf.cast(first_noise, tokens.dtype))  # [length]
  tokens = tf.where(first_noise, sentinel, tokens)
  return tf.boolean_mask(tokens, tf.logical_not(subsequent_noise))


def nonnoise_span_to_unique_sentinel(tokens: tf.Tensor, noise_mask: tf.Tensor,
                                     vocabulary: seqio.Vocabulary) -> tf.Tensor:
  """The targets' side: non-noise spans become the sentinels, noise tokens stay."""
  return noise_span_to_unique_sentinel(tokens, tf.logical_not(noise_mask), vocabulary)


def select_random_chunk(dataset: tf.data.Dataset, max_length: int = 65536,
                        feature_key: str = 'targets') -> tf.data.Dataset:
  """Keeps one random `max_length` chunk of each (non-empty) document; drops other features."""

  @seqio.map_over_dataset(num_seeds=1)
  def chunk(x, seed):
    tokens = x[feature_key]
    n = tf.shape(tokens)[0]
    num_chunks = (n + max_length - 1) // max_length
    start = max_length * tf.random.stateless_uniform([], seed, maxval=num_chunks, dtype=tf.int32)
    return {feature_key: tokens[start:tf.minimum(start + max_length, n)]}

  return chunk(dataset.filter(lambda x: tf.size(x[feature_key]) > 0))


def reduce_concat_tokens(dataset: tf.data.Dataset, feature_key: str = 'targets',
                         batch_size: int = 128) -> tf.data.Dataset:
  """Concatenates the tokens of `batch_size` consecutive documents (less padding after splitting)."""
  dataset = dataset.map(lambda x: {feature_key: x[feature_key]}, num_parallel_calls=AUTOTUNE)
  dataset = dataset.padded_batch(batch_size, padded_shapes={feature_key: [-1]})

  def concat(x):
    tokens = tf.reshape(x[feature_key], [-1])  # [batch * max_len], 0 = padding (pad id)
    return {feature_key: tf.boolean_mask(tokens, tf.not_equal(tokens, 0))}

  return dataset.map(concat, num_parallel_calls=AUTOTUNE)


def split_tokens(dataset: tf.data.Dataset, max_tokens_per_segment: int,
                 feature_key: str = 'targets') -> tf.data.Dataset:
  """Splits each document into consecutive segments of `max_tokens_per_segment` (the last shorter)."""

  def split(x):
    tokens = x[feature_key]
    n = tf.shape(tokens)[0]
    num_segments = (n + max_tokens_per_segment - 1) // max_tokens_per_segment
    padded = tf.pad(tokens, [[0, num_segments * max_tokens_per_segment - n]])
    segments = tf.reshape(padded, [num_segments, max_tokens_per_segment])
    lengths = tf.minimum(n - tf.range(num_segments) * max_tokens_per_segment,
                         max_tokens_per_segment)  # [num_segments]
    return tf.data.Dataset.from_tensor_slices((segments, lengths)).map(
        lambda segment, length: {feature_key: segment[:length]})

  return dataset.flat_map(split)


def denoise(dataset: tf.data.Dataset, vocabulary: seqio.Vocabulary, noise_density: float = 0.15,
            mean_noise_span_length: float = 3.0,
            inputs_fn: Callable = noise_span_to_unique_sentinel,
            targets_fn: Callable = nonnoise_span_to_unique_sentinel) -> tf.data.Dataset:
  """Turns each `targets` token sequence into an (inputs, targets) denoising pair."""

  @seqio.map_over_dataset(num_seeds=2)
  def corrupt(x, seeds):
    tokens = x['targets']
    noise_mask = random_spans_noise_mask(tf.size(tokens), noise_density, seeds,
                                         mean_noise_span_length)
    return {'inputs': inputs_fn(tokens, noise_mask, vocabulary),
            'targets': targets_fn(tokens, noise_mask, vocabulary)}

  return corrupt(dataset)


def span_corruption(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                    output_features: Mapping[str, seqio.Feature], noise_density: float = 0.15,
                    mean_noise_span_length: float = 3.0,
                    merge_examples_to_reduce_padding: bool = True) -> tf.data.Dataset:
  """T5's span corruption preprocessor (tokenized `targets` in; `inputs`, `targets` out, no EOS).

  Args:
    dataset: examples with a tokenized `targets` feature (the document).
    sequence_length: {'inputs': L_in, 'targets': L_tgt}; segments are sized so the corrupted inputs
      plus EOS fill L_in (T5: 568 raw tokens for 512 inputs, giving 114 targets).
    output_features: the task's features; the sentinels come from `targets`' vocabulary.
    noise_density: fraction of tokens masked.
    mean_noise_span_length: mean length of a masked span.
    merge_examples_to_reduce_padding: concatenate short documents before splitting.

  Returns:
    The corrupted dataset.

  Raises:
    ValueError: the targets length cannot hold the targets the inputs length implies.
  """
  tokens_length, targets_length = random_spans_tokens_length(
      sequence_length['inputs'], noise_density, mean_noise_span_length)
  if sequence_length['targets'] < targets_length:
    raise ValueError(f'span corruption with inputs length {sequence_length["inputs"]} needs a '
                     f'targets length of at least {targets_length}, got '
                     f'{sequence_length["targets"]}')
  vocabulary = output_features['targets'].vocabulary
  dataset = select_random_chunk(dataset)
  if merge_examples_to_reduce_padding:
    dataset = reduce_concat_tokens(dataset)
  dataset = split_tokens(dataset, tokens_length)
  return denoise(dataset, vocabulary, noise_density, mean_noise_span_length)
