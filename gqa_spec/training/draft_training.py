"""Drafts trained against a frozen target: Chimera, and sequence-level distilled T5 drafts.

`DraftTrainStep` has `TrainStep`'s interface, so `trainer.train(step_fn=...)` runs it with the same
loop, orbax checkpoints, resume, logging and signal handling as any run. The train state holds the
draft's parameters only; the target's parameters are a separate, never-differentiated argument of
the jitted step (not donated, not in the optimizer), so they cannot change.

Each step, for the batch's inputs (unpacked examples):
  1. labels s_1..s_L: the target's own greedy continuation (`label_source='target'`, the issue's
     distillation, as Medusa's self-distillation), or the data's targets (`'data'`, the Chimera
     paper's Eq. 4, which trains on the dataset's tokens);
  2. one teacher-forced target pass over s_0..s_{L-1} gives its final hidden states h_0..h_{L-1}
     and its logits;
  3. the draft's loss:
     chimera: sum over heads i of CE(head i at position j, s_{j+i}) + mse_weight * ||f_j - h_j||^2
       (the paper's Eqs. 4-6; the MSE is the mean over the D features, per position);
     model:   CE(draft T5, s_{j+1}) on (inputs, s) — sequence-level KD (Kim & Rush 2016) — plus
       kl_weight * KL(target || draft) per token (token-level KD; 0 = off).
  The objective is the per-label-token mean. Metrics follow `losses.weighted_cross_entropy`'s sums
  (the trainer's log): for Chimera `accuracy` is pooled over all heads' labels.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from gqa_spec.decoding import autoregressive
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec import arguments, rundir_lock
from gqa_spec.errors import UserError
from gqa_spec.rundir import DRAFT_EXPORT_DIR
from gqa_spec.models import chimera
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from gqa_spec.training import losses
from gqa_spec.training.optimizer import LearningRateFn
from gqa_spec.partitioning import Partitioner, create_mesh, logical_axis_rules, put
from gqa_spec.training.train_step import TrainState, TrainStep, init_params as t5_init_params

PyTree = Any
KINDS = ('chimera', 'model')
LABEL_SOURCES = ('target', 'data')


def check_choice(name: str, value: str, choices) -> None:
  if value not in choices:
    raise UserError(f'{name} must be one of {", ".join(choices)}; got {value!r}')


def target_labels(target_model: Transformer, target_params: PyTree, batch: Mapping[str, jax.Array],
                  label_source: str) -> jax.Array:
  """`[b, L]` s_1..s_L (PAD after EOS): the target's greedy continuation or the data's targets."""
  data = batch['decoder_target_tokens']  # [b, L]
  if label_source == 'data':
    return data
  length = data.shape[1]
  decoder = T5Decoder(target_model)
  state = decoder.init(target_params, batch['encoder_input_tokens'], length)
  result = autoregressive.decode(decoder, state, jax.random.PRNGKey(0), max_decode_len=length)
  return result.sequences[:, 1:]  # [b, L]


def target_forward(target_model: Transformer, target_params: PyTree, encoder_input_tokens: jax.Array,
                   labels: jax.Array) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Teacher-forced target over s_0..s_{L-1}: `(decoder inputs [b, L], logits [b, L, V], hidden [b, L, D])`."""
  inputs = jnp.concatenate([jnp.zeros_like(labels[:, :1]), labels[:, :-1]], axis=1)  # [b, L]
  variables = {'params': target_params}
  encoded = target_model.apply(variables, encoder_input_tokens, method=Transformer.encode)
  logits, hidden = target_model.apply(variables, encoded, encoder_input_tokens, inputs, labels,
                                      return_hidden=True, method=Transformer.decode)
  return inputs, logits, hidden


def head_labels(labels: jax.Array, num_heads: int) -> jax.Array:
  """`[b, L]` s_1..s_L -> `[b, L, H]`: head i's label at position j is s_{j+i} (PAD past the end)."""
  length = labels.shape[1]
  padded = jnp.concatenate([labels, jnp.zeros((labels.shape[0], num_heads), labels.dtype)], axis=1)
  return jnp.stack([padded[:, i:i + length] for i in range(num_heads)], axis=2)  # [b, L, H]


def chimera_loss(params: PyTree, config: chimera.ChimeraConfig, embedding: jax.Array,
                 inputs: jax.Array, hidden: jax.Array, labels: jax.Array, z_loss: float,
                 mse_weight: float) -> Tuple[jax.Array, dict]:
  """The paper's objective (Eqs. 4-6) at every position of a teacher-forced batch."""
  batch, length = inputs.shape
  qpos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None], (batch, length))
  f, logits = chimera.Chimera(config).apply({'params': params}, embedding, inputs, hidden,
                                            qpos)  # [b, L, D], [b, L, H, V]
  targets = head_labels(labels, config.num_draft_heads)  # [b, L, H]
  weights = (targets > 0).astype(jnp.float32)
  token_loss, z_part = losses.cross_entropy_with_logits(logits, targets, z_loss)  # [b, L, H]
  position = (labels > 0).astype(jnp.float32)  # [b, L] position j holds a real s_j
  mse = jnp.mean(jnp.square(f - hidden), axis=-1)  # [b, L]
  ce_sum = jnp.sum(token_loss * weights)
  mse_sum = jnp.sum(mse * position)
  weight_sum = jnp.sum(weights)
  objective = (ce_sum + mse_weight * mse_sum) / jnp.maximum(weight_sum, 1.0)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return objective, {'loss_sum': ce_sum + mse_weight * mse_sum, 'z_loss_sum': jnp.sum(z_part * weights),
                     'correct_sum': jnp.sum(correct * weights), 'weight_sum': weight_sum,
                     'mse_sum': mse_sum, 'position_sum': jnp.sum(position)}


def model_draft_loss(params: PyTree, config: T5Config, encoder_input_tokens: jax.Array,
                     inputs: jax.Array, labels: jax.Array, target_logits: jax.Array, z_loss: float,
                     kl_weight: float) -> Tuple[jax.Array, dict]:
  """Sequence-level KD (CE on the target's outputs) plus optional token-level KL(target || draft)."""
  logits = Transformer(config).apply({'params': params}, encoder_input_tokens, inputs, labels,
                                     enable_dropout=False)  # [b, L, V]
  weights = (labels > 0).astype(jnp.float32)
  objective, metrics = losses.weighted_cross_entropy(logits, labels, weights, z_loss,
                                                     losses.NUM_REAL_TARGET_TOKENS)
  if kl_weight:
    p_log = jax.nn.log_softmax(target_logits, axis=-1)
    kl = jnp.sum(jnp.exp(p_log) * (p_log - jax.nn.log_softmax(logits, axis=-1)), axis=-1)  # [b, L]
    kl_sum = jnp.sum(kl * weights)
    objective = objective + kl_weight * kl_sum / jnp.maximum(metrics['weight_sum'], 1.0)
    metrics = dict(metrics, loss_sum=metrics['loss_sum'] + kl_weight * kl_sum, kl_sum=kl_sum)
  return objective, metrics


@dataclasses.dataclass
class DraftTrainStep:
  """`TrainStep`'s interface for a draft trained against a frozen target.

  Attributes:
    kind: 'chimera' or 'model'.
    draft_config: `ChimeraConfig` or the draft's `T5Config`.
    target_config, target_params: the frozen target.
    tx, learning_rate_fn: optimizer (without learning rate) and schedule.
    partitioner: mesh and rules (`DraftTrainStep.create` builds it from the draft's config).
    label_source: 'target' (its greedy outputs) or 'data'.
    z_loss, mse_weight (chimera), kl_weight (model): loss coefficients.
    seed: draft initialisation seed.
  """

  kind: str
  draft_config: Any
  target_config: T5Config
  target_params: PyTree
  tx: optax.GradientTransformation
  learning_rate_fn: LearningRateFn
  partitioner: Partitioner
  label_source: str = 'target'
  z_loss: float = 1e-4
  mse_weight: float = 1.0
  kl_weight: float = 0.0

  def __post_init__(self):
    check_choice('kind', self.kind, KINDS)
    check_choice('label_source', self.label_source, LABEL_SOURCES)
    if self.kind == 'chimera':
      try:
        self.draft_config.check_target(self.target_config)
      except ValueError as e:
        raise UserError(str(e)) from None
    elif self.draft_config.vocab_size != self.target_config.vocab_size:
      raise UserError(f'draft vocabulary {self.draft_config.vocab_size} != target vocabulary '
                      f'{self.target_config.vocab_size}: a draft shares its target\'s vocabulary; '
                      'after the model gin add --gin_bindings=\'config.T5Config.vocab_size = '
                      f'{self.target_config.vocab_size}\'')
    self._jitted = None
    self.target_params = put(self.target_params, self.partitioner.replicated)

  @classmethod
  def create(cls, kind: str, draft_config: Any, target_config: T5Config, target_params: PyTree,
             tx, learning_rate_fn, data: int = -1, **kwargs) -> 'DraftTrainStep':
    mesh = create_mesh(data, 1)  # drafts are small: data parallel only
    return cls(kind, draft_config, target_config, target_params, tx, learning_rate_fn,
               Partitioner(mesh, logical_axis_rules(draft_config, 1)), **kwargs)

  def _fresh_params(self, rng: jax.Array) -> PyTree:
    if self.kind == 'chimera':
      return chimera.init_params(self.draft_config, self.target_config, self.target_params, rng)
    return t5_init_params(self.draft_config, rng)

  def _fresh_state(self, rng: jax.Array, step: jax.Array) -> TrainState:
    params = self._fresh_params(rng)
    return TrainState(step=jnp.asarray(step, jnp.int32), params=params,
                      opt_state=self.tx.init(params))

  def abstract_state(self) -> TrainState:
    return jax.eval_shape(self._fresh_state, jax.random.PRNGKey(0), jnp.int32(0))

  def state_shardings(self, abstract_state: Optional[TrainState] = None) -> TrainState:
    abstract_state = abstract_state or self.abstract_state()
    return self.partitioner.state_shardings(abstract_state, abstract_state.params)

  def init(self, rng: jax.Array, step: int = 0) -> TrainState:
    return jax.jit(self._fresh_state, out_shardings=self.state_shardings())(rng, jnp.int32(step))

  def from_params(self, params: PyTree, step: int = 0) -> TrainState:
    """A model draft's state around given parameters (e.g. an independently trained draft's)."""
    if self.kind != 'model':
      raise UserError('a Chimera draft starts from the target (its heads from the target\'s logits '
                      'layer) or resumes its own MODEL_DIR; initial_checkpoint_path is for '
                      '--kind model')
    return TrainStep.from_params(self, params, step)  # the same checks and placement

  def loss(self, params: PyTree, target_params: PyTree,
           batch: Mapping[str, jax.Array]) -> Tuple[jax.Array, dict]:
    """The draft's objective and metric sums for one batch (the target enters frozen)."""
    if 'decoder_segment_ids' in batch:
      raise UserError('draft training needs unpacked examples (DatasetConfig pack = False)')
    target_params = jax.lax.stop_gradient(target_params)
    target = Transformer(self.target_config)
    enc = batch['encoder_input_tokens']
    labels = target_labels(target, target_params, batch, self.label_source)  # [b, L]
    inputs, target_logits, hidden = target_forward(target, target_params, enc, labels)
    if self.kind == 'chimera':
      embedding = target_params['token_embedder']['embedding']
      return chimera_loss(params, self.draft_config, embedding, inputs, hidden, labels,
                          self.z_loss, self.mse_weight)
    return model_draft_loss(params, self.draft_config, enc, inputs, labels, target_logits,
                            self.z_loss, self.kl_weight)

  def _step(self, state: TrainState, target_params: PyTree,
            batch: Mapping[str, jax.Array]) -> Tuple[TrainState, dict]:
    grad_fn = jax.value_and_grad(self.loss, has_aux=True)
    (_, metrics), grads = grad_fn(state.params, target_params, batch)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    learning_rate = self.learning_rate_fn(state.step)
    updates = jax.tree_util.tree_map(lambda u: learning_rate * u, updates)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, learning_rate=learning_rate,
                   input_tokens=jnp.sum(batch['encoder_input_tokens'] > 0).astype(jnp.float32))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def __call__(self, state: TrainState, batch: Mapping[str, jax.Array]) -> Tuple[TrainState, dict]:
    """One optimizer step of the draft; `state` is donated, the target's parameters are not."""
    if self._jitted is None:
      shardings = self.state_shardings()
      self._jitted = jax.jit(
          self._step, in_shardings=(shardings, self.partitioner.replicated,
                                    self.partitioner.batch_sharding()),
          out_shardings=(shardings, self.partitioner.replicated), donate_argnums=0)
    return self._jitted(state, self.target_params, batch)


def adam(b1: float = 0.9, b2: float = 0.999, clip_norm: Optional[float] = 1.0):
  """Adam without learning rate (the trainer multiplies by its schedule), gradient-norm clipped."""
  import optax  # pylint: disable=g-import-not-at-top
  parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
  return optax.chain(*parts, optax.scale_by_adam(b1=b1, b2=b2), optax.scale(-1.0))


def train_draft(*, kind: str, target_checkpoint: str, model_dir: str, train_dataset_cfg,
                total_steps: int, draft_model_config=None, num_draft_heads: int = 4,
                chimera_overrides: Optional[dict] = None, optimizer=None, learning_rate_fn=None,
                label_source: str = 'target', z_loss: float = 1e-4, mse_weight: float = 1.0,
                kl_weight: float = 0.0, checkpoint_cfg=None, log_period: int = 50,
                random_seed: int = 0, initial_checkpoint_path: Optional[str] = None) -> Any:
  """Trains (or resumes) a draft against the frozen target at `target_checkpoint`.

  Args:
    kind: 'chimera' or 'model'.
    target_checkpoint: native, trainer-run or HF checkpoint of the target (`checkpoints.load.load_any`).
    model_dir: the run directory.
    train_dataset_cfg: unpacked training examples (`data.DatasetConfig`, pack=False).
    total_steps: absolute step to stop at.
    draft_model_config: kind 'model': the draft's `T5Config` (same vocabulary as the target).
    num_draft_heads: kind 'chimera': residual heads (the largest gamma it can serve).
    chimera_overrides: kind 'chimera': other `ChimeraConfig` fields (default: sized like the
      target's decoder layer, `ChimeraConfig.for_target`).
    optimizer, learning_rate_fn: default `adam()` and a constant 1e-3.
    label_source: 'target' (its greedy outputs, the default) or 'data'.
    z_loss, mse_weight, kl_weight: loss coefficients (see `DraftTrainStep`).
    checkpoint_cfg: `trainer.CheckpointConfig`.
    log_period: steps between logged metrics.
    random_seed: draft initialisation seed.
    initial_checkpoint_path: kind 'model': start from this checkpoint of the draft (e.g. the
      independently trained draft; fresh optimizer state, step 0) instead of a random draft; a
      run that has checkpoints of its own resumes from them instead.

  Returns:
    The trainer's `TrainResult`.
  """
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  from gqa_spec.models import chimera  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import drafts as draft_records  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import optimizer as opt, trainer  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints.load import load_any, vocab_of  # pylint: disable=g-import-not-at-top
  from gqa_spec.data import vocab_fit  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import data as data_lib  # pylint: disable=g-import-not-at-top
  check_choice('kind', kind, KINDS)
  if train_dataset_cfg.pack:
    raise UserError('draft training needs unpacked examples: set DatasetConfig.pack = False')
  arguments.check_outputs({'MODEL_DIR': model_dir}, {'TARGET_CHECKPOINT': target_checkpoint},
                          folders=True)  # not inside the target it reads
  if jax.process_index() == 0:
    rundir_lock.check_free(model_dir)  # another writer is named first, before any input is read
  # Everything that can refuse the run is checked before the run directory is made: a refused
  # run leaves nothing behind (no directory, no draft.json naming a draft never trained).
  if kind == 'chimera' and initial_checkpoint_path:
    raise UserError('a Chimera draft starts from the target (its heads from the target\'s logits '
                    'layer) or resumes its own MODEL_DIR; initial_checkpoint_path is for '
                    '--kind model')
  target_config, target_params, _ = load_any(target_checkpoint)
  if kind == 'chimera':
    draft_config = chimera.ChimeraConfig.for_target(
        target_config, num_draft_heads=num_draft_heads, **(chimera_overrides or {}))
  elif draft_model_config is None:
    raise UserError('--kind model needs the draft architecture: a model gin (e.g. '
                    '--gin_file=models/t5_1_1/nano.gin) setting DRAFT_MODEL_CONFIG')
  else:
    draft_config = draft_model_config
  step = DraftTrainStep.create(
      kind, draft_config, target_config, target_params, optimizer or adam(),
      learning_rate_fn or opt.constant(1e-3), label_source=label_source, z_loss=z_loss,
      mse_weight=mse_weight, kl_weight=kl_weight)
  task_name = train_dataset_cfg.mixture_or_task_name
  if task_name != 'synthetic' and not task_name.startswith('exported:'):
    from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top  (TensorFlow)
    tasks.use_data_of(target_checkpoint)  # the target knows its data (the smoke run's, say)
  if train_dataset_cfg.mixture_or_task_name != 'synthetic':
    vocab_fit.check(data_lib.vocab_sizes(train_dataset_cfg.mixture_or_task_name),
                    target_config.vocab_size, f'the target {target_checkpoint}',
                    checkpoint=target_checkpoint)
  with rundir_lock.running(model_dir, enabled=jax.process_index() == 0):
    # Held from the draft record to the export (the trainer takes it again, as the same process).
    draft_records.write_draft_file(model_dir, kind, target_checkpoint, draft_config)
    result = trainer.train(model_dir=model_dir, model_config=draft_config,
                           train_dataset_cfg=train_dataset_cfg, total_steps=total_steps,
                           checkpoint_cfg=checkpoint_cfg or trainer.CheckpointConfig(),
                           log_period=log_period, random_seed=random_seed, step_fn=step,
                           initial_checkpoint_path=initial_checkpoint_path,
                           initial_step=0 if initial_checkpoint_path else None)
    if kind == 'model':
      config, params, _ = load_any(model_dir)
      native.save_checkpoint(os.path.join(model_dir, DRAFT_EXPORT_DIR), config, params,
                             # the run's task vocabulary, else the target's: a draft shares it
                             vocab_path=vocab_of(model_dir) or vocab_of(target_checkpoint),
                             overwrite=True)
    return result


def _hits(logits: jax.Array, targets: jax.Array, max_k: int) -> Tuple[jax.Array, jax.Array]:
  """`[b, L, H, V]` logits, `[b, L, H]` labels -> (`[H, k]` top-1..k hits, `[H]` labels)."""
  _, top = jax.lax.top_k(logits, max_k)  # [b, L, H, k]
  hit = jnp.cumsum(top == targets[..., None], axis=-1) > 0  # [b, L, H, k]: within the top-k
  valid = targets > 0  # [b, L, H]
  return jnp.sum(hit & valid[..., None], axis=(0, 1)), jnp.sum(valid, axis=(0, 1))


@functools.partial(jax.jit, static_argnames=('config', 'target_config', 'max_k'))
def _topk_counts(params, target_params, batch, *, config, target_config, max_k):
  target = Transformer(target_config)
  labels = target_labels(target, target_params, batch, 'target')  # [b, L]
  inputs, _, hidden = target_forward(target, target_params, batch['encoder_input_tokens'], labels)
  if isinstance(config, T5Config):  # a model draft, teacher-forced on the target's outputs
    logits = Transformer(config).apply({'params': params}, batch['encoder_input_tokens'], inputs,
                                       labels, enable_dropout=False)  # [b, L, V]
    return _hits(logits[:, :, None], labels[..., None], max_k)
  batch_size, length = inputs.shape
  qpos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None], (batch_size, length))
  _, logits = chimera.Chimera(config).apply(
      {'params': params}, target_params['token_embedder']['embedding'], inputs, hidden,
      qpos)  # [b, L, H, V]
  return _hits(logits, head_labels(labels, config.num_draft_heads), max_k)  # [H, k], [H]


def head_topk_accuracy(config: Any, params: PyTree, target_config: T5Config,
                       target_params: PyTree, batches, max_k: int = 5) -> list:
  """Chimera Table 5's form: per head, top-1..max_k accuracy against the target's greedy outputs.

  Head i (1-based; the paper's head i - 1) at position j is counted correct at top-k when the
  target's greedy token s_{j+i} is among its k largest logits, over every (row, j) where s_{j+i}
  exists. A model draft (`config` a `T5Config`) has one "head": its next-token logits,
  teacher-forced on the target's greedy outputs (what Chimera's head 1 predicts; its later tokens
  are conditioned on its own guesses, so heads 2.. have no teacher-forced counterpart).

  Returns:
    `[{'head': i, 'labels': n, 'top1': ..., 'top5': ...}, ...]`.
  """
  hits, counts = 0, 0
  for batch in batches:
    h, c = _topk_counts(params, target_params, {k: jnp.asarray(v) for k, v in batch.items()},
                        config=config, target_config=target_config, max_k=max_k)
    hits, counts = hits + jax.device_get(h), counts + jax.device_get(c)
  return [dict({'head': i + 1, 'labels': int(counts[i])},
               **{f'top{k + 1}': float(hits[i][k]) / max(int(counts[i]), 1) for k in range(max_k)})
          for i in range(len(counts))]
