"""What t5x's decoding functions share: `DecodingState`, cache mapping, top-k / top-p masks.

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

PyTree = Any
NEG_INF = np.array(-1.0e7)  # t5x's "effective -inf" for masked logits and dead beams
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


def topk_mask(logits: jax.Array, k: jax.Array) -> jax.Array:
  """Keeps the logits >= the k-th largest (ties kept, as t5x's `binary_search.topk_mask`).

  Args:
    logits: `[..., V]`.
    k: scalar, possibly traced; k >= V keeps everything.

  Returns:
    `[..., V]` with the others set to NEG_INF.
  """
  vocab = logits.shape[-1]
  ascending = jnp.sort(logits, axis=-1)  # [..., V]
  pos = jnp.clip(vocab - jnp.asarray(k, jnp.int32), 0, vocab - 1)
  kth = jax.lax.dynamic_index_in_dim(ascending, pos, axis=-1, keepdims=True)  # [..., 1]
  return jnp.where(logits >= kth, logits, NEG_INF.astype(logits.dtype))


def topp_mask(logits: jax.Array, p: jax.Array) -> jax.Array:
  """Keeps the smallest set of most likely tokens whose mass is >= p (ties at the edge kept).

  The set of t5x's `binary_search.topp_mask`, except that p <= 0 keeps everything (t5x's binary
  search masks every token for a traced p = 0).

  Args:
    logits: `[rows, V]`.
    p: scalar or `[rows]`, possibly traced.

  Returns:
    `[rows, V]` with the others set to NEG_INF.
  """
  p = jnp.asarray(p, jnp.float32)
  p = p[..., None] if p.ndim else p  # [rows, 1] or []
  probs = jax.nn.softmax(logits, axis=-1)  # [rows, V]
  descending = -jnp.sort(-probs, axis=-1)  # [rows, V]
  mass = jnp.cumsum(descending, axis=-1)  # [rows, V]
  # The first sorted position whose cumulative mass reaches p (the last one if none does).
  edge = jnp.minimum(jnp.sum(mass < p, axis=-1, keepdims=True), probs.shape[-1] - 1)  # [rows, 1]
  threshold = jnp.take_along_axis(descending, edge, axis=-1)  # [rows, 1]
  keep = (probs >= threshold) | (p <= 0)
  return jnp.where(keep, logits, NEG_INF.astype(logits.dtype))
