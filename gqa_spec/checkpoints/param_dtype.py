"""Parameters in the compute dtype at inference: cast once at load, not per decode step.

A model whose parameters are float32 and whose activations are bfloat16 casts every kernel to
bfloat16 inside each decode step (`layers.Dense` does `kernel.astype(dtype)`), so a decode loop
reads the float32 weights and converts them on every iteration. `cast` converts the floating
parameters once, when a checkpoint is read for decoding (`generate`, `eval`, `infer` and the
benchmarks take `--param-dtype`; eval and infer also the gin macro `PARAM_DTYPE`). Integer leaves,
if any, keep their dtype. The analogous t5x knob is `RestoreCheckpointConfig.dtype`.

One kernel stays float32: the untied logits layer (`decoder/logits_dense/kernel`, T5.1.1's) computes
in float32 (`models/t5.py`), so a bfloat16 copy would be converted back to float32 on every step.
Every other layer computes in the activation dtype from `kernel.astype(dtype)`, so with bfloat16
activations the cast parameters give bit-identical logits and tokens to float32 ones
(`tests/decoding/test_param_dtype.py` checks that, and that the decode loop's body then converts
no parameter).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config

PyTree = Any
CHOICES = ('float32', 'bfloat16')
# Parameters a layer computes with in float32 whatever the activation dtype: left as they are.
FLOAT32_COMPUTE = frozenset({('decoder', 'logits_dense', 'kernel')})


def check(dtype: Optional[str], option: str = '--param-dtype') -> None:
  """Raises a one-line `UserError` unless `dtype` is None or one of `CHOICES`."""
  if dtype is not None and dtype not in CHOICES:
    raise UserError(f'{option} must be one of {", ".join(CHOICES)}; got {dtype!r}')


def cast(config: T5Config, params: PyTree, dtype: Optional[str],
         option: str = '--param-dtype') -> Tuple[T5Config, PyTree]:
  """`(config, params)` with floating parameters in `dtype` (None: unchanged), except the
  float32-compute ones (`FLOAT32_COMPUTE`).

  The config's `param_dtype` records the new dtype (memory estimates read it); arrays keep their
  placement (`astype` of a sharded array stays sharded).
  """
  check(dtype, option)
  if dtype is None:
    return config, params
  target = jnp.dtype(dtype)

  def one(path, x):
    keys = tuple(getattr(k, 'key', k) for k in path)
    if (keys in FLOAT32_COMPUTE or not jnp.issubdtype(x.dtype, jnp.floating)
        or x.dtype == target):
      return x
    return x.astype(target)

  return config.replace(param_dtype=dtype), jax.tree_util.tree_map_with_path(one, params)
