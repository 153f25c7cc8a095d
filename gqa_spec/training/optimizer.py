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

Scanned stacks (`T5Config.scan_layers`) hold every layer's parameter in one array with a `layers`
axis. Adafactor must not treat that axis as data: t5x marks it `FactorDim.BATCH`, so factoring, the
parameter-scale RMS and update clipping are all computed within each layer. `layers_as_batch` does
the same by mapping the optimizer over the layer axis, so a scanned model's update is exactly the
stacked updates of its unrolled twin.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, NamedTuple, Tuple

import flax
import jax
import jax.numpy as jnp
import optax

from gqa_spec.models.t5 import PARAM_SCAN_AXIS, SCANNED_NAME

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
    An optax transformation whose updates are the descent direction at learning rate 1. Equal
    arguments return the same object, so that train steps built with it can share one compiled
    step (`train_step.TrainStep`).
  """
  key = (decay_rate, clipping_threshold, multiply_by_parameter_scale, min_dim_size_to_factor,
         epsilon, factored)
  if key not in _ADAFACTORS:
    _ADAFACTORS[key] = layers_as_batch(optax.adafactor(
        learning_rate=None, min_dim_size_to_factor=min_dim_size_to_factor, decay_rate=decay_rate,
        multiply_by_parameter_scale=multiply_by_parameter_scale,
        clipping_threshold=clipping_threshold, momentum=None, eps=epsilon, factored=factored))
  return _ADAFACTORS[key]


_ADAFACTORS: Dict[Tuple[Any, ...], optax.GradientTransformation] = {}  # `adafactor`'s, by argument


class LayersAsBatchState(NamedTuple):
  # `tx`'s state of the scanned stacks' parameters, one per layer: leaves [layers, ...]. Stacks of
  # different depths (an encoder and a decoder with different layer counts) are mapped apart:
  # then a tuple of states, one per depth, shallowest first.
  scanned: Any
  rest: Any  # `tx`'s state of every other parameter


def _split(tree: Any):
  """`(scanned, rest)`: the leaves under a scanned stack (`.../layers/...`) and the others;
  `scanned` is a list of trees, one per stack depth (shallowest first), or None."""
  flat = flax.traverse_util.flatten_dict(tree)
  depths: Dict[int, dict] = {}
  for k, v in flat.items():
    if SCANNED_NAME in k:
      depths.setdefault(v.shape[PARAM_SCAN_AXIS], {})[k] = v
  rest = {k: v for k, v in flat.items() if SCANNED_NAME not in k}
  scanned = [flax.traverse_util.unflatten_dict(depths[d]) for d in sorted(depths)]
  return scanned or None, flax.traverse_util.unflatten_dict(rest)


def _merge(scanned: Any, rest: Any) -> Any:
  flat = flax.traverse_util.flatten_dict(rest)
  for tree in scanned or ():
    flat.update(flax.traverse_util.flatten_dict(tree))
  return flax.traverse_util.unflatten_dict(flat)


def layers_as_batch(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` applied to each layer of a scanned stack as to a parameter of its own.

  Parameters outside scanned stacks (all of them in the unrolled layout, whose optimizer state is
  then `tx`'s own) go through `tx` unchanged; those under `.../layers/...` through `tx` mapped over
  their layer axis (`PARAM_SCAN_AXIS`), their state holding the layer axis first; stacks of
  different depths in separate maps (`LayersAsBatchState`).
  """
  init_one = jax.vmap(tx.init, in_axes=PARAM_SCAN_AXIS)
  update_one = jax.vmap(tx.update, in_axes=(PARAM_SCAN_AXIS, 0, PARAM_SCAN_AXIS),
                        out_axes=(PARAM_SCAN_AXIS, 0))

  def init(params):
    scanned, rest = _split(params)
    if scanned is None:
      return tx.init(params)
    states = tuple(init_one(tree) for tree in scanned)
    return LayersAsBatchState(states[0] if len(states) == 1 else states, tx.init(rest))

  def update(updates, state, params=None):
    if not isinstance(state, LayersAsBatchState):
      return tx.update(updates, state, params)
    (u_scanned, u_rest), (p_scanned, p_rest) = _split(updates), _split(params)
    states = (state.scanned,) if len(u_scanned) == 1 else state.scanned
    mapped = [update_one(u, s, p) for u, s, p in zip(u_scanned, states, p_scanned)]
    u_rest, s_rest = tx.update(u_rest, state.rest, p_rest)
    states = tuple(s for _, s in mapped)
    return (_merge([u for u, _ in mapped], u_rest),
            LayersAsBatchState(states[0] if len(states) == 1 else states, s_rest))

  return optax.GradientTransformation(init, update)


@dataclasses.dataclass(frozen=True)
class RsqrtDecay:
  """`base / sqrt(max(step, warmup_steps))`; equal by value (a key of shared compiled steps)."""

  base_learning_rate: float
  warmup_steps: int

  def __call__(self, step: jax.Array) -> jax.Array:
    step = jnp.maximum(jnp.asarray(step, jnp.float32), float(self.warmup_steps))
    return jnp.float32(self.base_learning_rate) * jax.lax.rsqrt(step)


@dataclasses.dataclass(frozen=True)
class Constant:
  """A constant learning rate; equal by value (a key of shared compiled steps)."""

  learning_rate: float

  def __call__(self, step: jax.Array) -> jax.Array:
    del step
    return jnp.float32(self.learning_rate)


def rsqrt_decay(base_learning_rate: float = 1.0, warmup_steps: int = 10_000) -> LearningRateFn:
  """T5 pre-training: `base / sqrt(max(step, warmup_steps))` (constant 0.01 for the first 10k steps)."""
  if warmup_steps < 1:
    raise ValueError(f'warmup_steps must be >= 1, got {warmup_steps}')
  return RsqrtDecay(float(base_learning_rate), int(warmup_steps))


def constant(learning_rate: float = 1e-3) -> LearningRateFn:
  """Fine-tuning: a constant learning rate (T5 and the GQA paper: 1e-3)."""
  return Constant(float(learning_rate))
