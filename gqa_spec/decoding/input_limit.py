"""Inputs checked before compile: the longest encoder input one device can take.

XLA allocates a batch's encoder attention whole (quadratic in the input length S) beside the
parameters and decode caches (linear in S). A row too long would fail inside XLA after compiling;
`longest_input` finds the longest S whose estimate fits the device's memory, so a longer row is
refused in one line or truncated (`--truncate-inputs`). XLA's own temporaries are not counted.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Optional

import jax

from gqa_spec.decoding import memory
from gqa_spec.decoding.targets import cache_length
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config

_F32 = 4
_STEP = 8  # `generate` pads every input to a multiple of 8


def device_bytes() -> int:
  """Memory of one device: an accelerator's `bytes_limit`, or the host's physical memory."""
  stats = jax.local_devices()[0].memory_stats() or {}  # this process's own (multi-process)
  if stats.get('bytes_limit'):
    return int(stats['bytes_limit'])
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def estimator(config: T5Config, *, batch: int, cache_length: int, data: int = 1,
              model: int = 1) -> Callable[[int], int]:
  """Input length -> bytes of parameters, decode caches (linear in the length: measured at 8 and
  16 tokens) and encoder attention (float32 scores and probabilities `[rows, heads, S, S]` and the
  position bias `[1, heads, S, S]`) on one device."""
  at = lambda n: memory.memory_per_device(config, batch=batch, input_length=n,
                                          cache_length=cache_length, data=data, model=model)
  short, longer = at(_STEP), at(2 * _STEP)
  per_token = (longer.total_bytes - short.total_bytes) // _STEP
  heads = config.num_heads // model if config.num_heads % model == 0 else config.num_heads
  return lambda n: (short.total_bytes + per_token * (n - _STEP) +
                    _F32 * heads * n * n * (2 * short.rows_per_device + 1))


def longest_input(estimate: Callable[[int], int], available: int) -> int:
  """The longest input length (a multiple of 8) whose `estimate` fits in `available` bytes; 0 when
  not even 8 tokens fit."""
  low, high = 0, _STEP
  while estimate(high) <= available:  # doubling, then bisection over multiples of 8
    low, high = high, high * 2
  while high - low > _STEP:
    mid = (low + high) // 2 // _STEP * _STEP
    low, high = (mid, high) if estimate(mid) <= available else (low, mid)
  return low


def check_feature_length(config: T5Config, lengths: Optional[Mapping[str, int]], batch: int,
                         beams: int = 1) -> None:
  """`eval` / `infer`: a task's `inputs` feature length that one device cannot take (at this batch
  size, with `targets` + 1 cache slots) refused in one line, before anything compiles. None: the
  task's own lengths, checked where the batches are built."""
  if not lengths or not lengths.get('inputs'):
    return
  estimate = estimator(config, batch=batch * beams,
                       cache_length=cache_length(lengths.get('targets', 1)))
  available = device_bytes()
  padded = -(-lengths['inputs'] // _STEP) * _STEP
  if estimate(padded) > available:
    raise UserError(
        f"task_feature_lengths inputs={lengths['inputs']}: more than the "
        f'{longest_input(estimate, available)} tokens one device can take at batch_size {batch} '
        f'(about {estimate(padded) / 2**30:.3g} GiB of {available / 2**30:.3g} GiB); lower it or '
        'batch_size')
