"""Training metrics: summarising train-step sums, and writing them to TensorBoard, JSONL and a bar.

`summarize` turns the sums the train step returns (`losses.weighted_cross_entropy`) over a logging
window into per-token means: `loss` (cross-entropy + z-loss per target token, t5x's
`cross_ent_loss_per_all_target_tokens` plus z-loss), `z_loss`, `accuracy`, the `learning_rate` of
the window's last step, and `timing/tokens_per_second` (non-padding encoder-input plus target
tokens per second of wall time).

`MetricWriter` writes every scalar to `<model_dir>/train_log.jsonl` (one JSON object per line,
`{"step": ..., "split": "train", ...}`) and to TensorBoard event files under `<model_dir>/<split>`
(written with TensorFlow's own summary writer, as plain scalar summaries: TensorBoard displays them
and nothing beyond TensorFlow is needed to write them; without TensorFlow, as on GPU images, the
JSONL log alone is written, with one warning). A resumed run first drops the records of
steps after the checkpoint it resumed from (the killed run logged them, the resumed run logs them
again), so the log holds each step once. Progress (bar or lines) is `gqa_spec.progress`.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Mapping, Sequence

import numpy as np

from gqa_spec import atomic
from gqa_spec.rundir import TRAIN_LOG_FILE



def summarize(step_metrics: Sequence[Mapping[str, np.ndarray]], seconds: float) -> dict:
  """Per-token means over a window of train-step metric sums (host numpy values)."""
  total = {k: float(sum(np.asarray(m[k], np.float64) for m in step_metrics))
           for k in ('loss_sum', 'z_loss_sum', 'correct_sum', 'weight_sum', 'input_tokens')}
  weight = max(total['weight_sum'], 1.0)
  return {
      'loss': total['loss_sum'] / weight,
      'z_loss': total['z_loss_sum'] / weight,
      'accuracy': total['correct_sum'] / weight,
      'learning_rate': float(step_metrics[-1]['learning_rate']),
      'timing/tokens_per_second': (total['weight_sum'] + total['input_tokens']) / max(seconds, 1e-9),
      'timing/steps_per_second': len(step_metrics) / max(seconds, 1e-9),
  }


def drop_records_after(path: str, step: int) -> int:
  """Rewrites the JSONL log at `path` without the records of steps after `step`; returns how many
  were dropped (a resumed run logs those steps again). A torn last line (a kill mid-write) goes
  too."""
  if not os.path.exists(path):
    return 0
  kept, dropped = [], 0
  with open(path, errors='replace') as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        record = None
      if not _is_record(record):  # torn, or not a record at all
        dropped += 1
        continue
      if int(record.get('step', 0)) > step:
        dropped += 1
      else:
        kept.append(line if line.endswith('\n') else line + '\n')
  if dropped:
    with atomic.open_for_write(path) as f:
      f.writelines(kept)
  return dropped


def _is_record(record) -> bool:
  """A log record: a JSON object whose step, where present, is an integer."""
  return isinstance(record, dict) and isinstance(record.get('step', 0), int) and not isinstance(
      record.get('step', 0), bool)


def read_records(path: str) -> list:
  """The records of a JSONL log (a torn last line, and any line that is not a record, skipped)."""
  records = []
  if os.path.exists(path):
    with open(path, errors='replace') as f:
      for line in f:
        try:
          record = json.loads(line)
        except json.JSONDecodeError:
          continue
        if _is_record(record):
          records.append(record)
  return records


class MetricWriter:
  """JSONL + TensorBoard; only the first host writes.

  Args:
    model_dir: the run directory.
    start_step: the step this process starts at: logged records of later steps are dropped.
    enabled: write (False on every host but the first).
  """

  def __init__(self, model_dir: str, start_step: int, enabled: bool = True):
    self.model_dir = model_dir
    self.enabled = enabled
    self._tb_writers = {}
    self._tensorboard = True  # False once TensorFlow was found missing
    if not enabled:
      return
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, TRAIN_LOG_FILE)
    drop_records_after(path, start_step)
    self._jsonl = open(path, 'a')

  def write_scalars(self, step: int, scalars: Mapping[str, float], split: str = 'train') -> None:
    """One record per call in the JSONL log, one summary per scalar in TensorBoard."""
    if not self.enabled:
      return
    record = {'step': int(step), 'split': split}
    record.update({k: float(v) for k, v in scalars.items()})
    self._jsonl.write(json.dumps(record) + '\n')
    self._jsonl.flush()
    self._write_tensorboard(step, scalars, split)

  def _write_tensorboard(self, step: int, scalars: Mapping[str, float], split: str) -> None:
    if not self._tensorboard:
      return
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top  (only when writing)
      from tensorflow.core.framework import summary_pb2  # pylint: disable=g-import-not-at-top
    except ImportError:
      logging.getLogger(__name__).warning(
          'TensorFlow is not installed: metrics go to %s only (no TensorBoard events)',
          TRAIN_LOG_FILE)
      self._tensorboard = False
      return
    if split not in self._tb_writers:
      self._tb_writers[split] = tf.summary.create_file_writer(os.path.join(self.model_dir, split))
    values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
    with self._tb_writers[split].as_default():
      tf.summary.experimental.write_raw_pb(
          summary_pb2.Summary(value=values).SerializeToString(), step=int(step))
    self._tb_writers[split].flush()

  def close(self) -> None:
    if not self.enabled:
      return
    for writer in self._tb_writers.values():
      writer.close()
    self._jsonl.close()
