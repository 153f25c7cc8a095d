"""Token cross-entropy with T5's z-loss, weighted by `decoder_loss_weights` (t5x `losses.py`).

z-loss (Mesh TensorFlow / PaLM) adds `z_loss * log(Z)^2` per token, where `Z` is the softmax
normaliser, keeping the logits' scale from drifting; T5 uses 1e-4.

Normalisation follows t5x's `loss_normalizing_factor`: None sums the token losses over the batch
(t5x's default; Adafactor is nearly invariant to the loss scale), a number divides the sum by that
constant, and 'NUM_REAL_TARGET_TOKENS' divides by the batch's weight sum.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp

NUM_REAL_TARGET_TOKENS = 'NUM_REAL_TARGET_TOKENS'
LossNormalizingFactor = Optional[Union[float, str]]


def cross_entropy_with_logits(logits: jax.Array, targets: jax.Array,
                              z_loss: float) -> Tuple[jax.Array, jax.Array]:
  """Per-token cross-entropy plus z-loss.

  Args:
    logits: `[batch, length, vocab]` float32.
    targets: `[batch, length]` int token ids.
    z_loss: coefficient of `log(Z)^2`.

  Returns:
    `(loss, z_loss_part)`, each `[batch, length]`; `loss` already includes the z-loss part.
  """
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [batch, length]
  # A one-hot product rather than `take_along_axis`: its gradient is an elementwise select that
  # fuses into the softmax's backward pass, where the gather's would be a scatter-add into a fresh
  # `[batch, length, vocab]` array (a serial loop on XLA:CPU; see benchmarks/train_step.py).
  one_hot = targets[..., None] == jnp.arange(logits.shape[-1], dtype=targets.dtype)  # [b, l, V]
  target_logits = jnp.sum(jnp.where(one_hot, logits, 0.0), axis=-1)  # [batch, length]
  z_part = z_loss * jnp.square(log_z)
  return log_z - target_logits + z_part, z_part


def check_loss_normalizing_factor(factor: LossNormalizingFactor) -> None:
  """Raises ValueError unless `factor` is None, a positive number or 'NUM_REAL_TARGET_TOKENS'."""
  if factor is None or factor == NUM_REAL_TARGET_TOKENS:
    return
  if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
    raise ValueError(f"loss_normalizing_factor must be None, a positive number or "
                     f"'{NUM_REAL_TARGET_TOKENS}', got {factor!r}")


def weighted_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                           z_loss: float = 1e-4,
                           loss_normalizing_factor: LossNormalizingFactor = None) -> Tuple[jax.Array, dict]:
  """The training objective and its metrics for one batch.

  Args:
    logits: `[batch, length, vocab]` float32.
    targets: `[batch, length]` token ids.
    weights: `[batch, length]` loss weights (0 on padding).
    z_loss: z-loss coefficient.
    loss_normalizing_factor: see the module docstring.

  Returns:
    `(objective, metrics)`; metrics hold sums over the batch (`loss_sum`, `z_loss_sum`,
    `correct_sum`, `weight_sum`) so that they can be averaged over any number of batches.
  """
  check_loss_normalizing_factor(loss_normalizing_factor)
  weights = weights.astype(jnp.float32)
  token_loss, z_part = cross_entropy_with_logits(logits, targets, z_loss)  # [batch, length] each
  loss_sum = jnp.sum(token_loss * weights)
  weight_sum = jnp.sum(weights)
  if loss_normalizing_factor is None:
    objective = loss_sum
  elif loss_normalizing_factor == NUM_REAL_TARGET_TOKENS:
    objective = loss_sum / jnp.maximum(weight_sum, 1.0)
  else:
    objective = loss_sum / loss_normalizing_factor
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)  # [batch, length]
  metrics = {
      'loss_sum': loss_sum,
      'z_loss_sum': jnp.sum(z_part * weights),
      'correct_sum': jnp.sum(correct * weights),
      'weight_sum': weight_sum,
  }
  return objective, metrics
