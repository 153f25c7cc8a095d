"""benchmarks/verify_width.py: how it counts the emitted matmuls, and its argument check."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import verify_width


def test_every_matmul_is_counted_once_as_ynnpack_or_xla():
  w = jnp.ones((128, 256))
  fn = lambda a, b, w: (jnp.tanh(a @ w), b @ w)  # [2, 256], [1, 256]: two matmuls
  hlo = jax.jit(fn).lower(jnp.ones((2, 128)), jnp.ones((1, 128)), w).compile().as_text()
  ynn, dots = verify_width._matmul_emitters(hlo)  # pylint: disable=protected-access
  assert ynn + dots == 2 and ynn >= 0 and dots >= 0
  hlo = jax.jit(lambda a: jnp.tanh(a) * 2).lower(jnp.ones((4, 4))).compile().as_text()
  assert verify_width._matmul_emitters(hlo) == (0, 0)  # pylint: disable=protected-access


def test_the_one_token_call_comes_first():
  with pytest.raises(SystemExit, match='must start with 1'):
    verify_width.main(['some/checkpoint', '--tokens', '2,3'])
