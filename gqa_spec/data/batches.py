"""Model-ready batches: a registered task or mixture through seqio's `EncDecFeatureConverter`.

The model consumes the converter's feature names directly:
  encoder_input_tokens, decoder_input_tokens, decoder_target_tokens, decoder_loss_weights,
  and when packed also encoder_segment_ids, encoder_positions, decoder_segment_ids, decoder_positions.

Training (packed, shuffled, repeated):
  ds = get_dataset('ddtp_span_corruption', 'train', {'inputs': 128, 'targets': 32},
                   batch_size=8, pack=True, shuffle=True, num_epochs=None, seed=0)
Inference / evaluation (unpacked, in order; metrics via `tasks.get(name).metric_fns`):
  ds = get_dataset('ddtp_summarize', 'validation', batch_size=8, pack=False)
or let `seqio.Evaluator(name, feature_converter=inference_feature_converter(), ...)` drive it.
"""

from __future__ import annotations

from typing import Mapping, Optional

import seqio
import tensorflow as tf

from gqa_spec.data import tasks


def train_feature_converter(pack: bool = True) -> seqio.EncDecFeatureConverter:
  return seqio.EncDecFeatureConverter(pack=pack)


def inference_feature_converter() -> seqio.EncDecFeatureConverter:
  return seqio.EncDecFeatureConverter(pack=False)


def get_dataset(name: str, split: str, feature_lengths: Optional[Mapping[str, int]] = None, *,
                batch_size: Optional[int] = None, pack: bool = True, shuffle: bool = False,
                num_epochs: Optional[int] = 1, seed: Optional[int] = None,
                use_cached: bool = False) -> tf.data.Dataset:
  """A task or mixture's examples, converted to the model's features (and batched).

  Args:
    name: a registered task or mixture (`tasks.get` lists them if unknown).
    split: 'train', 'validation' or 'test'.
    feature_lengths: {'inputs': L_in, 'targets': L_tgt}; default `tasks.feature_lengths(name)`.
    batch_size: batch the examples (drop_remainder when shuffling for training); None: unbatched.
    pack: pack several examples per row (training); False for inference and evaluation.
    shuffle: shuffle the examples.
    num_epochs: passes over the data; None repeats forever.
    seed: shuffling and preprocessing seed (deterministic when set).
    use_cached: read seqio's offline cache of the task.

  Returns:
    Dataset of {feature: int32 [batch, length]} (or [length] when batch_size is None).
  """
  tasks.get(name)
  lengths = dict(feature_lengths or tasks.feature_lengths(name))
  ds = seqio.get_dataset(
      name, task_feature_lengths=lengths, dataset_split=split, shuffle=shuffle,
      num_epochs=num_epochs, feature_converter=seqio.EncDecFeatureConverter(pack=pack),
      seed=seed, use_cached=use_cached)
  if batch_size is not None:
    ds = ds.batch(batch_size, drop_remainder=shuffle)
  return ds
