"""Integrity of stored arrays: fingerprints for train-state checkpoints, and naming the array whose
stored bytes no longer read back.

Trainer checkpoints hold sharded arrays (parameters and optimizer state spread over the devices of
every host), so a CRC over an array's bytes would first gather the whole array onto one host. The
fingerprint here is computed where the shards live: the array's bytes as unsigned words `u[i]`
(32-, 16- or 8-bit, by item size; a 64-bit item is two 32-bit words), summed as

    fingerprint = sum_i u[i] * w(i)  mod 2**32,   w(i) odd, mixed from the element's position i

one XLA reduction per array (every host gets the same value; only 4 bytes per array leave the
devices), exact integer arithmetic, so equal on any backend and any sharding. It detects every
single flipped bit (a change of 2**k * w(i), k < 32, w(i) odd, is never 0 modulo 2**32), elements
moved to other positions (the weights differ), and other damage with probability 1 - 2**-32.

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

from gqa_spec.errors import UserError

ALGORITHM = 'position-weighted-sum-u32'

log = logging.getLogger(__name__)


def _words(x: jax.Array) -> jax.Array:
  """`x`'s bytes as uint32 values of its own words (item size 1, 2 or 4; 8 splits in two)."""
  size = x.dtype.itemsize
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  if size == 8:
    return jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size]
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _fingerprint(x: jax.Array) -> jax.Array:
  """The fingerprint of one array, a uint32 scalar; no reshape, so no resharding."""
  u = _words(x)  # x's shape (a trailing [2] for 8-byte items), uint32
  position = jnp.zeros(u.shape, jnp.uint32)
  for axis in range(u.ndim):  # row-major linear index, built in place from per-axis iotas
    position = position * jnp.uint32(u.shape[axis]) + jax.lax.broadcasted_iota(
        jnp.uint32, u.shape, axis)
  mixed = (position ^ (position >> 15)) * jnp.uint32(0x2C1B3C6D)
  weight = (mixed ^ (mixed >> 12)) * jnp.uint32(0x297A2D39) | jnp.uint32(1)
  return jnp.sum(u * weight, dtype=jnp.uint32)  # [], wraps modulo 2**32


_fingerprints = jax.jit(lambda leaves: [_fingerprint(x) for x in leaves])


def _name(path) -> str:
  parts = []
  for key in path:
    for attr in ('name', 'key', 'idx'):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return '/'.join(parts)


def fingerprints(tree: Any) -> dict:
  """Array name ('/'-joined path) -> {'fingerprint': 8 hex digits, 'dtype': its dtype's name}."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths, leaves = [path for path, _ in flat], [leaf for _, leaf in flat]
  values = jax.device_get(_fingerprints(list(leaves)))
  return {_name(path): {'fingerprint': f'{int(value):08x}', 'dtype': np.dtype(leaf.dtype).name}
          for path, leaf, value in zip(paths, leaves, values)}


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


class _NeverRetrieved(logging.Filter):
  """Drops asyncio's 'Task exception was never retrieved' records (one traceback per array)."""

  def filter(self, record: logging.LogRecord) -> bool:  # pylint: disable=redefined-outer-name
    return 'exception was never retrieved' not in record.getMessage()


def drop_orphaned_reads() -> None:
  """After a failed restore, orbax's other read tasks still hold the same error; collected later,
  asyncio logs each one with a traceback. Collect them now with that message filtered."""
  import gc  # pylint: disable=g-import-not-at-top
  logger = logging.getLogger('asyncio')
  quiet = _NeverRetrieved()
  logger.addFilter(quiet)
  try:
    gc.collect()
  finally:
    logger.removeFilter(quiet)


def first_line(e: BaseException) -> str:
  """The first line of an exception's message ('' when it has none)."""
  text = str(e).strip()
  return text.splitlines()[0] if text else ''
