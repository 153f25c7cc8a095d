"""Per-device memory of partitioned decoding: parameters and decode caches on a `data x model` mesh.

Shapes come from the model (`jax.eval_shape` of its init and of `init_decode_cache`), placements
from `partitioning` (the rules the mesh decodes with), so the figures are the bytes the arrays
occupy per device; activations, XLA temporaries and the loops' buffers are not counted. A K/V cache
whose G heads the `model` axis does not divide is held whole on every model shard
(`kv_replication_waste_bytes`, GQA paper sec. 2.2).

Before anything compiles, `longest_input` finds the longest encoder input one device can take:
XLA allocates a batch's encoder attention whole (quadratic in the input length S) beside the
parameters and decode caches (linear in S), and a row too long would fail inside XLA after
compiling; a longer row is refused in one line or truncated (`--truncate-inputs`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Callable, Dict, Mapping, Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from gqa_spec.checkpoints import native
from gqa_spec.decoding.targets import cache_length as cache_slots
from gqa_spec.errors import UserError
from gqa_spec.models import decode_cache
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from gqa_spec import partitioning


@dataclasses.dataclass(frozen=True)
class MemoryReport:
  """Bytes per device of one decoding set-up (all `*_bytes` fields are per device, except `*_total`).

  Attributes:
    data, model: mesh axis sizes.
    batch: decoded rows (beam search: batch * beams).
    input_length: encoder length S (cross-attention K/V length).
    cache_length: self-attention cache slots L.
    num_kv_heads: G.
    kv_heads_per_device: G / model when the K/V heads shard, else G (replicated).
    rows_per_device: batch / data when the rows shard, else batch (replicated).
    param_bytes, param_bytes_total: parameters on one device / in the whole model.
    self_kv_bytes, cross_kv_bytes: self- / cross-attention K/V (all decoder layers) on one device.
    kv_bytes_total: the global (unreplicated) self + cross K/V bytes.
    kv_replication_waste_bytes: per-device K/V beyond an even split of `kv_bytes_total` over all
      devices.
    other_cache_bytes: the cache's index, slot positions and encoder mask on one device.
    total_bytes: parameters + whole cache on one device.
  """

  data: int
  model: int
  batch: int
  input_length: int
  cache_length: int
  num_kv_heads: int
  kv_heads_per_device: int
  rows_per_device: int
  param_bytes: int
  param_bytes_total: int
  self_kv_bytes: int
  cross_kv_bytes: int
  kv_bytes_total: int
  kv_replication_waste_bytes: int
  other_cache_bytes: int
  total_bytes: int


@functools.lru_cache(maxsize=64)
def _abstract_cache(config: T5Config, batch: int, input_length: int, cache_length: int) -> Any:
  """Shapes and dtypes of the decode cache `targets.T5Decoder.init` creates (traced once per
  argument set: every eval / infer / generate's input-length check asks)."""
  params = native.abstract_params(config)
  encoded = jax.ShapeDtypeStruct((batch, input_length, config.emb_dim), config.activation_dtype)
  tokens = jax.ShapeDtypeStruct((batch, input_length), jnp.int32)
  return jax.eval_shape(
      lambda p, e, t: decode_cache.init_decode_cache(Transformer(config), p, e, t, cache_length),
      params, encoded, tokens)


def _shard_bytes(x: Any, spec: PartitionSpec, mesh_shape: Dict[str, int]) -> int:
  """Bytes of one shard of `x` laid out by the mesh `spec` (every axis in it divides)."""
  shape = list(x.shape)
  for i, axis in enumerate(tuple(spec)):
    for name in (axis,) if isinstance(axis, str) else tuple(axis or ()):
      shape[i] //= mesh_shape[name]
  return math.prod(shape) * jnp.dtype(x.dtype).itemsize


def _total_bytes(x: Any) -> int:
  return math.prod(x.shape) * jnp.dtype(x.dtype).itemsize


def memory_per_device(config: T5Config, *, batch: int, input_length: int, cache_length: int,
                      data: int = 1, model: int = 1) -> MemoryReport:
  """Per-device bytes of parameters and decode cache of `config` on a `data x model` mesh.

  Args:
    config: the model (its dtypes set the bytes: `param_dtype` for parameters, `dtype` for K/V).
    batch: rows decoded at once (beam search: batch * beam size).
    input_length: encoder length S.
    cache_length: self-attention cache slots: `max_decode_len + 1` autoregressive, and
      `targets.cache_length(max_decode_len, gamma + 1)` for a speculative target.
    data, model: mesh axis sizes (no devices are needed).

  Returns:
    `MemoryReport`.
  """
  for name, value in (('batch', batch), ('input_length', input_length),
                      ('cache_length', cache_length), ('data', data), ('model', model)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f'{name} must be a positive integer, got {value!r}')
  rules = partitioning.logical_axis_rules(config, model)
  mesh_shape = {'data': data, 'model': model}
  params = native.abstract_params(config)
  cache = _abstract_cache(config, batch, input_length, cache_length)

  param_bytes = param_total = 0
  for _, x, logical in partitioning._with_paths(params, partitioning.logical_axes(params)):  # pylint: disable=protected-access
    param_bytes += _shard_bytes(x, partitioning.fit_spec(logical, x.shape, rules, mesh_shape),
                                 mesh_shape)
    param_total += _total_bytes(x)

  kv = {'self_attention': 0, 'encoder_decoder_attention': 0}
  kv_total = other = 0
  kv_spec = rows_spec = None
  for path, x, logical in partitioning._with_paths(cache, partitioning.cache_logical_axes(cache)):  # pylint: disable=protected-access
    spec = partitioning.fit_spec(logical, x.shape, rules, mesh_shape)
    name = partitioning.path_name(path)
    nbytes = _shard_bytes(x, spec, mesh_shape)
    kind = next((k for k in kv if f'/{k}/' in name), None)
    if kind is None:
      other += nbytes
    else:
      kv[kind] += nbytes
      kv_total += _total_bytes(x)
      kv_spec = spec
    if name.endswith('cache_index'):
      rows_spec = spec
  per_device_kv = kv['self_attention'] + kv['encoder_decoder_attention']
  g = config.num_kv_heads
  return MemoryReport(
      data=data, model=model, batch=batch, input_length=input_length, cache_length=cache_length,
      num_kv_heads=g, kv_heads_per_device=g // model if kv_spec[1] else g,
      rows_per_device=batch // data if rows_spec[0] else batch,
      param_bytes=param_bytes, param_bytes_total=param_total,
      self_kv_bytes=kv['self_attention'], cross_kv_bytes=kv['encoder_decoder_attention'],
      kv_bytes_total=kv_total,
      kv_replication_waste_bytes=per_device_kv - kv_total // (data * model),
      other_cache_bytes=other, total_bytes=param_bytes + per_device_kv + other)


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
  at = lambda n: memory_per_device(config, batch=batch, input_length=n,
                                   cache_length=cache_length, data=data, model=model)
  short, longer = at(_STEP), at(2 * _STEP)
  per_token = (longer.total_bytes - short.total_bytes) // _STEP
  heads = config.num_heads // model if config.num_heads % model == 0 else config.num_heads
  return lambda n: (short.total_bytes + per_token * (n - _STEP) +
                    4 * heads * n * n * (2 * short.rows_per_device + 1))  # float32


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
                       cache_length=cache_slots(lengths.get('targets', 1)))
  available = device_bytes()
  padded = -(-lengths['inputs'] // _STEP) * _STEP
  if estimate(padded) > available:
    raise UserError(
        f"task_feature_lengths inputs={lengths['inputs']}: more than the "
        f'{longest_input(estimate, available)} tokens one device can take at batch_size {batch} '
        f'(about {estimate(padded) / 2**30:.3g} GiB of {available / 2**30:.3g} GiB); lower it or '
        'batch_size')
