"""`jobs.run_jobs` with `workers` > 1 (the smoke preset's training stages): jobs side by side in
threads, records in order, and stops that leave nothing half-recorded; the pieces it relies on
(a trainer in a thread stopping when asked, shared batches and compiled steps read from threads)."""

import logging
import re
import threading
import time

import jax
import numpy as np
import pytest

from gqa_spec import progress
from gqa_spec.reproduce import jobs
from gqa_spec.training import data, optimizer, trainer

TIMEOUT = 60  # seconds a barrier waits: a job that never meets its partner fails, not hangs


def _ctx(tmp_path):
  return jobs.Context(preset=None, out_dir=str(tmp_path / 'out'), work_dir=str(tmp_path))


def _wait_for_stop():
  """A job's long work: polls its stop request like a trainer does."""
  deadline = time.time() + TIMEOUT
  while not trainer.stop_requested_by_caller():
    assert time.time() < deadline, 'the stop request never came'
    time.sleep(0.01)
  return {'stopped': True}


def test_jobs_run_side_by_side_in_start_order_and_record_in_job_order(tmp_path, caplog):
  caplog.set_level(logging.INFO, 'gqa_spec.progress')
  together = threading.Barrier(2, timeout=TIMEOUT)  # passes only when two jobs run at once
  started = []

  def job(key):
    started.append(key)
    if key in ('a', 'c'):
      together.wait()
    return {'key': key, 'thread': threading.current_thread().name}

  with progress.scope('stage 4/9 finetune'):
    records = jobs.run_jobs(_ctx(tmp_path), 'finetune',
                            [(k, lambda k=k: job(k)) for k in 'abc'], workers=2,
                            start_order=['c', 'a', 'b'])
  assert sorted(started[:2]) == ['a', 'c'] and started[2] == 'b'
  assert [r['key'] for r in records] == ['a', 'b', 'c']
  assert all(r['thread'].startswith('finetune-job') for r in records)
  lines = [r.getMessage() for r in caplog.records]
  for i, key in ((1, 'a'), (2, 'b'), (3, 'c')):  # each line names its own job
    assert any(re.match(rf'\[stage 4/9 finetune job {i}/3 {key}\] done in ', l) for l in lines)
  with pytest.raises(ValueError, match='not the jobs'):
    jobs.run_jobs(_ctx(tmp_path / 'x'), 's', [('a', dict)], workers=2, start_order=['b'])


def test_a_failed_job_stops_the_running_one_which_records_nothing(tmp_path):
  ctx = _ctx(tmp_path)
  started = threading.Event()

  def fail():
    assert started.wait(TIMEOUT)
    raise ValueError('bad job')

  def long_job():
    started.set()
    return _wait_for_stop()

  with pytest.raises(ValueError, match='bad job'):
    jobs.run_jobs(ctx, 's', [('long', long_job), ('bad', fail), ('never', dict)], workers=2)
  assert not any(jobs.job_done(ctx, 's', k) for k in ('long', 'bad', 'never'))


def test_a_stop_request_stops_running_jobs_and_the_same_call_resumes(tmp_path):
  ctx = _ctx(tmp_path)
  ran = []
  first = threading.Event()

  def quick():
    ran.append('quick')
    return {'k': 'quick'}

  def stopper():  # the time limit's timer, in effect
    ran.append('stopper')
    assert first.wait(TIMEOUT)
    ctx.stop_requested = True
    return {'k': 'stopper'}

  def long_job():
    ran.append('long')
    first.set()
    return _wait_for_stop()

  job_list = [('quick', quick), ('long', long_job), ('stopper', stopper), ('after', quick)]
  with pytest.raises(jobs.TimeLimitReached):
    jobs.run_jobs(ctx, 's', job_list, workers=2)
  assert 'after' not in ran and jobs.job_done(ctx, 's', 'quick')
  assert not jobs.job_done(ctx, 's', 'long') and not jobs.job_done(ctx, 's', 'stopper')
  ctx.stop_requested = False
  ran.clear()
  first.set()
  records = jobs.run_jobs(ctx, 's', [('quick', quick), ('long', lambda: {'k': 'long'}),
                                     ('stopper', lambda: {'k': 'stopper'}), ('after', quick)],
                          workers=2)
  assert ran == ['quick'] and [r['k'] for r in records] == ['quick', 'long', 'stopper', 'quick']


def test_a_trainer_in_a_thread_stops_saves_and_its_job_is_not_finished(tmp_path):
  from tests.training.test_trainer import TINY, DATA  # pylint: disable=g-import-not-at-top
  polls = []

  def asked():
    polls.append(1)
    return len(polls) > 6  # after a few steps

  def run():
    with trainer.stop_when(asked):
      return trainer.train(model_dir=str(tmp_path), model_config=TINY, train_dataset_cfg=DATA,
                           total_steps=1000, optimizer=optimizer.adafactor(min_dim_size_to_factor=16),
                           learning_rate_fn=optimizer.constant(0.01), progress_bar=False,
                           checkpoint_cfg=trainer.CheckpointConfig(save_period=1000, keep=1,
                                                                   asynchronous=False))

  out = []
  thread = threading.Thread(target=lambda: out.append(run()))
  thread.start()
  thread.join(TIMEOUT * 3)
  [result] = out
  assert 0 < result.step < 1000 and result.stop_signal is None
  assert sorted((tmp_path / 'checkpoints').iterdir())[-1].name == str(result.step)  # saved
  with pytest.raises(jobs.TrainingStopped, match=f'stopped at step {result.step} of 1000'):
    jobs.check_finished(result, 1000, str(tmp_path))
  jobs.check_finished(result, result.step, str(tmp_path))  # ran to its end: nothing to say


def test_a_signal_the_trainer_took_is_raised_again_for_the_run(monkeypatch):
  import signal  # pylint: disable=g-import-not-at-top
  got = []

  def handler(signum, frame):
    del frame
    got.append(signum)

  previous = signal.signal(signal.SIGUSR1, handler)
  try:
    result = trainer.TrainResult(step=3, train_metrics={}, best=None, stop_signal=signal.SIGUSR1)
    with pytest.raises(jobs.TrainingStopped):
      jobs.check_finished(result, 10, 'run')
  finally:
    signal.signal(signal.SIGUSR1, previous)
  assert got == [signal.SIGUSR1]


def test_shared_batches_read_from_threads_are_the_pipelines_batches(monkeypatch):
  opened = []

  def slow_pipeline(cfg, skip_batches, num_epochs):
    del cfg, num_epochs
    opened.append(skip_batches)
    for i in range(skip_batches, 10**6):
      time.sleep(0.001)  # readers interleave
      yield {'x': np.full((2,), i, np.int32)}

  monkeypatch.setattr(data, '_read_batches', slow_pipeline)
  cfg = data.DatasetConfig('ddtp_translate_en_de', {'inputs': 8, 'targets': 8}, batch_size=2)
  out = {}

  def read(name):
    it = data.get_batches(cfg)
    out[name] = [int(next(it)['x'][0]) for _ in range(200)]

  with data.shared_batches():
    threads = [threading.Thread(target=read, args=(n,)) for n in range(3)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(TIMEOUT)
  assert opened == [0]  # one pipeline for all three readers
  assert out == {n: list(range(200)) for n in range(3)}
