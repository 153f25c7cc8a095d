"""`gqa-spec calibrate --preset {smoke,cpu}`: short learning-curve sweeps that size a preset.

Each sweep trains one role (target or draft) with the trainer the study uses (T5 Adafactor; rsqrt
schedule for pre-training, constant lr with dropout 0.1 for fine-tuning) at a few settings, and
evaluates every `eval_period` steps: validation loss (teacher forced, a fixed slice of validation
batches) and, for fine-tuning, greedy BLEU / ROUGE-1 on a small validation slice. Every evaluation
is recorded against the step, the wall seconds spent training (evaluation excluded; compilation
and input pipeline included) and the process CPU seconds (less sensitive to other load on the
machine than wall seconds), with the 1-minute load average.

Pre-training points are `(peak lr, warm-up)`: the schedule is `base / sqrt(max(step, warmup))` with
`base = peak * sqrt(warmup)`, constant at the peak for `warmup` steps (T5's "warm-up"). Fine-tuning
sweeps start from the pre-training sweep's point with the lowest final validation loss (same role).
`multitask` fine-tunes on `ddtp_translate_summarize` (1:1) and is evaluated on both tasks.

Resumable: each finished point is a JSON file under `<work-dir>/calibration/`; a re-run skips
those and restarts an interrupted point from scratch (its curve must be one uninterrupted run).
Writes `<out>/calibration.json`, `calibration.png` and `calibration.md` after every point, marked
`partial` until every point has run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import time
from typing import Dict, List, Optional, Sequence, Tuple

from gqa_spec import atomic, progress
from gqa_spec.errors import UserError
from gqa_spec.reproduce import calibration_report
from gqa_spec.reproduce import presets as presets_lib
from gqa_spec.reproduce.presets import (MULTITASK, PRETRAIN, PRETRAIN_MIXTURE, SUMMARIZE, TASK_METRIC,
                                        TRANSLATE, Preset)



@dataclasses.dataclass(frozen=True)
class Point:
  """One setting: `lr` is the peak (pre-training) or the constant lr (fine-tuning)."""

  lr: float
  batch: int
  steps: int
  warmup: int = 0  # pre-training only

  @property
  def label(self) -> str:
    return (f'lr{self.lr:g}_w{self.warmup}_b{self.batch}' if self.warmup else
            f'lr{self.lr:g}_b{self.batch}')


@dataclasses.dataclass(frozen=True)
class Sweep:
  """Points of one stage x role x task, evaluated every `eval_period` steps."""

  stage: str  # 'pretrain' | 'finetune'
  role: str  # 'target' | 'draft'
  task: str  # PRETRAIN, PRETRAIN_MIXTURE, TRANSLATE, SUMMARIZE or MULTITASK
  points: Tuple[Point, ...]
  eval_period: int
  tag: str = ''  # tells apart two sweeps of the same stage, role and task
  # a model preset (`gqa_spec.models.config.PRESETS`) instead of the preset's model of `role`
  model: str = ''
  # fine-tuning: the pre-training sweep to start from (its point of lowest final val loss);
  # None: every span-corruption pre-training sweep of the role
  init_sweep: Optional[str] = None

  @property
  def supervised_tasks(self) -> Tuple[str, ...]:
    """The tasks with a metric (BLEU / ROUGE-1) this sweep evaluates."""
    if self.task in (MULTITASK, PRETRAIN_MIXTURE):
      return (TRANSLATE, SUMMARIZE)
    return () if self.task == PRETRAIN else (self.task,)

  @property
  def name(self) -> str:
    task = {PRETRAIN: '', PRETRAIN_MIXTURE: '.mixture', TRANSLATE: '.translate',
            SUMMARIZE: '.summarize', MULTITASK: '.multitask'}[self.task]
    return f'{self.stage}.{self.role}{task}' + (f'.{self.tag}' if self.tag else '')


@dataclasses.dataclass(frozen=True)
class Plan:
  """Sweeps (run in this order) and evaluation sizes."""

  sweeps: Tuple[Sweep, ...]
  val_batches: int  # validation-loss batches (of the point's batch size)
  metric_examples: int  # BLEU / ROUGE validation examples


# micro's train step took 0.47x mini's at 16 x 128/32 (1.10-1.14 s vs 2.33-2.42 s, alternating,
# `python -m benchmarks.train_step --preset {micro,mini} --settings pretrain --steps 4`, load ~2.7):
# 1000 mini steps buy ~2100 micro steps.
MICRO_STEPS = 2000
# The cpu plan's target sweeps before the size sweep trained `mini` (the preset's target then):
# they name it, so the command reproduces its record whatever the preset's target is now.
TARGET_SWEEP_MODEL = 'mini'


def plan(preset: Preset) -> Plan:
  """The sweeps of a preset, most important first (a partial run has the target's curves)."""
  b, fb = preset.pretrain_batch, preset.finetune_batch
  if preset.name == 'smoke':  # seconds: a structural check, numbers meaningless
    pre = lambda lr: Point(lr, b, 16, warmup=8)
    return Plan((
        Sweep('pretrain', 'target', PRETRAIN, (pre(0.05), pre(0.2)), 8),
        Sweep('finetune', 'target', TRANSLATE, (Point(0.01, fb, 8),), 4),
        Sweep('pretrain', 'target', PRETRAIN_MIXTURE, (pre(0.05),), 8),
        Sweep('finetune', 'target', MULTITASK, (Point(0.01, fb, 8),), 4, tag='from_mixture',
              init_sweep='pretrain.target.mixture'),
        # a named model preset in place of the target (at the preset's vocabulary), as cpu's
        # target-size sweep
        Sweep('pretrain', 'target', PRETRAIN, (pre(0.05),), 8, tag='nano', model='nano'),
    ), val_batches=2, metric_examples=4)
  if preset.name != 'cpu':
    raise UserError(f'no calibration plan for preset {preset.name!r}; known: smoke, cpu')
  # Sized for a machine shared with other jobs (load ~10 on 2 cores, ~5 s per target step): the
  # target's and the draft's peak lr first, then the target's fine-tuning lr, then the rest.
  mini = {'model': TARGET_SWEEP_MODEL}
  tpre = lambda lr, w=500: Point(lr, b, 100, warmup=w)
  dpre = lambda lr: Point(lr, b, 200, warmup=500)
  tft = lambda lr, batch=fb, steps=40: Point(lr, batch, steps)
  return Plan((
      # log-spaced x3 around the last study's 0.045 (its mini target stalled at train loss 5.3
      # while the nano draft reached 4.5 at the same rate: the direction is not known a priori)
      Sweep('pretrain', 'target', PRETRAIN, (tpre(0.045), tpre(0.015), tpre(0.13)), 25, **mini),
      # added once 0.015 beat 0.045: is the optimum lower still?
      Sweep('pretrain', 'target', PRETRAIN, (tpre(0.005),), 25, tag='low', **mini),
      Sweep('pretrain', 'draft', PRETRAIN, (dpre(0.045), dpre(0.13), dpre(0.4), dpre(0.015)),
            50),
      Sweep('finetune', 'target', TRANSLATE, (tft(0.01), tft(0.03), tft(0.003)), 20, **mini),
      Sweep('finetune', 'draft', TRANSLATE, (tft(0.01, steps=60), tft(0.03, steps=60),
                                             tft(0.1, steps=60)), 20),
      Sweep('finetune', 'target', SUMMARIZE, (tft(0.01), tft(0.03)), 20, **mini),
      Sweep('finetune', 'target', MULTITASK, (tft(0.01, steps=80),), 40, **mini),
      Sweep('finetune', 'target', TRANSLATE, (tft(0.01, 32),), 20, tag='batch', **mini),
      Sweep('pretrain', 'target', PRETRAIN, (tpre(0.13, 50),), 25, tag='warmup', **mini),  # decays
      # T5's multi-task pre-training (span corruption + both tasks at example-proportional
      # rates): does a long target run reach the quality bar, and where does the curve flatten?
      # Then how much a short multi-task fine-tuning adds from it.
      Sweep('pretrain', 'target', PRETRAIN_MIXTURE, (Point(0.015, b, 1000, warmup=500),), 250,
            **mini),
      Sweep('finetune', 'target', MULTITASK, (tft(0.01, steps=200),), 50, tag='from_mixture',
            init_sweep='pretrain.target.mixture', **mini),
      # Target size at equal training time: mini saw ~6M tokens in the mixture sweep above, far
      # fewer than a model of its size needs, so a narrower target may reach a lower loss in the
      # same seconds. `micro` (mini at half width, ~1/4 of its non-embedding FLOPs), at the same
      # rate and warm-up, for the steps its measured step time buys in mini's 1000-step seconds.
      Sweep('pretrain', 'target', PRETRAIN_MIXTURE, (Point(0.015, b, MICRO_STEPS, warmup=500),),
            MICRO_STEPS // 4, tag='micro', model='micro'),
  ), val_batches=4, metric_examples=32)


def _config(preset: Preset, sweep: Sweep):
  """The model config a sweep trains: `sweep.model` at the preset's vocabulary, else the preset's
  model of the role."""
  config = preset.target if sweep.role == 'target' else preset.draft
  if sweep.model:
    from gqa_spec.models.config import preset as model_preset  # pylint: disable=g-import-not-at-top
    config = model_preset(sweep.model, vocab_size=config.vocab_size)
  return config


def model_name(preset: Preset, sweep: Sweep) -> str:
  """The model preset a sweep trains: `sweep.model`, else the one the preset's model of the role
  matches (width, heads, layers), else '<preset> <role>'."""
  if sweep.model:
    return sweep.model
  from gqa_spec.models.config import PRESETS  # pylint: disable=g-import-not-at-top
  config = _config(preset, sweep)
  shape = lambda c: (c.emb_dim, c.num_heads, c.head_dim, c.mlp_dim, c.num_encoder_layers,
                     c.num_decoder_layers)
  return next((n for n, c in PRESETS.items() if shape(c) == shape(config)),
              f'{preset.name} {sweep.role}')


def _lengths(preset: Preset, task: str) -> Tuple[int, int]:
  if task == PRETRAIN:
    return preset.pretrain_lengths
  if task in (MULTITASK, PRETRAIN_MIXTURE):
    ls = list(preset.finetune_lengths.values()) + (
        [preset.pretrain_lengths] if task == PRETRAIN_MIXTURE else [])
    return max(l[0] for l in ls), max(l[1] for l in ls)
  return preset.finetune_lengths[task]


class Curve:
  """The trainer's evaluator: one row per evaluation (see the module docstring).

  `start()` just before training; evaluation time is subtracted from the training clocks.
  """

  def __init__(self, config, preset: Preset, sweep: Sweep, point: Point, plan_: Plan):
    import jax  # pylint: disable=g-import-not-at-top
    from gqa_spec.training.data import DatasetConfig, get_batches  # pylint: disable=g-import-not-at-top
    from gqa_spec.evaluation.evaluator import InferenceEvaluator  # pylint: disable=g-import-not-at-top
    from gqa_spec.training.train_step import loss_and_metrics  # pylint: disable=g-import-not-at-top
    tasks = (PRETRAIN,) if sweep.task == PRETRAIN_MIXTURE else ()
    tasks += sweep.supervised_tasks or (sweep.task,)
    self.val = {}  # task -> list of validation batches
    for task in tasks:
      inputs, targets = _lengths(preset, task)
      cfg = DatasetConfig(task, {'inputs': inputs, 'targets': targets}, split='validation',
                          batch_size=point.batch, shuffle=False)
      self.val[task] = list(itertools.islice(get_batches(cfg, num_epochs=1), plan_.val_batches))
      if not self.val[task]:
        raise UserError(f'{task}: the validation split has fewer than {point.batch} examples')
    self.inference = {}
    for task in sweep.supervised_tasks:
      inputs, targets = _lengths(preset, task)
      self.inference[task] = InferenceEvaluator(
          task, config, 'validation', {'inputs': inputs, 'targets': targets},
          batch_size=plan_.metric_examples, num_examples=plan_.metric_examples)
    self._loss = jax.jit(lambda params, batch: loss_and_metrics(params, batch, config, None, 0.0,
                                                                 None)[1])
    self.rows: List[dict] = []
    self._t0 = self._cpu0 = 0.0
    self._eval_wall = self._eval_cpu = 0.0

  def start(self) -> None:
    self._t0, self._cpu0 = time.time(), time.process_time()

  def __call__(self, params, step: int) -> Dict[str, float]:
    t, cpu = time.time(), time.process_time()
    row = {'step': int(step), 'wall_seconds': round(t - self._t0 - self._eval_wall, 2),
           'cpu_seconds': round(cpu - self._cpu0 - self._eval_cpu, 2),
           'load1': round(os.getloadavg()[0], 2)}
    losses = {}
    for task, batches in self.val.items():
      sums = [self._loss(params, batch) for batch in batches]
      losses[task] = (sum(float(s['loss_sum']) for s in sums)
                      / max(sum(float(s['weight_sum']) for s in sums), 1.0))
    row['val_loss'] = sum(losses.values()) / len(losses)
    if len(losses) > 1:
      row.update({f'val_loss/{k}': v for k, v in losses.items()})
    for task, evaluator in self.inference.items():
      row[TASK_METRIC[task] if len(self.inference) == 1 else f'{TASK_METRIC[task]}/{task}'] = float(
          evaluator(params, step)[TASK_METRIC[task]])
    self.rows.append(row)
    self._eval_wall += time.time() - t
    self._eval_cpu += time.process_time() - cpu
    return {'val_loss': row['val_loss']}


def _point_path(work_dir: str, sweep: Sweep, point: Point) -> str:
  return os.path.join(work_dir, 'calibration', sweep.name, f'{point.label}.json')


def _read(path: str, point: Optional[Point] = None) -> Optional[dict]:
  """The JSON at `path`, or None when missing (or recorded for another setting than `point`)."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    record = json.load(f)
  if point is not None and any(record[k] != v for k, v in dataclasses.asdict(point).items()):
    return None
  return record


def _write(path: str, obj) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  atomic.write_json(path, obj, indent=1, sort_keys=True)


def _best_pretrained(work_dir: str, plan_: Plan, sweep: Sweep) -> str:
  """The model dir of the finished pre-training point `sweep` starts from (lowest final val loss
  among `sweep.init_sweep`'s points, or among the role's span-corruption pre-training points)."""
  role = sweep.role
  done = [r for s in plan_.sweeps if s.stage == 'pretrain' and s.role == role
          and (s.name == sweep.init_sweep if sweep.init_sweep else s.task == PRETRAIN)
          for p in s.points for r in [_read(_point_path(work_dir, s, p), p)] if r]
  if not done:
    raise UserError(f'{sweep.name} needs a finished pre-training point of '
                    f'{sweep.init_sweep or "the " + role}')
  return os.path.join(work_dir, min(done, key=lambda r: r['final_val_loss'])['model_dir'])


def run_point(preset: Preset, work_dir: str, plan_: Plan, sweep: Sweep, point: Point) -> dict:
  """Trains one point from scratch (or from the best pre-trained point) and records its curve."""
  from gqa_spec.training import trainer  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.data import DatasetConfig  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.optimizer import constant, rsqrt_decay  # pylint: disable=g-import-not-at-top
  config = _config(preset, sweep)
  model_dir = os.path.join(work_dir, 'calibration', sweep.name, point.label)
  shutil.rmtree(model_dir, ignore_errors=True)  # an interrupted point restarts: one clean curve
  if sweep.stage == 'pretrain':
    sized = dataclasses.replace(preset, pretrain_peak_lr=point.lr, warmup_steps=point.warmup)
    lr_fn = rsqrt_decay(*sized.pretrain_schedule())  # the study's schedule at this peak
    init = None
  else:
    config = config.replace(dropout_rate=0.1)
    lr_fn = constant(point.lr)
    init = _best_pretrained(work_dir, plan_, sweep)
  inputs, targets = _lengths(preset, sweep.task)
  curve = Curve(config, preset, sweep, point, plan_)
  curve.start()
  result = trainer.train(
      model_dir=model_dir, model_config=config,
      train_dataset_cfg=DatasetConfig(sweep.task, {'inputs': inputs, 'targets': targets},
                                      batch_size=point.batch, seed=0),
      total_steps=point.steps, learning_rate_fn=lr_fn, initial_checkpoint_path=init,
      initial_step=0 if init else None, evaluator=curve, eval_period=sweep.eval_period,
      log_period=sweep.eval_period,
      checkpoint_cfg=trainer.CheckpointConfig(save_period=point.steps, keep=1, asynchronous=False),
      random_seed=0, progress_bar=False)
  if result.step < point.steps:  # stopped by a signal: not a finished point
    raise UserError(f'{sweep.name} {point.label} stopped at step {result.step} of {point.steps}; '
                    'run the command again to restart this point (finished ones are kept)')
  rows = curve.rows
  steady = rows[-1]['step'] - rows[0]['step']
  return {
      'sweep': sweep.name, 'label': point.label, **dataclasses.asdict(point),
      'model': model_name(preset, sweep),
      'lengths': [inputs, targets], 'model_dir': os.path.relpath(model_dir, work_dir),
      'initial_checkpoint': os.path.relpath(init, work_dir) if init else None,
      'curve': rows, 'final_val_loss': rows[-1]['val_loss'],
      'final_train_loss': float(result.train_metrics.get('loss', float('nan'))),
      # per step after the first evaluation (compilation and pipeline start-up excluded)
      'seconds_per_step': ((rows[-1]['wall_seconds'] - rows[0]['wall_seconds']) / steady
                           if steady else None),
      'cpu_seconds_per_step': ((rows[-1]['cpu_seconds'] - rows[0]['cpu_seconds']) / steady
                               if steady else None),
  }


def calibrate(preset_name: str, out_dir: Optional[str] = None, work_dir: Optional[str] = None,
              sweeps: Sequence[str] = (), command: Optional[str] = None,
              train: bool = True, force: bool = False) -> dict:
  """Runs (or resumes) the preset's sweeps; returns the calibration record (also written).

  `train=False` only writes the files from the points finished so far, to `out_dir` or, when
  none is given, to the work dir (never to `results/<preset>/` by default). Either way a
  `calibration.json` already in `out_dir` that holds more finished points than the work dir
  is not replaced (UserError) unless `force`: a work dir that lacks the study's points (a fresh
  clone's) must not overwrite the committed record.
  """
  from gqa_spec.reproduce import jobs as jobs_lib, pretraining  # pylint: disable=g-import-not-at-top
  preset = presets_lib.get(preset_name)
  plan_ = plan(preset)
  names = [s.name for s in plan_.sweeps]
  unknown = [s for s in sweeps if s not in names]
  if unknown:
    raise UserError(f'unknown sweep(s) {unknown}; sweeps of {preset_name!r}: {", ".join(names)}')
  work_dir = work_dir or os.path.join('runs', preset_name)
  out_dir = out_dir or (os.path.join('results', preset_name) if train else work_dir)
  command = command or f'gqa-spec calibrate --preset {preset_name}'
  if not force:
    _refuse_fewer_points(out_dir, _collect(preset, plan_, work_dir, command))
  os.makedirs(out_dir, exist_ok=True)
  todo = [(s, p) for s in plan_.sweeps if not sweeps or s.name in sweeps for p in s.points
          if train]
  with jobs_lib.compilation_cache(work_dir) if todo else contextlib.nullcontext():
    if todo:
      ctx = jobs_lib.Context(preset, out_dir, work_dir)
      if not os.path.exists(os.path.join(ctx.data_dir, 'stats.json')):
        progress.info('preparing the corpus in %s', ctx.data_dir)
        pretraining.stage_corpus(ctx)
      from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
      tasks.register_ddtp_tasks(ctx.data_dir)
    for i, (sweep, point) in enumerate(todo, 1):
      path = _point_path(work_dir, sweep, point)
      if _read(path, point) is None:
        with progress.scope(f'calibrate {preset_name}', f'point {i}/{len(todo)}',
                            f'{sweep.name} {point.label}'):
          progress.info('started')
          record = run_point(preset, work_dir, plan_, sweep, point)
          progress.info('done: val loss %.3f', record['final_val_loss'])
        _write(path, record)
      record = _collect(preset, plan_, work_dir, command)
      calibration_report.write(out_dir, record)
  if not todo:
    calibration_report.write(out_dir, _collect(preset, plan_, work_dir, command))
  return _collect(preset, plan_, work_dir, command)


def finished_points(record: dict) -> int:
  """How many points a calibration record holds results for."""
  return sum(len(s.get('points', ())) for s in record.get('sweeps', ()))


def _refuse_fewer_points(out_dir: str, record: dict) -> None:
  """UserError when `out_dir/calibration.json` holds more finished points than `record`."""
  path = os.path.join(out_dir, 'calibration.json')
  try:
    with open(path, encoding='utf-8') as f:
      existing = finished_points(json.load(f))
  except (OSError, ValueError, AttributeError, TypeError):
    return  # none there (or not a record): nothing to lose
  new = finished_points(record)
  if existing > new:
    raise UserError(
        f'{path} holds {existing} finished point(s), the work dir {record["work_dir"]} only {new}; '
        'not replacing it with fewer (--work-dir names the run that has them, --out writes '
        'elsewhere, --force replaces it)')


def _collect(preset: Preset, plan_: Plan, work_dir: str, command: str) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  out, pending = [], 0
  for s in plan_.sweeps:
    points = [_read(_point_path(work_dir, s, p), p) for p in s.points]
    # (points recorded before `model` was: the plan names what they trained)
    points = [r and {'model': model_name(preset, s), **r} for r in points]
    pending += sum(p is None for p in points)
    out.append({'name': s.name, 'stage': s.stage, 'role': s.role, 'task': s.task,
                'eval_period': s.eval_period, 'points': [p for p in points if p],
                'pending': [p.label for p, r in zip(s.points, points) if r is None]})
  return {'command': command, 'preset': preset.name, 'status': 'partial' if pending else 'complete',
          'pending_points': pending, 'machine': f'{os.cpu_count()} CPU cores, JAX '
          f'{jax.__version__} on {jax.devices()[0].platform}',
          'val_batches': plan_.val_batches, 'metric_examples': plan_.metric_examples,
          'work_dir': os.path.abspath(work_dir), 'sweeps': out}
