"""The train state and the jitted, sharded train step.

`TrainState` is an explicit pytree: the global step, the parameters and the optimizer state. The
step is the schedule's clock and also seeds dropout (`fold_in(seed, step)`), so a resumed run draws
the same dropout masks as an uninterrupted one. The dropout key's PRNG implementation is
`DROPOUT_PRNG_IMPL` (the key is made from the integer seed inside the step, so checkpoints hold
no key and resume is exact under either implementation).

  step_fn = TrainStep(model_config, tx, rsqrt_decay(), partitioner)
  state = step_fn.init(rng, batch_size=128, feature_lengths)     # created sharded on the mesh
  state, metrics = step_fn(state, partitioner.shard_batch(batch))
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from typing import Any, Callable, Hashable, Mapping, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import optax

from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from gqa_spec.training import losses
from gqa_spec.training.optimizer import LearningRateFn
from gqa_spec.partitioning import Partitioner, path_name, put

# The features of seqio's EncDecFeatureConverter, packed or not; all `[batch, length]` int32.
MODEL_FEATURES = ('encoder_input_tokens', 'decoder_input_tokens', 'decoder_target_tokens',
                  'encoder_segment_ids', 'decoder_segment_ids', 'encoder_positions',
                  'decoder_positions')
LOSS_WEIGHTS = 'decoder_loss_weights'
# 'threefry2x32' (JAX's default: 20 rounds of counter hashing per 64 random bits, in XLA
# elementwise code) or 'rbg' (XLA's RngBitGenerator for the bits; split/fold_in by threefry, as
# t5x configures). Only dropout keys use it; parameter initialisation keeps JAX's default. rbg
# made the finetune step (mini, 16 x 64/64, dropout 0.1) 1.33x faster in an interleaved A/B on
# this CPU (results/benchmarks/train_throughput_rbg.md, at commit 692fd3e); resume stays bitwise-exact
# (tests/training/test_resume.py) and sharded == single-device (tests/training/test_sharding.py).
DROPOUT_PRNG_IMPL = 'rbg'


# Compiled train steps and abstract states shared by every `TrainStep` with the same key (config,
# optimizer, schedule, mesh and rules, loss settings, dropout seed): a process that runs many
# training jobs (`gqa-spec reproduce`: ~20 in the smoke preset) traces and compiles each distinct
# step once, not once per job. `optimizer.adafactor` returns one object per argument set and the
# schedules compare by value; any other optimizer or schedule is keyed by identity (never shared
# by mistake). Least recently used entries beyond `SHARED_STEPS` are dropped.
SHARED_STEPS = 16
_SHARED: 'collections.OrderedDict[Hashable, Any]' = collections.OrderedDict()
# Jobs may run in threads side by side (`gqa-spec reproduce`'s `workers`); a build may nest
# (a step's build reads the abstract state). Two threads calling a new jitted step together
# compile it once: JAX makes the second wait.
_SHARED_LOCK = threading.RLock()


def _shared(key: Hashable, build: Callable[[], Any]) -> Any:
  try:
    hash(key)
  except TypeError:  # an unhashable optimizer or schedule: nothing is shared
    return build()
  with _SHARED_LOCK:
    if key in _SHARED:
      _SHARED.move_to_end(key)
      return _SHARED[key]
    value = _SHARED[key] = build()
    while len(_SHARED) > SHARED_STEPS:
      _SHARED.popitem(last=False)
    return value


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: the global step (continues the original one when uptraining)
  params: Any
  opt_state: Any


def init_params(config: T5Config, rng: jax.Array, encoder_length: int = 8,
                decoder_length: int = 8) -> Any:
  """Freshly initialised parameters (shapes do not depend on the lengths)."""
  tokens = jnp.ones((1, encoder_length), jnp.int32)
  targets = jnp.ones((1, decoder_length), jnp.int32)
  return Transformer(config).init(rng, tokens, targets, targets, enable_dropout=False)['params']


def loss_and_metrics(params: Any, batch: Mapping[str, jax.Array], config: T5Config,
                     dropout_rng: Optional[jax.Array], z_loss: float,
                     loss_normalizing_factor: losses.LossNormalizingFactor) -> Tuple[jax.Array, dict]:
  """Teacher-forced objective of one batch; dropout on iff `dropout_rng` is given."""
  features = {k: batch[k] for k in MODEL_FEATURES if k in batch}
  enable_dropout = dropout_rng is not None and config.dropout_rate > 0
  logits = Transformer(config).apply(
      {'params': params}, **features, enable_dropout=enable_dropout,
      rngs={'dropout': dropout_rng} if enable_dropout else None)  # [batch, length, vocab]
  weights = batch.get(LOSS_WEIGHTS, batch['decoder_target_tokens'] > 0)
  return losses.weighted_cross_entropy(logits, batch['decoder_target_tokens'], weights, z_loss,
                                       loss_normalizing_factor)


def _train_step(state: TrainState, batch: Mapping[str, jax.Array], *, config: T5Config,
                tx: optax.GradientTransformation, learning_rate_fn: LearningRateFn, z_loss: float,
                loss_normalizing_factor: losses.LossNormalizingFactor,
                dropout_seed: int, dropout_prng_impl: str = DROPOUT_PRNG_IMPL
                ) -> Tuple[TrainState, dict]:
  dropout_rng = jax.random.fold_in(jax.random.key(dropout_seed, impl=dropout_prng_impl),
                                   state.step)
  grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, batch, config, dropout_rng, z_loss,
                                loss_normalizing_factor)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  learning_rate = learning_rate_fn(state.step)
  updates = jax.tree_util.tree_map(lambda u: learning_rate * u, updates)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics, learning_rate=learning_rate,
                 input_tokens=jnp.sum(batch['encoder_input_tokens'] > 0).astype(jnp.float32))
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


@dataclasses.dataclass
class TrainStep:
  """Builds, initialises and runs the jitted train step on a partitioner's mesh.

  Attributes:
    config: model configuration.
    tx: optimizer without learning rate (`optimizer.adafactor`).
    learning_rate_fn: global step -> learning rate.
    partitioner: mesh and rules.
    z_loss: z-loss coefficient (T5: 1e-4).
    loss_normalizing_factor: see `losses`.
    dropout_seed: base seed of the per-step dropout rng.
  """

  config: T5Config
  tx: optax.GradientTransformation
  learning_rate_fn: LearningRateFn
  partitioner: Partitioner
  z_loss: float = 1e-4
  loss_normalizing_factor: losses.LossNormalizingFactor = None
  dropout_seed: int = 0

  def __post_init__(self):
    losses.check_loss_normalizing_factor(self.loss_normalizing_factor)
    self._jitted = None

  def _key(self) -> Tuple[Any, ...]:
    """What the compiled step depends on besides the arguments' shapes (`_shared`)."""
    return (type(self), self.config, self.tx, self.learning_rate_fn, self.partitioner,
            self.z_loss, self.loss_normalizing_factor, self.dropout_seed)

  def abstract_state(self) -> TrainState:
    """Shapes and dtypes of the train state."""
    return _shared(('abstract', type(self), self.config, self.tx), lambda: jax.eval_shape(
        self._fresh_state, jax.random.PRNGKey(0), jnp.int32(0)))

  def state_shardings(self, abstract_state: Optional[TrainState] = None) -> TrainState:
    abstract_state = abstract_state or self.abstract_state()
    return self.partitioner.state_shardings(abstract_state, abstract_state.params)

  def _fresh_state(self, rng: jax.Array, step: jax.Array) -> TrainState:
    params = init_params(self.config, rng)
    return TrainState(step=jnp.asarray(step, jnp.int32), params=params,
                      opt_state=self.tx.init(params))

  def init(self, rng: jax.Array, step: int = 0) -> TrainState:
    """A freshly initialised train state, created directly in its sharded layout."""
    init_fn = jax.jit(self._fresh_state, out_shardings=self.state_shardings())
    return init_fn(rng, jnp.int32(step))

  def from_params(self, params: Any, step: int = 0) -> TrainState:
    """A train state around given parameters with a fresh optimizer state, placed on the mesh."""
    abstract = self.abstract_state()
    got = {path_name(p): (tuple(x.shape), jnp.dtype(x.dtype))
           for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    want = {path_name(p): (tuple(x.shape), jnp.dtype(x.dtype))
            for p, x in jax.tree_util.tree_flatten_with_path(abstract.params)[0]}
    if got != want:
      name = sorted(set(got) ^ set(want)) or sorted(k for k in got if got[k] != want[k])
      raise UserError(f'the initial parameters do not fit the model config (is the model gin or '
                      f'NUM_KV_HEADS the checkpoint\'s?): {name[0]} is {got.get(name[0])}, the '
                      f'config wants {want.get(name[0])}')
    shardings = self.state_shardings(abstract)
    params = put(params, shardings.params)  # loaded on each process alike
    opt_state = jax.jit(self.tx.init, out_shardings=shardings.opt_state)(params)
    return TrainState(step=put(jnp.int32(step), shardings.step), params=params,
                      opt_state=opt_state)

  def __call__(self, state: TrainState, batch: Mapping[str, jax.Array]) -> Tuple[TrainState, dict]:
    """One optimizer step; `state` is donated. Metrics are replicated scalars (sums, see `losses`)."""
    if self._jitted is None:
      self._jitted = _shared(('step',) + self._key(), self._jit)
    return self._jitted(state, batch)

  def _jit(self):
    step = functools.partial(
        _train_step, config=self.config, tx=self.tx, learning_rate_fn=self.learning_rate_fn,
        z_loss=self.z_loss, loss_normalizing_factor=self.loss_normalizing_factor,
        dropout_seed=self.dropout_seed)
    shardings = self.state_shardings()
    return jax.jit(step, in_shardings=(shardings, self.partitioner.batch_sharding()),
                   out_shardings=(shardings, self.partitioner.replicated), donate_argnums=0)
