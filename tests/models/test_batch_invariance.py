"""RMSNorm's mean square and the attention softmax: row-count invariant on CPU (the softmax also
padding-invariant), the plain reduction elsewhere (issue 37)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.models import layers
from gqa_spec.models.layers import RMSNorm, mean_of_squares, softmax


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
  assert 'stablehlo.reduce' not in lowered['cpu'] and 'stablehlo.slice' in lowered['cpu']
  # On CPU the switch on the platform is resolved before code generation: no conditional is left.
  assert 'conditional' not in jax.jit(mean_of_squares).lower(x).compile().as_text()


def test_softmax_sum_is_row_count_and_padding_invariant_and_a_softmax():
  x = _rows(40) / 30  # [124, 40] logits of magnitude ~30
  e = np.exp(x - x.max(-1, keepdims=True))  # [124, 40] what the softmax sums
  f = jax.jit(layers._halving_sum)  # pylint: disable=protected-access
  full = np.asarray(f(e))  # [124, 1]
  # its sum: bitwise the same in 31 rows, in [4, 31] rows and with masked keys (weight exactly 0)
  # appended
  np.testing.assert_array_equal(np.asarray(f(e[:31])), full[:31])
  np.testing.assert_array_equal(np.asarray(f(e.reshape(4, 31, 40)))[2], full[62:93])
  np.testing.assert_array_equal(np.asarray(f(np.pad(e, ((0, 0), (0, 88))))), full)
  # the softmax itself: the same up to its last bit (XLA:CPU's fused exp and division still vary
  # there with the row count), and so with padded keys, which weigh exactly 0
  g = jax.jit(softmax)
  out = np.asarray(g(x))
  np.testing.assert_allclose(np.asarray(g(x[:31])), out[:31], rtol=5e-7, atol=0)
  padded = np.asarray(g(np.concatenate([x, np.full((124, 88), -1e10, np.float32)], axis=1)))
  np.testing.assert_allclose(padded[:, :40], out, rtol=5e-7, atol=0)
  assert not padded[:, 40:].any()
  np.testing.assert_allclose(out, np.asarray(jax.nn.softmax(x.astype(np.float64), axis=-1)),
                             rtol=1e-5, atol=1e-7)
  # and its gradient is the softmax's
  grad = jax.grad(lambda v: jnp.sum(softmax(v) * jnp.arange(40.0)))(x[:4])
  grad_ref = jax.grad(lambda v: jnp.sum(jax.nn.softmax(v) * jnp.arange(40.0)))(x[:4])
  np.testing.assert_allclose(np.asarray(grad), np.asarray(grad_ref), rtol=1e-4, atol=1e-5)


def test_only_cpu_lowers_the_softmax_halving_sum():
  x = jax.ShapeDtypeStruct((4, 40), jnp.float32)
  cuda = jax.jit(softmax).trace(x).lower(lowering_platforms=('cuda',)).as_text()
  cpu = jax.jit(softmax).trace(x).lower(lowering_platforms=('cpu',)).as_text()
  # Elsewhere the plain softmax (its max and its sum reduce); on CPU the sum is the halving one.
  assert 'stablehlo.slice' not in cuda and 'stablehlo.reduce' in cuda
  assert 'stablehlo.slice' in cpu
  assert cpu.count('stablehlo.reduce') < cuda.count('stablehlo.reduce')  # the sum's is gone
