"""T5.1.1 building blocks: RMSNorm, bias-free dense layers, the gated MLP and the token embedding.

Parameter names, shapes and initialisers follow t5x's `layers.py`, so a T5X checkpoint maps onto
these modules one to one.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Initializer = Callable[..., jax.Array]

default_kernel_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')
default_embed_init = nn.initializers.normal(stddev=1.0)


def _halving_sum(x: jax.Array) -> jax.Array:
  """Sum over the last axis `[..., D] -> [..., 1]` in an order fixed by D alone.

  The last axis is zero-padded to a power of two P, then its first half is added elementwise to
  its second half until one column is left: log2(P) elementwise adds, each output element the
  same pairwise tree whatever the other axes are (zeros added are exact: padding changes nothing).
  """
  width = x.shape[-1]
  padded = 1 << max(width - 1, 0).bit_length()  # next power of two >= width
  if padded != width:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, padded - width)])  # [..., P]
  while x.shape[-1] > 1:
    half = x.shape[-1] // 2
    x = x[..., :half] + x[..., half:]  # [..., half]
  return x  # [..., 1]


def mean_of_squares(x: jax.Array) -> jax.Array:
  """`mean(x**2)` over the last axis, `[..., D] float32 -> [..., 1]`; row-count invariant on CPU.

  XLA:CPU's row reduction (what `jnp.mean` lowers to) adds a row's elements in an order that depends
  on how many rows the array holds: at width 64 the same row gives a different last bit inside 31 or
  124 rows. In attention over large logits that bit grows, so a row's logits moved with the batch it
  was decoded in (issue 37: up to 0.06 at magnitude ~30, against HF's 0.011, enough to flip a greedy
  near-tie). On CPU the sum is therefore `_halving_sum`, whose order depends on D only, and a row's
  norm is bitwise the same in any batch (`tests/models/test_batch_invariance.py`); on 16 seeds of
  `benchmarks/batch_drift.py` the largest batch-4-padded vs batch-1 logit drift fell from 1.7 to
  0.013 (HF: 0.19); the attention softmax's sum is made the same way (`softmax`). On other
  platforms it stays the plain `jnp.mean`: `jax.lax.platform_dependent` chooses at lowering time, so a GPU/TPU program
  is unchanged; there batch-1 decode is launch-bound (~80 us a layer) and log2(D) more elementwise
  ops could cost kernels per norm, while their row reduction was not shown to drift.
  """
  def cpu(v):  # [..., D] -> [..., 1]
    return _halving_sum(jnp.square(v)) / v.shape[-1]

  def default(v):  # [..., D] -> [..., 1]
    return jnp.mean(jnp.square(v), axis=-1, keepdims=True)

  return jax.lax.platform_dependent(x, cpu=cpu, default=default)


def softmax(logits: jax.Array) -> jax.Array:
  """`jax.nn.softmax` over the last axis; on CPU its sum is `_halving_sum`'s, row-count invariant.

  The same XLA:CPU row reduction as in `mean_of_squares` sums the exponentials, so attention
  weights moved with the number of rows (batch x heads x queries) in the array. The halving sum is
  also padding-invariant: masked keys (logit -1e10) weigh exactly 0 and sit past a row's real keys,
  and zeros appended to the end of the axis leave the pairwise tree of the other elements as it
  was. The weights are then the same up to their last bit (XLA:CPU's fused exp and division still
  vary there with the row count: at width 64, 41 of 1984 weights by one ulp where the plain softmax
  moved 1441; `tests/models/test_batch_invariance.py`). Other platforms keep `jax.nn.softmax`
  (chosen at lowering, as in `mean_of_squares`).
  """
  def cpu(x):  # [..., k] -> [..., k]
    e = jnp.exp(x - jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True)))  # max: exact
    return e / _halving_sum(e)

  return jax.lax.platform_dependent(logits, cpu=cpu, default=lambda x: jax.nn.softmax(x, axis=-1))


class RMSNorm(nn.Module):
  """T5's layer norm: rescales by the root mean square, no mean subtraction, no bias.

  The mean square is `mean_of_squares`: on CPU an order-fixed sum, so that a row's output does not
  depend on how many rows share its batch (see there); elsewhere `jnp.mean`.
  """

  epsilon: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    mean2 = mean_of_squares(x32)  # [..., 1]
    y = x32 * jax.lax.rsqrt(mean2 + self.epsilon)
    # As t5x and HF: normalise in float32, cast to the activation dtype, then scale.
    return y.astype(self.dtype) * scale.astype(self.dtype)


class Dense(nn.Module):
  """Bias-free dense layer over the last axis with a 2-D `[in, out]` kernel (t5x's joined layout)."""

  features: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  kernel_init: Initializer = default_kernel_init

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param('kernel', self.kernel_init, (x.shape[-1], self.features), self.param_dtype)
    return jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype))


def _activation(name: str) -> Callable[[jax.Array], jax.Array]:
  return {
      'gelu': lambda x: nn.gelu(x, approximate=True),  # t5x's default; HF's 'gelu_new'
      'gelu_exact': lambda x: nn.gelu(x, approximate=False),
      'relu': nn.relu,
      'silu': nn.silu,
      'linear': lambda x: x,
  }[name]


class MlpBlock(nn.Module):
  """Gated MLP: wo(act_0(wi_0 x) * act_1(wi_1 x)); T5.1.1 is ('gelu', 'linear')."""

  intermediate_dim: int
  activations: Sequence[str] = ('gelu', 'linear')
  intermediate_dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, enable_dropout: bool = False) -> jax.Array:
    hidden = None
    for i, act in enumerate(self.activations):
      name = f'wi_{i}' if len(self.activations) > 1 else 'wi'
      h = _activation(act)(Dense(self.intermediate_dim, self.dtype, self.param_dtype, name=name)(x))
      hidden = h if hidden is None else hidden * h
    hidden = nn.Dropout(self.intermediate_dropout_rate, broadcast_dims=(-2,))(
        hidden, deterministic=not enable_dropout)  # [batch, length, mlp]
    return Dense(x.shape[-1], self.dtype, self.param_dtype, name='wo')(hidden)


class Embed(nn.Module):
  """Token embedding `[vocab, emb]`; `attend` gives tied logits (unused by T5.1.1)."""

  num_embeddings: int
  features: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.embedding = self.param('embedding', default_embed_init,
                                (self.num_embeddings, self.features), self.param_dtype)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    return jnp.take(self.embedding, tokens, axis=0).astype(self.dtype)  # [batch, length, emb]

  def attend(self, x: jax.Array) -> jax.Array:
    return jnp.dot(x, self.embedding.T.astype(x.dtype))  # [batch, length, vocab]
