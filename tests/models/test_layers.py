"""RMSNorm's mean square: row-count invariant on CPU, the plain reduction elsewhere (issue 37)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.models.layers import RMSNorm, mean_of_squares


def _rows(width, count=124, seed=0):
  """`[count, width]` float32 rows of magnitude ~1e3 (where the last bits show)."""
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((count, width)) * 1e3).astype(np.float32)


@pytest.mark.parametrize('width', [64, 48, 512, 1])
def test_mean_of_squares_is_row_count_invariant_and_a_mean(width):
  x = _rows(width)  # [124, width]
  f = jax.jit(mean_of_squares)
  full = np.asarray(f(x))  # [124, 1]
  # The same rows inside 31, 124, 1 and [4, 31] rows: bitwise the same (XLA:CPU's row reduction,
  # `jnp.mean`, differs in the last bit at width 64 between 31 and 124 rows).
  np.testing.assert_array_equal(np.asarray(f(x[:31])), full[:31])
  np.testing.assert_array_equal(np.asarray(f(x[5:6])), full[5:6])
  np.testing.assert_array_equal(np.asarray(f(x.reshape(4, 31, width)))[1], full[31:62])
  np.testing.assert_allclose(full, np.mean(np.square(x.astype(np.float64)), -1, keepdims=True),
                             rtol=1e-6)


def test_rms_norm_is_row_count_invariant():
  x = _rows(64)
  norm = RMSNorm()
  params = {'params': {'scale': np.linspace(0.5, 2, 64, dtype=np.float32)}}
  f = jax.jit(lambda v: norm.apply(params, v))
  full = np.asarray(f(x.reshape(4, 31, 64)))  # [4, 31, 64]
  np.testing.assert_array_equal(np.asarray(f(x[None, 31:62])), full[1:2])
  reference = x / np.sqrt(np.mean(np.square(x.astype(np.float64)), -1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(full.reshape(124, 64), reference * params['params']['scale'],
                             rtol=2e-6)


def test_only_cpu_lowers_the_halving_sum():
  """`platform_dependent` picks per platform at lowering time: a GPU program keeps the plain
  `reduce` (`jnp.mean`) and has no halving slices, a CPU program the reverse."""
  x = jax.ShapeDtypeStruct((4, 64), jnp.float32)
  lowered = {p: jax.jit(mean_of_squares).trace(x).lower(lowering_platforms=(p,)).as_text()
             for p in ('cpu', 'cuda')}
  plain = jax.jit(lambda v: jnp.mean(jnp.square(v), -1, keepdims=True)).trace(x).lower(
      lowering_platforms=('cuda',)).as_text()
  assert 'stablehlo.reduce' in lowered['cuda'] and 'stablehlo.slice' not in lowered['cuda']
  assert 'stablehlo.reduce' in plain
  assert 'stablehlo.reduce' not in lowered['cpu'] and lowered['cpu'].count('stablehlo.slice') == 12
  # On CPU the switch on the platform is resolved before code generation: no conditional is left.
  assert 'conditional' not in jax.jit(mean_of_squares).lower(x).compile().as_text()
