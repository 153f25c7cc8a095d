"""seqio's `EncDecFeatureConverter` in numpy: trim-and-pack and the model's feature names.

The exported-data reader (`gqa_spec.data.exported`) builds its batches here, without TensorFlow.
Both functions reproduce seqio 0.0.20's algorithm step by step, so that the same examples in the
same order give the same rows (tested against seqio in `tests/data/test_exported.py`):

  packing (`seqio.utils.trim_and_pack_dataset`, `_pack_with_tf_ops`): the stream is cut into chunks
    of `max(lengths)` examples; inside a chunk each example is appended to the open row while both
    its inputs and targets still fit, else the row is closed and a new one opened; the open row is
    closed at the end of every chunk (so rows never span chunks). An example's length is its count
    of non-zero tokens. Segment ids are `cumsum(position == 0) * (token != 0)`.
  features (`EncDecFeatureConverter._convert_example`): decoder inputs are the targets shifted
    right by one with 0 (BOS) at each segment start; loss weights mark non-padding targets.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

import numpy as np

KEYS = ('inputs', 'targets')


def _shift_right(x: np.ndarray) -> np.ndarray:
  """`[..., L]` -> `[..., L]`: one step right along the last axis, 0 entering."""
  out = np.zeros_like(x)
  out[..., 1:] = x[..., :-1]
  return out


def pack_rows(lengths: np.ndarray, feature_lengths: Mapping[str, int]) -> List[List[int]]:
  """Which examples each packed row holds, by seqio's chunked greedy packing.

  Args:
    lengths: `[n, 2]` non-zero token counts of (inputs, targets), already trimmed.
    feature_lengths: `{'inputs': L_in, 'targets': L_tgt}`.

  Returns:
    Rows, each a list of indices into `lengths`, in stream order.
  """
  limits = (feature_lengths['inputs'], feature_lengths['targets'])
  chunk = max(limits)
  rows: List[List[int]] = []
  for start in range(0, len(lengths), chunk):
    row: List[int] = []
    used_in = used_tgt = 0
    for i in range(start, min(start + chunk, len(lengths))):
      n_in, n_tgt = int(lengths[i, 0]), int(lengths[i, 1])
      if used_in + n_in > limits[0] or used_tgt + n_tgt > limits[1]:
        rows.append(row)  # seqio closes the row even when it is empty (it never is: trimmed)
        row, used_in, used_tgt = [], 0, 0
      row.append(i)
      used_in, used_tgt = used_in + n_in, used_tgt + n_tgt
    rows.append(row)
  return rows


def packed_row(examples: Sequence[Mapping[str, np.ndarray]],
               feature_lengths: Mapping[str, int]) -> Dict[str, np.ndarray]:
  """One packed row of model features from the examples `pack_rows` put in it."""
  row = {}
  for key, prefix in (('inputs', 'encoder'), ('targets', 'decoder')):
    length = feature_lengths[key]
    tokens = np.zeros(length, np.int32)  # [L]
    positions = np.zeros(length, np.int32)  # [L]
    at = 0
    for example in examples:
      seq = _non_padding(np.asarray(example[key])[:length])
      tokens[at:at + len(seq)] = seq
      positions[at:at + len(seq)] = np.arange(len(seq))
      at += len(seq)
    segments = np.cumsum(positions == 0).astype(np.int32) * (tokens != 0)  # [L]
    row[f'{prefix}_segment_ids'] = segments
    row[f'{prefix}_positions'] = positions
    if key == 'inputs':
      row['encoder_input_tokens'] = tokens
    else:
      row['decoder_target_tokens'] = tokens
      first = segments != _shift_right(segments)  # [L] segment starts (and the first padding)
      row['decoder_input_tokens'] = np.where(first, 0, _shift_right(tokens)).astype(np.int32)
      row['decoder_loss_weights'] = (tokens != 0).astype(np.int32)
  return row


def unpacked_row(example: Mapping[str, np.ndarray],
                 feature_lengths: Mapping[str, int]) -> Dict[str, np.ndarray]:
  """One example as unpacked model features (inference and evaluation)."""
  inputs = np.zeros(feature_lengths['inputs'], np.int32)  # [L_in]
  targets = np.zeros(feature_lengths['targets'], np.int32)  # [L_tgt]
  seq_in = np.asarray(example['inputs'])[:len(inputs)]
  seq_tgt = np.asarray(example['targets'])[:len(targets)]
  inputs[:len(seq_in)] = seq_in
  targets[:len(seq_tgt)] = seq_tgt
  return {'encoder_input_tokens': inputs, 'decoder_target_tokens': targets,
          'decoder_input_tokens': _shift_right(targets),
          'decoder_loss_weights': (targets != 0).astype(np.int32)}


def _non_padding(seq: np.ndarray) -> np.ndarray:
  # seqio keeps the first count-of-non-zero tokens (examples have no interior padding).
  seq = np.asarray(seq, np.int32)
  return seq[:int(np.count_nonzero(seq))]


def stack(rows: Sequence[Mapping[str, np.ndarray]]) -> Dict[str, np.ndarray]:
  """`[batch, length]` arrays of a list of rows."""
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

