"""T5's optimizer and learning-rate schedules: Adafactor, rsqrt decay with warm-up, constant.

The optimizer is returned *without* its learning rate: the train step multiplies the updates by
`learning_rate_fn(state.step)`, where `state.step` is the global step. Keeping the schedule outside
the optimizer state decouples two clocks that uptraining must treat differently (GQA, Sec. 2.1):
the schedule continues from the original checkpoint's step, while Adafactor's second-moment
statistics of the converted parameters start afresh (their count, which drives Adafactor's decay
rate `1 - (count + 1)^-0.8`, restarts at 0, so the first update is bias-free). Adafactor's steps are
linear in the learning rate after clipping, so scaling afterwards is the same as scaling inside.

  tx = adafactor()                                  # decay 0.8, no momentum, clipping 1.0
  lr = rsqrt_decay(warmup_steps=10_000)             # pre-training: 1 / sqrt(max(step, 10k))
  lr = constant(1e-3)                               # fine-tuning (GQA paper, Sec. 3.1)
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

LearningRateFn = Callable[[jax.Array], jax.Array]  # global step (int32 scalar) -> float32 scalar


def adafactor(decay_rate: float = 0.8, clipping_threshold: float = 1.0,
              multiply_by_parameter_scale: bool = True, min_dim_size_to_factor: int = 128,
              epsilon: float = 1e-30, factored: bool = True) -> optax.GradientTransformation:
  """T5's Adafactor (Shazeer & Stern 2018) as t5x configures it, without the learning rate.

  Args:
    decay_rate: exponent of the second-moment decay `1 - (count + 1)^-decay_rate`.
    clipping_threshold: update clipping by block RMS (T5: 1.0).
    multiply_by_parameter_scale: scale updates by each parameter's RMS (floored at 1e-3).
    min_dim_size_to_factor: factor the second moments of parameters whose two largest dims are at
      least this large (row and column statistics instead of a full matrix).
    epsilon: added to the squared gradients.
    factored: use factored second moments.

  Returns:
    An optax transformation whose updates are the descent direction at learning rate 1.
  """
  return optax.adafactor(learning_rate=None, min_dim_size_to_factor=min_dim_size_to_factor,
                         decay_rate=decay_rate, multiply_by_parameter_scale=multiply_by_parameter_scale,
                         clipping_threshold=clipping_threshold, momentum=None, eps=epsilon,
                         factored=factored)


def rsqrt_decay(base_learning_rate: float = 1.0, warmup_steps: int = 10_000) -> LearningRateFn:
  """T5 pre-training: `base / sqrt(max(step, warmup_steps))` (constant 0.01 for the first 10k steps)."""
  if warmup_steps < 1:
    raise ValueError(f'warmup_steps must be >= 1, got {warmup_steps}')

  def schedule(step: jax.Array) -> jax.Array:
    step = jnp.maximum(jnp.asarray(step, jnp.float32), float(warmup_steps))
    return jnp.float32(base_learning_rate) * jax.lax.rsqrt(step)

  return schedule


def constant(learning_rate: float = 1e-3) -> LearningRateFn:
  """Fine-tuning: a constant learning rate (T5 and the GQA paper: 1e-3)."""

  def schedule(step: jax.Array) -> jax.Array:
    del step
    return jnp.float32(learning_rate)

  return schedule
