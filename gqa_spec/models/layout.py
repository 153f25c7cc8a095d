"""Conversion of parameters between the unrolled and scanned layer layouts (`T5Config.scan_layers`).

Unrolled: `encoder/layers_0/attention/query/kernel [emb, heads]`, one subtree per layer (T5X's and
HF's names). Scanned: `encoder/layers/attention/query/kernel [emb, layers, heads]`, every layer's
leaf stacked at `t5.PARAM_SCAN_AXIS`. Everything outside the stacks (embedding, final norms,
relative-position tables, logits) is the same in both. Conversion is exact (a stack or a slice), so
a checkpoint written in one layout loads into the other without changing the function.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import PARAM_SCAN_AXIS, SCANNED_NAME

Params = Any

_STACKS = ('encoder', 'decoder')
_LAYER = re.compile(r'layers_(\d+)$')


def is_scanned(params: Params) -> bool:
  """Whether `params` holds scanned stacks (`encoder/layers`) rather than `encoder/layers_0`..."""
  return any(SCANNED_NAME in params.get(stack, {}) for stack in _STACKS)


def _stack(xs):
  if isinstance(xs[0], jax.ShapeDtypeStruct):
    shape = list(xs[0].shape)
    shape.insert(PARAM_SCAN_AXIS, len(xs))
    return jax.ShapeDtypeStruct(tuple(shape), xs[0].dtype)
  xp = np if all(isinstance(x, np.ndarray) for x in xs) else jnp
  return xp.stack(xs, axis=PARAM_SCAN_AXIS)


def _take(x, i: int):
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape[:PARAM_SCAN_AXIS] + x.shape[PARAM_SCAN_AXIS + 1:], x.dtype)
  return x[(slice(None),) * PARAM_SCAN_AXIS + (i,)]


def stack_layers(params: Params) -> Params:
  """Unrolled -> scanned: `layers_0..layers_{n-1}` of each stack stacked into `layers`."""
  if is_scanned(params):
    return params
  out = dict(params)
  for stack in _STACKS:
    if stack not in params:
      continue
    tree = dict(params[stack])
    indices = sorted(int(_LAYER.match(k).group(1)) for k in tree if _LAYER.match(k))
    if indices != list(range(len(indices))):
      raise ValueError(f'{stack} layers are not numbered 0..n-1: {indices}')
    layers = [tree.pop(f'layers_{i}') for i in indices]
    tree[SCANNED_NAME] = jax.tree_util.tree_map(lambda *xs: _stack(xs), *layers)
    out[stack] = tree
  return out


def unstack_layers(params: Params) -> Params:
  """Scanned -> unrolled: each stack's `layers` sliced into `layers_0..layers_{n-1}`."""
  if not is_scanned(params):
    return params
  out = dict(params)
  for stack in _STACKS:
    if stack not in params or SCANNED_NAME not in params[stack]:
      continue
    tree = dict(params[stack])
    scanned = tree.pop(SCANNED_NAME)
    num_layers = jax.tree_util.tree_leaves(scanned)[0].shape[PARAM_SCAN_AXIS]
    for i in range(num_layers):
      tree[f'layers_{i}'] = jax.tree_util.tree_map(lambda x, i=i: _take(x, i), scanned)
    out[stack] = tree
  return out


def to_layout(params: Params, scan_layers: bool) -> Params:
  """`params` in the scanned (`scan_layers=True`) or unrolled layout, whichever it is now."""
  return stack_layers(params) if scan_layers else unstack_layers(params)


def convert(config: T5Config, params: Params, scan_layers: bool) -> Tuple[T5Config, Params]:
  """`(config, params)` of a model moved to the requested layout (the function is unchanged)."""
  return config.replace(scan_layers=scan_layers), to_layout(params, scan_layers)



DECODE_LAYOUT = 'unrolled'  # what decoding uses when not told (see `for_decoding`)


def for_decoding(config: T5Config, params: Params,
                 layout: Optional[str] = None) -> Tuple[T5Config, Params]:
  """`(config, params)` in the layer layout decoding runs in: `layout` ('unrolled' or 'scanned'),
  or `DECODE_LAYOUT` (unrolled) when None, whatever layout the checkpoint was trained in.

  Training scans (compile time independent of depth); decoding unrolls, as MaxText's inference does
  (its decode configs set `scan_layers=false` and convert scanned checkpoints). In a scanned
  decode loop XLA re-transposes every stacked weight `[in, layers, out] -> [layers, in, out]` and
  every stacked cache leaf on each step (loop-invariant copies its while-loop code motion does not
  hoist), so a scanned T5.1.1-small decodes at about half the unrolled speed on a CPU
  (`benchmarks/decode_layouts.py`, docs/performance.md). Conversion is exact and done once, here.
  """
  scan = (layout or DECODE_LAYOUT) == 'scanned'
  if config.scan_layers == scan and is_scanned(params) == scan:
    return config, params
  return convert(config, params, scan)
