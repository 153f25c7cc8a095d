"""What t5x's decoding functions share: `DecodingState` and cache mapping.

The cache is t5x's: a mapping whose leaves are batch-major at axis `offset` (1 for scanned
layers). `cached_bias` / `position_embedder_index` leaves are never expanded; a `cache_index` leaf
only when it has a batch axis (t5x's scalar index no, gqa-spec's per-row `[b]` index yes).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from gqa_spec.decoding import sampling

PyTree = Any
NEG_INF = np.array(sampling.NEG_INF)
MIN_TEMPERATURE = np.array(1e-4)  # temperatures at or below it decode greedily (t5x)
_NEVER_EXPANDED = ('cached_bias', 'position_embedder_index')


@flax.struct.dataclass
class DecodingState:
  """t5x's `DecodingState`: what `tokens_to_logits` sees each step.

  Attributes:
    cur_index: `[rows]` loop position per row (temperature_sample), `[]` (beam_search).
    sequences: `[rows, L]` prompt + tokens so far, slot 0 the start token.
    cur_token: `[rows, 1]` the token fed this step.
    cache: the cache pytree.
  """

  cur_index: jax.Array
  sequences: jax.Array
  cur_token: jax.Array
  cache: PyTree


class TokensIdsToLogitsCallable(Protocol):
  def __call__(self, decoding_state: DecodingState) -> Tuple[jax.Array, PyTree]:
    """-> (`[rows, V]` next-token logits, the updated cache)."""


def is_tracer(value: Any) -> bool:
  return isinstance(value, jax.core.Tracer)


def cache_map(fn: Callable[[jax.Array], jax.Array], cache: PyTree, offset: int = 0) -> PyTree:
  """Applies `fn` to every batch-major leaf of a t5x-style cache mapping (see the module doc)."""
  if not isinstance(cache, Mapping):
    raise NotImplementedError(
        f'cache must be a mapping (a flax cache) to expand or gather its rows, got {type(cache)}')
  frozen = isinstance(cache, flax.core.FrozenDict)
  flat = traverse_util.flatten_dict(flax.core.unfreeze(cache) if frozen else dict(cache))

  def batched(key, leaf):
    if key[-1] in _NEVER_EXPANDED:
      return False
    return key[-1] != 'cache_index' or jnp.ndim(leaf) > offset

  flat = {k: fn(v) if batched(k, v) else v for k, v in flat.items()}
  out = traverse_util.unflatten_dict(flat)
  return flax.core.freeze(out) if frozen else out
