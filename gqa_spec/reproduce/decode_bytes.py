"""GQA Figure 6's prediction: decode time per sample from the bytes a decode step reads.

A greedy decode step of a memory-bound decoder reads the decoder's parameters (the logits kernel
included; the encoder is not read while decoding), the whole allocated self-attention K/V cache
(this implementation attends over all of it, masked) and the cached cross-attention K/V, all sized
by `gqa_spec.decoding.memory.memory_per_device`. Per sample, over `targets` steps at batch `b`:

    bytes per sample = targets * (decoder params + self K/V + cross K/V) / b

The time is that divided by one effective bandwidth per setting, fitted to the measurements by
least squares through the origin; so the predicted *ratios* between group counts (MHA / MQA, where
GQA lies) come from the bytes alone, and only the overall scale is fitted. The encoder pass and
compute are not modelled.
"""

from __future__ import annotations

import functools
from typing import Dict, Mapping, Sequence, Tuple

import jax
import numpy as np


@functools.lru_cache(maxsize=None)  # shapes only, but each call traces the model
def bytes_per_sample(config, batch: int, inputs: int, targets: int) -> float:
  """Bytes read to decode one sample of `targets` tokens from `inputs` tokens at batch `batch`."""
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding import memory, targets as targets_lib  # pylint: disable=g-import-not-at-top
  report = memory.memory_per_device(config, batch=batch, input_length=inputs,
                                    cache_length=targets_lib.cache_length(targets))
  decoder = sum(x.size * x.dtype.itemsize
                for x in jax.tree_util.tree_leaves(native.abstract_params(config)['decoder']))
  return targets * (decoder + report.self_kv_bytes + report.cross_kv_bytes) / batch


def predicted_times(timing_rows: Sequence[Mapping],
                    configs: Mapping[str, object]) -> Dict[Tuple[str, int], float]:
  """`(setting, kv_heads) -> predicted seconds per sample` for the timing stage's rows.

  Args:
    timing_rows: rows of the timing stage (setting, kv_heads, inputs, targets, batch_size,
      time_per_sample_s).
    configs: setting -> the T5Config it timed (before `num_kv_heads` is set per row).
  """
  out = {}
  for setting in sorted({r['setting'] for r in timing_rows}):
    rows = [r for r in timing_rows if r['setting'] == setting]
    if setting not in configs:
      continue
    b = np.array([bytes_per_sample(configs[setting].replace(num_kv_heads=r['kv_heads']),
                                   r['batch_size'], r['inputs'], r['targets']) for r in rows])
    t = np.array([r['time_per_sample_s'] for r in rows])
    scale = float(b @ t / (b @ b))  # seconds per byte: 1 / effective bandwidth
    out.update({(setting, r['kv_heads']): scale * x for r, x in zip(rows, b)})
  return out
