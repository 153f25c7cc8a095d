"""The training loop: data -> sharded train step -> metrics, checkpoints, evaluation, best export.

`train` is t5x's `train.py` without t5x: plain Python arguments (gin binds them at the edge, see
`configs/runs/*.gin`). One run directory (`model_dir`) holds everything:

  config.json              the model config
  checkpoints/<step>/      orbax train-state checkpoints (keep-last-N; `manager.py`)
  train_log.jsonl          one JSON object per logged step (`metrics.py`), train and eval
  train/, eval/            TensorBoard event files
  best/, best.json         native checkpoint of the best evaluation so far, and its metrics
  RUNNING.json             the one-writer lock while a process trains (`rundir_lock`)

Start-up, in order of precedence:
  1. `model_dir` has checkpoints: resume from the latest (same step, same optimizer state, same
     data position: the pipeline skips the batches already consumed since it started);
  2. `initial_checkpoint_path`: its parameters with a fresh optimizer state, starting at its step
     when it records one (t5x fine-tuning continues the pre-training step count), else 0;
  3. random initialisation at step 0.
`total_steps` is the absolute step training ends at (as t5x's TRAIN_STEPS).

Failure handling: a non-finite loss raises `NonFiniteLossError` naming the step; every save is
preceded by a finiteness check of all steps since the last one, so only good states are
checkpointed. SIGTERM or Ctrl-C stops and saves ("save on exit"): the loop keeps at most
`MAX_IN_FLIGHT` steps queued on the device (it reads step n-2's metrics before dispatching step
n+1, and dispatches nothing once a stop is requested), so a stop waits for at most two step times
plus the save, within a pre-emption notice. Several processes stop after the same step and save
together whichever of them the signal reached, and when (`_StopVotes`: up to `MAX_IN_FLIGHT` steps
more). A second Ctrl-C interrupts at once, without saving.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import json
import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Mapping, Optional, Protocol

import jax
import numpy as np

from gqa_spec.rundir import BEST_DIR, BEST_FILE
from gqa_spec import arguments, atomic, progress, rundir, rundir_lock
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.checkpoints import manager
from gqa_spec.training import losses
from gqa_spec.checkpoints.load import load_any
from gqa_spec.data import vocab_fit
from gqa_spec.training import summaries
from gqa_spec.training.data import DatasetConfig, get_batches, vocab_sizes
from gqa_spec.data.text_inputs import vocab_file
from gqa_spec.training.optimizer import LearningRateFn, adafactor, rsqrt_decay
from gqa_spec import distributed
from gqa_spec.partitioning import Partitioner
from gqa_spec.training.train_step import TrainState, TrainStep

log = logging.getLogger(__name__)

# Steps dispatched to the device ahead of the host. Two keep the device busy while the host
# fetches the next batch (dispatch stays overlapped) and bound what a stop request waits for.
MAX_IN_FLIGHT = 2


class NonFiniteLossError(UserError):
  """The loss became NaN or infinite; training stopped without saving the bad state."""


class Evaluator(Protocol):
  """Evaluates parameters (e.g. `evaluation.InferenceEvaluator`): metric name -> value."""

  def __call__(self, params: Any, step: int) -> Mapping[str, float]:
    ...


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Attributes: save_period (steps), keep (latest N), asynchronous (background writes)."""

  save_period: int = 1000
  keep: Optional[int] = 3
  asynchronous: bool = True


@dataclasses.dataclass(frozen=True)
class PartitioningConfig:
  """Mesh shape and multi-host start-up.

  Attributes:
    data: data-parallel size; -1 uses every device not taken by `model`.
    model: model-parallel size.
    multihost: start JAX's multi-process runtime (`distributed.initialize`: the cluster
      auto-detected, or the fields below); the CLI's `--coordinator ...` flags do the same.
    coordinator_address: `host:port` of process 0, for clusters JAX cannot detect.
    num_processes: number of processes in that case.
    process_id: this process's index in that case.
  """

  data: int = -1
  model: int = 1
  multihost: bool = False
  coordinator_address: Optional[str] = None
  num_processes: Optional[int] = None
  process_id: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """What a finished run reports: its last step, last logged train metrics, best evaluation, and
  the signal that stopped it before `total_steps` (None: it ran to the end, or `stop_when` stopped
  it)."""

  step: int
  train_metrics: Mapping[str, float]
  best: Optional[Mapping[str, Any]]
  stop_signal: Optional[int] = None


def train(*, model_dir: str, model_config: T5Config, train_dataset_cfg: DatasetConfig,
          total_steps: int, optimizer=None, learning_rate_fn: Optional[LearningRateFn] = None,
          z_loss: float = 1e-4, loss_normalizing_factor: losses.LossNormalizingFactor = None,
          partitioning: PartitioningConfig = PartitioningConfig(),
          checkpoint_cfg: CheckpointConfig = CheckpointConfig(),
          initial_checkpoint_path: Optional[str] = None,
          initial_checkpoint_config: Optional[T5Config] = None,
          initial_step: Optional[int] = None,
          evaluator: Optional[Evaluator] = None, eval_period: Optional[int] = None,
          best_metric: Optional[str] = None, best_mode: str = 'max',
          log_period: int = 100, random_seed: int = 0,
          progress_bar: Optional[bool] = None, step_fn: Optional[Any] = None) -> TrainResult:
  """Trains (or resumes training) until `total_steps`.

  Args:
    model_dir: run directory (created).
    model_config: the model; on resume it must equal the checkpoint's.
    train_dataset_cfg: training data (`data.DatasetConfig`).
    total_steps: absolute step to stop at.
    optimizer: optax transformation without learning rate (default `optimizer.adafactor()`).
    learning_rate_fn: global step -> learning rate (default `optimizer.rsqrt_decay()`).
    z_loss: z-loss coefficient.
    loss_normalizing_factor: None (sum), a number, or 'NUM_REAL_TARGET_TOKENS'.
    partitioning: mesh and multi-host settings.
    checkpoint_cfg: checkpoint period and retention.
    initial_checkpoint_path: trainer run dir, native, HF or T5X checkpoint to start from.
    initial_checkpoint_config: the model config of a T5X initial checkpoint (which records none);
      default `model_config`.
    initial_step: step to start at from `initial_checkpoint_path` (default: the checkpoint's step,
      or 0 when it records none).
    evaluator: called every `eval_period` steps and at the end.
    eval_period: steps between evaluations (None: only at the end, if an evaluator is given).
    best_metric: evaluator metric that selects the best checkpoint (exported to `best/`).
    best_mode: 'max' or 'min'.
    log_period: steps between train-metric records (and finiteness checks).
    random_seed: parameter initialisation and dropout seed.
    progress_bar: show a progress bar (None: on terminals); without one, progress is logged as
      lines (`gqa_spec.progress`).
    step_fn: a prebuilt train step with `TrainStep`'s interface (its partitioner, state, loss), e.g.
      `draft_training.DraftTrainStep` (drafts trained against a frozen target); its optimizer,
      learning rate, loss and mesh are used (passing `optimizer` / `learning_rate_fn` too is an
      error; z-loss and the mesh shape arguments are then ignored).

  Returns:
    A `TrainResult`.
  """
  if total_steps < 1 or log_period < 1 or (eval_period is not None and eval_period < 1):
    raise UserError(f'total_steps ({total_steps}), log_period ({log_period}) and eval_period '
                    f'({eval_period}) must be positive')
  if best_mode not in ('max', 'min'):
    raise UserError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
  if step_fn is not None and (optimizer is not None or learning_rate_fn is not None):
    raise UserError('with step_fn, the optimizer and learning rate belong to the step, not train()')
  if partitioning.multihost:  # a no-op when the command's flags started the same job
    distributed.initialize(partitioning.coordinator_address, partitioning.num_processes,
                           partitioning.process_id)
  partitioner = (step_fn.partitioner if step_fn is not None else
                 Partitioner.create(model_config, partitioning.data, partitioning.model))
  if train_dataset_cfg.batch_size % partitioner.data_size:
    raise UserError(f'batch_size {train_dataset_cfg.batch_size} is not divisible by the data-'
                    f'parallel size {partitioner.data_size}')
  if partitioner.data_size % jax.process_count():
    raise UserError(f'the data-parallel size {partitioner.data_size} is not divisible by the '
                    f'{jax.process_count()} processes: each process feeds its own slice of the '
                    'batch (use a model-parallel size that divides the devices of one process)')
  step_fn = step_fn or TrainStep(model_config, optimizer or adafactor(),
                                 learning_rate_fn or rsqrt_decay(), partitioner, z_loss,
                                 loss_normalizing_factor, dropout_seed=random_seed)
  if train_dataset_cfg.mixture_or_task_name != 'synthetic':  # before the run directory exists
    vocab_fit.check(vocab_sizes(train_dataset_cfg.mixture_or_task_name),
                    model_config.vocab_size, 'model_config', checkpoint=initial_checkpoint_path)
  if initial_checkpoint_path:  # the run directory may not lie inside what it starts from
    arguments.check_outputs({'MODEL_DIR': model_dir}, {'INITIAL_CHECKPOINT_PATH':
                                                        initial_checkpoint_path}, folders=True)
  is_writer = jax.process_index() == 0  # one process takes the lock and writes the files
  # Before anything reads or writes the run directory: a second writer stops here, at once.
  with rundir_lock.running(model_dir, enabled=is_writer, total_steps=total_steps):
    ckpt = manager.Checkpointer(model_dir, checkpoint_cfg.save_period, checkpoint_cfg.keep,
                                checkpoint_cfg.asynchronous)
    state, data_start_step = _start(step_fn, ckpt, model_config, initial_checkpoint_path,
                                    initial_checkpoint_config or model_config, initial_step,
                                    random_seed)
    if is_writer:
      atomic.write_text(os.path.join(model_dir, 'config.json'), model_config.to_json() + '\n')
      _copy_vocab(train_dataset_cfg.mixture_or_task_name, model_dir)
    step = int(state.step)
    meta = {'model_config': model_config.to_dict(), 'data_start_step': data_start_step,
            'dataset': dataclasses.asdict(train_dataset_cfg)}
    log.info('training %s from step %d to %d on mesh %s', model_dir, step, total_steps,
             dict(partitioner.mesh.shape))
    writer = summaries.MetricWriter(model_dir, step, is_writer)
    bar = progress.Progress('train', total_steps, step, bar=progress_bar, enabled=is_writer)
    best = _read_best(model_dir)
    batches = get_batches(train_dataset_cfg, skip_batches=step - data_start_step)
    # Dispatched steps whose metrics the host has not read yet, oldest first: [(step, metrics)].
    # At most MAX_IN_FLIGHT stay queued, so a stop request waits for at most that many steps.
    in_flight = collections.deque()
    window, last_metrics, window_start = [], {}, time.time()  # host metrics since the last record

    # Several processes stop only together: each step carries every process's stop request into
    # an all-reduce (`_StopVotes`), read when the step retires, at the same point on every process.
    votes = _StopVotes() if jax.process_count() > 1 else None
    agreed = False  # (several processes) some process asked to stop, seen by all at the same step

    def retire(keep: int) -> None:
      """Waits for the oldest in-flight steps until `keep` remain; checks and records each."""
      nonlocal agreed
      while len(in_flight) > keep:
        s, m, vote = in_flight.popleft()
        m = jax.device_get(m)
        agreed = agreed or (vote is not None and bool(jax.device_get(vote)))
        if not np.isfinite(m['loss_sum']):
          latest = ckpt.latest_step()
          raise NonFiniteLossError(
              f'non-finite loss ({float(m["loss_sum"])}) at step {s}; training stopped, the last '
              f'good checkpoint is ' + (f'step {latest} in {ckpt.directory}' if latest is not None
                                   else 'none (no checkpoint was saved yet)'))
        window.append(m)
        bar.update(s, loss=float(m['loss_sum']) / max(float(m['weight_sum']), 1.0),
                   tokens=float(m['weight_sum']) + float(m['input_tokens']))

    def check_and_log() -> None:
      nonlocal window, last_metrics, window_start
      retire(0)
      if not window:
        return
      last_metrics = summaries.summarize(window, time.time() - window_start)
      writer.write_scalars(step, last_metrics)
      window, window_start = [], time.time()

    stop = _StopFlag(lambda: len(in_flight))
    stopping = lambda: agreed if votes is not None else stop.requested
    own_request = False  # whether this process asked to stop before the loop ended
    # The handlers stay until the last save is committed (`ckpt.close`): a process of several that
    # stops on its peers' request may get its own SIGTERM only then, and must still finish it.
    with stop.installed():
      try:
        while step < total_steps and not stopping():
          batch = next(batches)
          if votes is None and stop.requested:  # arrived while the batch was read: no more steps
            break
          state, step_metrics = step_fn(state, partitioner.shard_batch(batch))
          step += 1
          in_flight.append((step, step_metrics, votes.cast(stop.requested) if votes else None))
          retire(MAX_IN_FLIGHT)
          save_due = step % checkpoint_cfg.save_period == 0
          eval_due = evaluator is not None and eval_period is not None and step % eval_period == 0
          if step % log_period == 0 or save_due or eval_due or step == total_steps:
            check_and_log()
          if save_due:
            ckpt.save(step, state, meta)
          if eval_due and not stopping():
            best = _evaluate(evaluator, state, step, model_config, model_dir, writer, best,
                             best_metric, best_mode, is_writer)
        own_request = stop.requested  # (a signal from now on only waits for the last save)
        check_and_log()
        ckpt.save(step, state, meta, force=True)
        if (evaluator is not None and (eval_period is None or step % eval_period)
            and not stopping()):
          best = _evaluate(evaluator, state, step, model_config, model_dir, writer, best,
                           best_metric, best_mode, is_writer)
      finally:
        bar.close()
        writer.close()
        ckpt.close()
    if votes is not None and agreed and not own_request:  # a peer's request
      log.warning('stopped at step %d as another process asked; saved a checkpoint', step)
    elif stopping():
      by, after = (('signal', 'the signal') if stop.signum is not None
                   else ('request', 'the request'))
      log.warning('stopped by %s at step %d; saved a checkpoint (%.1f s after %s)', by, step,
                  time.time() - stop.requested_at, after)
    return TrainResult(step=step, train_metrics=last_metrics, best=best, stop_signal=stop.signum)


def _start(step_fn: TrainStep, ckpt: manager.Checkpointer, config: T5Config,
           initial_checkpoint_path: Optional[str], t5x_config: T5Config,
           initial_step: Optional[int],
           random_seed: int):
  """(state, data_start_step) from the latest checkpoint, an initial checkpoint, or scratch."""
  latest = ckpt.latest_step()
  if latest is not None:
    target = manager.abstract_with_shardings(step_fn.abstract_state(),
                                                   step_fn.state_shardings())
    meta = rundir.check_record(ckpt.restore_meta(latest), {'model_config': dict,
                                                          'data_start_step': int},
                               f'{ckpt.directory}/{latest}/meta', 'train-state checkpoint meta')
    _check_same_config(config, meta['model_config'], ckpt.directory)
    state, meta = ckpt.restore(latest, target)
    log.info('resumed from %s/%d', ckpt.directory, latest)
    return state, int(meta['data_start_step'])
  if initial_checkpoint_path:
    # Into this run's layer layout (a Chimera draft's config has no layer stacks: as written).
    _, params, step = load_any(initial_checkpoint_path, t5x_config,
                               getattr(config, 'scan_layers', None))
    start = initial_step if initial_step is not None else (step or 0)
    state = step_fn.from_params(params, start)
    log.info('initialised from %s at step %d', initial_checkpoint_path, start)
    return state, start
  start = initial_step or 0
  return step_fn.init(jax.random.PRNGKey(random_seed), start), start


# Fields a checkpoint written before they existed lacks: it was written with their defaults.
_DEFAULTS = {'scan_layers': False, 'remat_policy': 'none'}


def _check_same_config(config: T5Config, stored: Mapping[str, Any], directory: str) -> None:
  mine = json.loads(config.to_json())
  # Remat changes what the backward pass keeps, never the state: a run may resume with another.
  diff = sorted(k for k in (set(mine) | set(stored)) - {'remat_policy'}
                if mine.get(k, _DEFAULTS.get(k)) != stored.get(k, _DEFAULTS.get(k)))
  if diff:
    raise UserError(f'{directory}: the checkpoints were written with a different model config '
                    f'(fields {", ".join(diff)}); use a new MODEL_DIR or the same model gin')


def _read_best(model_dir: str) -> Optional[dict]:
  try:
    return rundir.optional_record(os.path.join(model_dir, BEST_FILE),
                                  {'step': int, 'metric': str, 'value': float}, 'best record')
  except rundir.RecordError as e:
    raise rundir.RecordError(f'{e}; remove it to resume (the next evaluation writes it anew, and '
                             f'{BEST_DIR}/ with it)') from None


def _copy_vocab(task: str, model_dir: str) -> None:
  """Copies the task's vocabulary into the run directory (`rundir.VOCAB_FILE`), where the
  checkpoints written from the run (best/, drafts, uptraining's converted/) take it from."""
  source = None if task == 'synthetic' else vocab_file(task)
  path = os.path.join(model_dir, rundir.VOCAB_FILE)
  if source is None or os.path.abspath(source) == os.path.abspath(path):
    return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  atomic.copy_file(source, path)  # whole or not at all: a kill mid-copy leaves the old one


def _evaluate(evaluator: Evaluator, state: TrainState, step: int, config: T5Config, model_dir: str,
              writer: summaries.MetricWriter, best: Optional[dict], best_metric: Optional[str],
              best_mode: str, is_writer: bool) -> Optional[dict]:
  """Runs the evaluator, logs its metrics, and exports the parameters when they are the best."""
  scores = {k: float(v) for k, v in evaluator(state.params, step).items()}
  writer.write_scalars(step, scores, split='eval')
  if best_metric is None:
    return best
  if best_metric not in scores:
    raise UserError(f'best_metric {best_metric!r} is not among the evaluation metrics '
                    f'{sorted(scores)}')
  value = scores[best_metric]
  better = best is None or (value > best['value'] if best_mode == 'max' else value < best['value'])
  if not better:
    return best
  best = {'step': step, 'metric': best_metric, 'value': value, 'metrics': scores}
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  # every process joins the gather of parameters spread over processes; process 0 writes
  native.save_checkpoint(os.path.join(model_dir, BEST_DIR), config, state.params,
                         vocab_path=native.vocab_path(model_dir), overwrite=True)
  if is_writer:
    atomic.write_json(os.path.join(model_dir, BEST_FILE), best, indent=2)
  log.info('step %d: new best %s = %.4f', step, best_metric, value)
  return best


class _StopVotes:
  """Several processes: one stop decision for all, taken at the same step everywhere.

  SIGTERM (pre-emption) reaches the processes of a job at different moments; a process that
  stopped and saved at its own step would leave the others waiting in that step's collectives.
  `cast` dispatches, beside each step, an all-reduce (max) of every process's request; the loop
  reads its result when it retires the step (`MAX_IN_FLIGHT` steps later, where it reads the step's
  metrics anyway, so no extra wait), at the same point of the loop on every process.
  """

  def __init__(self):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
    # each process's devices in one block (the local votes fill it), whatever order jax.devices() has
    mesh = Mesh(np.asarray(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))),
                ('processes',))
    self._sharding = NamedSharding(mesh, PartitionSpec('processes'))
    self._any = jax.jit(lambda votes: votes.max(),  # [devices] -> []
                        out_shardings=NamedSharding(mesh, PartitionSpec()))
    self._local = jax.local_device_count()

  def cast(self, requested: bool) -> jax.Array:
    """This process's vote; the result (1: some process asked to stop), not yet computed."""
    return self._any(jax.make_array_from_process_local_data(
        self._sharding, np.full((self._local,), int(requested), np.int32)))


# A caller that runs training in threads (`gqa-spec reproduce` with `workers` > 1) sets a
# stop predicate for them (`stop_when`): signals reach only the main thread, so a trainer in
# another thread polls the predicate beside its own flag and stops and saves the same way.
_STOP_WHEN: contextvars.ContextVar[Optional[Callable[[], bool]]] = contextvars.ContextVar(
    'stop_when', default=None)


@contextlib.contextmanager
def stop_when(predicate: Callable[[], bool]):
  """Inside the block (this thread or context), `train` also stops after its queued steps and saves
  once `predicate()` is true, as on SIGTERM."""
  token = _STOP_WHEN.set(predicate)
  try:
    yield
  finally:
    _STOP_WHEN.reset(token)


def stop_requested_by_caller() -> bool:
  """Whether the `stop_when` predicate of this thread or context asks to stop (False outside one):
  for long work besides `train` in a job that runs in a thread."""
  predicate = _STOP_WHEN.get()
  return bool(predicate is not None and predicate())


class _StopFlag:
  """Turns SIGTERM (pre-emption) and Ctrl-C, or the `stop_when` predicate, into a request to stop
  after the queued steps.

  Args:
    queued: how many steps are still queued (for the log line).
  """

  def __init__(self, queued=lambda: 0):
    self.requested_at = None
    self.signum = None  # the signal that asked (None: none, or the `stop_when` predicate)
    self._signalled = False
    self._queued = queued
    self._predicate = _STOP_WHEN.get()

  @property
  def requested(self) -> bool:
    if not self._signalled and self._predicate is not None and self._predicate():
      self._signalled = True
      self.requested_at = time.time()
    return self._signalled

  def _handle(self, signum, frame):
    del frame
    if self._signalled and signum == signal.SIGINT:
      raise KeyboardInterrupt  # a second Ctrl-C: the user does not want to wait for the save
    if not self._signalled:
      log.warning('received signal %d; stopping after the %d queued step(s) and saving', signum,
                  self._queued())
      self.signum = signum
    self._signalled = True
    self.requested_at = self.requested_at or time.time()

  @contextlib.contextmanager
  def installed(self):
    previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, self._handle)
    try:
      yield self
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)
