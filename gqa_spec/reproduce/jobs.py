"""The reproduction's shared job machinery: the context every stage gets, job records, training.

A stage runs its work as `(key, fn)` jobs through `run_jobs`: a finished job's record is kept in
`<work>/jobs/<stage>/<key>.json` and skipped on the next invocation, so a killed stage resumes
where it stopped (a killed training job resumes from its own last checkpoint). Paths in records are
relative to the work dir (`Context.relative` / `Context.path`), so a copied work dir resumes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gqa_spec import atomic, progress, rundir
from gqa_spec.errors import UserError
from gqa_spec.reproduce.presets import Preset


@dataclasses.dataclass
class Context:
  """Where a reproduction reads and writes."""

  preset: Preset
  out_dir: str  # results/<preset>
  work_dir: str  # models, data, caches
  progress: Any = None
  overrides: Tuple[str, ...] = ()  # `--set KEY=VALUE` applied to the preset
  exported_dir: Optional[str] = None  # `--exported DIR`: read `gqa-spec data export`'s tasks
  stop_requested: bool = False  # set when `--time-limit`'s stop time has come (`time_limit`)

  def task(self, name: str) -> str:
    """The name a data reader takes for a preset's task: `exported:DIR/name` with `--exported`,
    else the seqio task (records keep the seqio names either way)."""
    if self.exported_dir is None:
      return name
    return 'exported:' + os.path.join(os.path.abspath(self.exported_dir), name)

  @property
  def data_dir(self) -> str:
    return os.path.join(self.work_dir, 'data')

  def path(self, relative: str) -> str:
    """A path recorded relative to the work dir (stage JSON stays valid if the dir moves)."""
    return os.path.join(self.work_dir, relative)

  def relative(self, path: str) -> str:
    """`path` as recorded: relative to the work dir (`path` reads it back)."""
    return os.path.relpath(path, self.work_dir)

  def model_dir(self, *parts: str) -> str:
    return os.path.join(self.work_dir, 'models', *parts)

  def stage_path(self, stage: str) -> str:
    return os.path.join(self.out_dir, f'{stage}.json')

  def read_stage(self, stage: str) -> Dict[str, Any]:
    path = self.stage_path(stage)
    if not os.path.exists(path):
      raise UserError(f'stage {stage!r} has not run yet ({path} is missing); run it first')
    return rundir.read_record(path, {}, 'stage record')


class TimeLimitReached(Exception):
  """`--time-limit` stopped the run between jobs (training jobs saved a checkpoint first)."""


# Seconds before `--time-limit` at which the stop is requested (at most a quarter of the limit):
# what a training job needs to finish its queued steps and save, and a short evaluation to end
# (jobs are not cut mid-way).
STOP_MARGIN_S = 30.0


@contextlib.contextmanager
def time_limit(ctx: Context, seconds: Optional[float]):
  """Stops the run cleanly `min(STOP_MARGIN_S, seconds / 4)` before `seconds` from now (None: no
  limit).

  At the stop time a timer sets `ctx.stop_requested` and sends this process SIGTERM: a training
  job then stops after its queued steps and saves a checkpoint (the trainer's save on exit), any
  other job runs to its end; `run_jobs` then records nothing for the job in progress and raises
  `TimeLimitReached` instead of starting another. The next invocation re-runs that job, and a
  training job resumes from its checkpoint. A SIGTERM from outside stops the run the same way.
  """
  if seconds is None:
    yield
    return
  if seconds <= 0:
    raise UserError(f'--time-limit {seconds:g}: expected a positive number of seconds')
  import signal  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top

  def stop():
    ctx.stop_requested = True
    os.kill(os.getpid(), signal.SIGTERM)

  def external(signum, frame):  # SIGTERM from outside (e.g. `timeout`) between training jobs
    del signum, frame
    ctx.stop_requested = True

  previous = signal.signal(signal.SIGTERM, external)
  timer = threading.Timer(seconds - min(STOP_MARGIN_S, seconds / 4), stop)
  timer.daemon = True
  timer.start()
  try:
    yield
  finally:
    timer.cancel()
    signal.signal(signal.SIGTERM, previous)


def write_json(path: str, obj: Any) -> None:
  atomic.write_json(path, obj, indent=1, sort_keys=True)  # a stage is done once its JSON is whole


def jobs_dir(ctx: Context, stage: str) -> str:
  """Where a stage's finished jobs keep their records (one `<key>.json` each)."""
  return os.path.join(ctx.work_dir, 'jobs', stage)


def job_done(ctx: Context, stage: str, key: str) -> Optional[dict]:
  path = os.path.join(jobs_dir(ctx, stage), f'{key}.json')
  if os.path.exists(path):
    return rundir.read_record(path, {}, 'job record')
  return None


def finish_job(ctx: Context, stage: str, key: str, record: dict) -> dict:
  os.makedirs(jobs_dir(ctx, stage), exist_ok=True)
  write_json(os.path.join(jobs_dir(ctx, stage), f'{key}.json'), record)
  return record


def job_seconds(ctx: Context, stage: str) -> Optional[float]:
  """The sum of a stage's finished jobs' own wall times, whichever invocation ran them."""
  folder = jobs_dir(ctx, stage)
  if not os.path.isdir(folder):
    return None
  total = 0.0
  for name in sorted(os.listdir(folder)):
    if name.endswith('.json'):
      total += float(rundir.read_record(os.path.join(folder, name), {}, 'job record', optional={
          'wall_seconds': (float, type(None))}).get('wall_seconds') or 0.0)
  return round(total, 1)


MAPS_BEFORE_RELEASE = 32_768  # half of Linux's default vm.max_map_count (65,530)
_MAPS = {'last': None, 'largest_growth': 0}  # at the last `release_compiled`; the most one job added


def memory_maps() -> Optional[int]:
  """This process's memory mappings (Linux's /proc/self/maps), or None where there is none."""
  try:
    with open('/proc/self/maps') as f:
      return sum(1 for _ in f)
  except OSError:
    return None


def map_limit() -> int:
  """Linux's `vm.max_map_count` (65,530 unless raised)."""
  try:
    with open('/proc/sys/vm/max_map_count') as f:
      return int(f.read())
  except (OSError, ValueError):
    return 65_530


def release_compiled() -> None:
  """After a job: drops every compiled executable once the process holds many memory maps.

  XLA:CPU maps each executable's code into the process; a stage of many jobs each compiling
  its own loops (the cpu study's speculative stage: a while loop per draft, gamma and
  temperature, ~6,000 maps a minute) kept them all and crossed Linux's default
  `vm.max_map_count` (65,530) after ~20 minutes ("LLVM compilation error: Cannot allocate
  memory", then a segfault). The executables are dropped at `MAPS_BEFORE_RELEASE` maps, or
  earlier when twice the most any job has added since the first call would pass 90% of the
  limit. Below that they are kept, so the next job reuses what it shares (the smoke preset's
  second task reuses every loop of the first: its lengths are the same).
  """
  if _release_due():
    _release()


def _release_due() -> bool:
  """Whether `release_compiled` drops the executables now (it records the maps' growth)."""
  maps = memory_maps()
  if maps is None:
    return False
  if _MAPS['last'] is not None:
    _MAPS['largest_growth'] = max(_MAPS['largest_growth'], maps - _MAPS['last'])
  _MAPS['last'] = maps
  return not (maps < MAPS_BEFORE_RELEASE and
              maps + 2 * _MAPS['largest_growth'] < 0.9 * map_limit())


def _release() -> None:
  import gc  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  maps = _MAPS['last']
  jax.clear_caches()
  gc.collect()
  _MAPS['last'] = memory_maps()
  logging.getLogger(__name__).info('released compiled executables (%d memory maps)', maps)


def run_jobs(ctx: Context, stage: str, jobs: Sequence[tuple], workers: int = 1,
             start_order: Optional[Sequence[str]] = None) -> List[dict]:
  """Runs `(key, fn)` jobs of a stage, skipping finished ones; returns their records in order.

  `workers` > 1 runs that many jobs side by side in threads (training stages of small models,
  whose steps keep about one core busy: `Preset.workers`), started in the given order;
  for jobs that time anything only where the preset says so (`Preset.eval_workers`). Signals reach only the main thread: on a stop (the time
  limit, a signal, a failed job) the running jobs' trainers stop after their queued steps and save
  (`trainer.stop_when`), nothing more starts, and nothing is recorded for a job that did not finish.
  `start_order` (every key once) is the order to start them in, e.g. jobs that compile different
  steps first, so that their compiles overlap; default the given order.
  """
  if workers < 1:
    raise UserError(f'workers must be >= 1, got {workers}')
  todo = [(i, key, fn) for i, (key, fn) in enumerate(jobs, 1) if job_done(ctx, stage, key) is None]
  if start_order is not None:
    if sorted(start_order) != sorted(key for key, _ in jobs):
      raise ValueError(f'{stage}: start_order {list(start_order)} is not the jobs\' keys')
    rank = {key: n for n, key in enumerate(start_order)}
    todo.sort(key=lambda job: rank[job[1]])
  walls: List[float] = []

  def finished(i: int, key: str, record: dict) -> None:
    walls.append(record['wall_seconds'])
    finish_job(ctx, stage, key, record)
    remaining = sum(1 for k, _ in jobs if job_done(ctx, stage, k) is None)
    with progress.scope(f'job {i}/{len(jobs)} {key}'):
      progress.info('done in %s; stage ETA %s (%d job(s) left at this pace)',
                    progress.format_seconds(walls[-1]),
                    progress.format_seconds(remaining * sum(walls) / len(walls) / workers),
                    remaining)

  if workers == 1:
    for i, key, fn in todo:
      if ctx.stop_requested:
        raise TimeLimitReached(f'{stage}: stopped before job {key}')
      if ctx.progress is not None:
        ctx.progress.set_postfix_str(f'{stage}: {key}')
      record = _run_job(ctx, stage, i, len(jobs), key, fn)
      release_compiled()
      finished(i, key, record)
  else:
    _run_side_by_side(ctx, stage, jobs, todo, workers, finished)
  return [job_done(ctx, stage, key) for key, _ in jobs]


def _run_job(ctx: Context, stage: str, i: int, n: int, key: str, fn, stop=None) -> dict:
  """One job under its progress scope; its record with `wall_seconds`. Raises `TimeLimitReached`
  when a stop came first (the job then records nothing: the next invocation re-runs it)."""
  from gqa_spec.training import trainer  # pylint: disable=g-import-not-at-top
  stopped = (lambda: ctx.stop_requested or stop.is_set()) if stop else (lambda: ctx.stop_requested)
  with progress.scope(f'job {i}/{n} {key}'):
    t0 = time.time()
    with progress.coarse(), trainer.stop_when(stopped):  # a line per job; long ones every 30 s
      try:
        record = fn()
      except Exception:  # pylint: disable=broad-except
        if not stopped():
          raise
        record = None  # a job stopped part-way (e.g. no best checkpoint yet): re-run next time
    if stopped():  # it may have stopped early: re-run (resume) it next time
      raise TimeLimitReached(f'{stage}: stopped during job {key}')
    record['wall_seconds'] = round(time.time() - t0, 2)
    return record


def _run_side_by_side(ctx: Context, stage: str, jobs: Sequence[tuple], todo: list, workers: int,
                      finished) -> None:
  """`run_jobs` with `workers` threads (see there)."""
  import concurrent.futures as cf  # pylint: disable=g-import-not-at-top
  import contextvars  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  stop = threading.Event()
  running: Dict[Any, tuple] = {}  # future -> (index, key)
  failure: List[BaseException] = []

  def collect(done) -> None:
    for future in done:
      i, key = running.pop(future)
      try:
        finished(i, key, future.result())
      except TimeLimitReached as e:
        failure.append(e)
      except BaseException as e:  # pylint: disable=broad-except
        stop.set()  # the others stop and save; this error is raised once they have
        failure.insert(0, e)

  with cf.ThreadPoolExecutor(workers, thread_name_prefix=f'{stage}-job') as pool:
    try:
      for i, key, fn in todo:
        while len(running) >= workers:
          collect(cf.wait(running, return_when=cf.FIRST_COMPLETED).done)
        if ctx.stop_requested or stop.is_set():
          break
        if _release_due():  # between jobs only: no job may run while executables are dropped
          collect(cf.wait(running).done)
          _release()
        if ctx.progress is not None:
          ctx.progress.set_postfix_str(f'{stage}: {key}')
        future = pool.submit(contextvars.copy_context().run, _run_job, ctx, stage, i, len(jobs),
                             key, fn, stop)
        running[future] = (i, key)
      collect(cf.wait(running).done)
    except BaseException:  # a signal in the main thread: the jobs stop and save, then it goes on
      stop.set()
      cf.wait(running)
      raise
  release_compiled()
  if failure:
    raise failure[0]
  left = [key for key, _ in jobs if job_done(ctx, stage, key) is None]
  if left:  # only a stop leaves jobs unstarted
    raise TimeLimitReached(f'{stage}: stopped before job {left[0]}')


class TrainingStopped(Exception):
  """A job's training stopped before its last step (a stop request or a signal): not finished."""


def check_finished(result, total_steps: int, model_dir: str) -> None:
  """Raises `TrainingStopped` when `trainer.train`'s `result` stopped before `total_steps`, so that
  the job is not recorded as finished. A signal the trainer took (it saved first) is raised again
  here, as if the trainer had not been there: `gqa-spec` then exits 130 / 143, or `time_limit`'s
  handler turns it into a stop of the run."""
  if result.step >= total_steps:
    return
  if result.stop_signal is not None:
    import signal  # pylint: disable=g-import-not-at-top
    signal.raise_signal(result.stop_signal)
  raise TrainingStopped(f'{model_dir}: training stopped at step {result.step} of {total_steps} '
                        '(saved; the same command resumes it)')


def register_tasks(ctx: Context) -> None:
  """Registers the DDTP seqio tasks over the corpus stage's data (nothing to do with `--exported`:
  readers then take `ctx.task(name)`)."""
  if ctx.exported_dir is not None:
    return
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  tasks.register_ddtp_tasks(ctx.data_dir)


def train(model_dir: str, config, task: str, lengths, batch: int, total_steps: int, *,
           learning_rate_fn, initial_checkpoint_path=None,
           initial_step=None, evaluator=None, eval_period=None, best_metric=None,
           save_period: int = 100, seed: int = 0, work_dir: str = '.') -> dict:
  from gqa_spec.training import trainer  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.data import DatasetConfig  # pylint: disable=g-import-not-at-top
  dataset = DatasetConfig(task, {'inputs': lengths[0], 'targets': lengths[1]}, batch_size=batch,
                          seed=seed)
  result = trainer.train(
      model_dir=model_dir, model_config=config, train_dataset_cfg=dataset,
      total_steps=total_steps, learning_rate_fn=learning_rate_fn,
      initial_checkpoint_path=initial_checkpoint_path,
      initial_step=initial_step, evaluator=evaluator, eval_period=eval_period,
      best_metric=best_metric, log_period=max(1, min(50, total_steps // 4)),
      checkpoint_cfg=trainer.CheckpointConfig(save_period=save_period, keep=1,
                                              asynchronous=False),
      random_seed=seed, progress_bar=False)
  check_finished(result, total_steps, model_dir)
  return {'model_dir': os.path.relpath(model_dir, work_dir), 'step': result.step,
          'train_task': task, 'train_lengths': list(lengths),
          'train_metrics': {k: float(v) for k, v in result.train_metrics.items()},
          'best': result.best}


@contextlib.contextmanager
def compilation_cache(work_dir: str):
  """Persistent XLA cache under `work_dir` while the block runs: the many same-shaped train steps
  and decoders compile once.

  A cache directory the user configured (JAX_COMPILATION_CACHE_DIR) is left as it is. Otherwise the
  previous settings are restored and JAX's cache reset on exit, so a caller's process (a notebook,
  the test suite) does not go on writing executables into this run's work dir.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=g-import-not-at-top
  if jax.config.jax_compilation_cache_dir:
    yield
    return
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update('jax_compilation_cache_dir', os.path.join(work_dir, 'xla_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  cc.reset_cache()
  try:
    yield
  finally:
    jax.config.update('jax_compilation_cache_dir', None)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', before)
    cc.reset_cache()
