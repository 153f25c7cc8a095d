"""Integrity of stored arrays: fingerprints for train-state checkpoints, and naming the array whose
stored bytes no longer read back.

Trainer checkpoints hold sharded arrays (parameters and optimizer state spread over the devices of
every host), so a CRC over an array's bytes would first gather the whole array onto one host. The
fingerprint here is a sum that can be taken where the data lives: the array's items as unsigned
words `u[i]` (1, 2 or 4 bytes by item size), `i` the row-major position, summed as

    fingerprint = sum_i u[i] * (2 i + 1)  mod 2**32

Integer arithmetic is exact, so the value is the same on any backend and any sharding. It detects
every single flipped bit (a change of 2**k * (2i + 1), k < 32, is never 0 modulo 2**32), elements
swapped between positions (unless their difference times twice their distance is 0 modulo 2**32),
and other damage with probability about 1 - 2**-32. Arrays whose data this host holds on CPU (or
in numpy) are summed with numpy in chunks (~3.6 GB/s on one core, as zlib's CRC-32; XLA:CPU's
integer reductions run at ~1.4 GB/s); others by one XLA reduction where their shards live, only 4
bytes per array leaving the devices.

Native checkpoints (`native.py`) keep their host-side CRC-32: their parameters are on the host
anyway when written, and checkpoints already written carry it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.checkpoints import aborted_reads
from gqa_spec.errors import UserError
from gqa_spec.partitioning import path_name

ALGORITHM = 'sum-u-times-2i-plus-1-u32'

log = logging.getLogger(__name__)


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_CHUNK = 1 << 22  # items per numpy step: 16 MiB of weights


def _on_host(x: Any) -> bool:
  """Whether `x`'s data is in this process's CPU memory (numpy, or a fully addressable CPU array)."""
  if not isinstance(x, jax.Array):
    return True
  return x.is_fully_addressable and all(d.platform == 'cpu' for d in x.sharding.device_set)


def _host_fingerprint(x: Any) -> int:
  """The fingerprint of an array in host memory, in chunks (numpy, one core)."""
  x = np.asarray(x)
  if x.dtype.itemsize not in _UNSIGNED:
    raise ValueError(f'no fingerprint for {x.dtype} items ({x.dtype.itemsize} bytes)')
  u = np.ascontiguousarray(x).reshape(-1).view(_UNSIGNED[x.dtype.itemsize])  # [n]
  total = 0
  for start in range(0, u.size, _CHUNK):
    weights = np.arange(start, min(start + _CHUNK, u.size), dtype=np.uint32)  # i mod 2**32
    weights *= np.uint32(2)
    weights += np.uint32(1)
    weights *= u[start:start + _CHUNK]  # u[i] (2i + 1), wrapping
    total += int(weights.sum(dtype=np.uint32))
  return total & 0xffffffff


def _device_fingerprint(x: jax.Array) -> jax.Array:
  """The same sum as `_host_fingerprint`, traced: a uint32 scalar; no reshape, so no resharding."""
  if x.dtype.itemsize not in _UNSIGNED:
    raise ValueError(f'no fingerprint for {x.dtype} items ({x.dtype.itemsize} bytes)')
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)  # numpy's view of a bool is its byte, 0 or 1
  u = jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize]).astype(jnp.uint32)  # x's shape
  position = jnp.zeros(u.shape, jnp.uint32)
  for axis in range(u.ndim):  # row-major linear index, built in place from per-axis iotas
    position = position * jnp.uint32(u.shape[axis]) + jax.lax.broadcasted_iota(
        jnp.uint32, u.shape, axis)
  return jnp.sum(u * (position * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)  # [], wraps


_device_fingerprints = jax.jit(lambda leaves: [_device_fingerprint(x) for x in leaves])


def fingerprints(tree: Any) -> dict:
  """Array name ('/'-joined path) -> {'fingerprint': 8 hex digits, 'dtype': its dtype's name}."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  values = {}
  on_device = [(i, leaf) for i, (_, leaf) in enumerate(flat) if not _on_host(leaf)]
  if on_device:
    got = jax.device_get(_device_fingerprints([leaf for _, leaf in on_device]))
    values.update({i: int(v) for (i, _), v in zip(on_device, got)})
  for i, (_, leaf) in enumerate(flat):
    if i not in values:
      values[i] = _host_fingerprint(leaf)
  return {path_name(path): {'fingerprint': f'{values[i]:08x}', 'dtype': np.dtype(leaf.dtype).name}
          for i, (path, leaf) in enumerate(flat)}


def record(tree: Any) -> dict:
  """What a checkpoint stores: the algorithm's name and every array's fingerprint."""
  return {'algorithm': ALGORITHM, 'arrays': fingerprints(tree)}


def verify(stored: Optional[Mapping[str, Any]], tree: Any, where: str) -> None:
  """Compares `tree`, as restored from the checkpoint at `where`, with its stored `record`.

  Every array of `tree` that the record holds in the same dtype is checked (a partial restore
  checks what it read; an array restored into another dtype has other bytes and is not compared).

  Raises:
    UserError: one line naming `where` and the first array whose fingerprint differs.
  """
  if not stored:
    log.warning('%s: written without checksums (before they were recorded); its arrays cannot be '
                'verified', where)
    return
  if not isinstance(stored, Mapping) or stored.get('algorithm') != ALGORITHM or not isinstance(
      stored.get('arrays'), Mapping):
    raise UserError(f'{where}: unreadable integrity record (algorithm '
                    f'{stored.get("algorithm") if isinstance(stored, Mapping) else None!r})')
  expected = stored['arrays']
  got = fingerprints(tree)
  for name in sorted(got):
    saved = expected.get(name)
    if not isinstance(saved, Mapping) or saved.get('dtype') != got[name]['dtype']:
      continue
    if saved.get('fingerprint') != got[name]['fingerprint']:
      raise UserError(f'{where}: array {name} is corrupt (fingerprint {got[name]["fingerprint"]}, '
                      f'saved {saved.get("fingerprint")}); the checkpoint data was damaged after '
                      'writing')


def unreadable_array(ocdbt_dir: str) -> Optional[str]:
  """The first array (by stored name, '.' read as '/') of the orbax OCDBT checkpoint `ocdbt_dir`
  whose stored data cannot be read, or None (also when `ocdbt_dir` is not OCDBT).

  Used after orbax's restore failed: flipped bytes inside a compressed chunk fail there with a
  TensorStore error that names a slice but not the array; reading each array on its own names it.
  """
  if not os.path.isfile(os.path.join(ocdbt_dir, 'manifest.ocdbt')):
    return None
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  try:
    keys = ts.KvStore.open({'driver': 'ocdbt', 'base': f'file://{ocdbt_dir}'}).result().list(
        ).result()
  except Exception:  # pylint: disable=broad-except; a damaged index: the caller's error stands
    return None
  arrays = sorted({key.decode().rsplit('/', 1)[0] for key in keys
                   if key.decode().endswith(('/.zarray', '/zarr.json'))})
  for array in arrays:
    driver = 'zarr3' if f'{array}/zarr.json'.encode() in keys else 'zarr'
    spec = {'driver': driver, 'kvstore': {'driver': 'ocdbt', 'base': f'file://{ocdbt_dir}',
                                          'path': array + '/'}}
    try:
      ts.open(spec, open=True).result().read().result()
    except Exception:  # pylint: disable=broad-except; any failure to read this array
      return array.replace('.', '/')
  return None


def raise_if_unreadable(ocdbt_dir: str, error: Exception, where: str, noun: str) -> None:
  """After orbax failed to restore from `ocdbt_dir` with `error`: raises the one-line UserError
  `WHERE: NOUN NAME is corrupt (its stored data cannot be read: ...)` when an array's stored data
  no longer reads back; returns (the caller's own error applies) when every array reads."""
  aborted_reads.quiet()
  name = unreadable_array(ocdbt_dir)
  if name is not None:
    reason = first_line(error).split(' See full TensorStore details')[0]
    raise UserError(f'{where}: {noun} {name} is corrupt (its stored data cannot be read: '
                    f'{reason}); the checkpoint data was damaged after writing') from None


def first_line(e: BaseException) -> str:
  """The first line of an exception's message ('' when it has none)."""
  text = str(e).strip()
  return text.splitlines()[0] if text else ''
