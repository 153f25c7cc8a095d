"""Progress lines when no terminal shows a bar: cadence, content, scopes; reproduce's job lines."""

import json
import logging
import re

import pytest

from gqa_spec import progress
from gqa_spec.reproduce import jobs as jobs_lib


def _lines(caplog):
  return [r.getMessage() for r in caplog.records if r.name == 'gqa_spec.progress']


def test_lines_every_n_steps_with_loss_throughput_and_eta(caplog, monkeypatch):
  now = [0.0]
  monkeypatch.setattr(progress.time, 'time', lambda: now[0])
  caplog.set_level(logging.INFO, 'gqa_spec.progress')
  with progress.scope('pretrain', 'job 1/2 target'):
    bar = progress.Progress('train', total=100, initial=50, bar=False, every_seconds=1e9)
    for step in range(51, 101):
      now[0] += 20.0 if step == 51 else 2.0  # the first step compiles
      bar.update(step, loss=2.5, tokens=10.0)
    bar.close()
  lines = _lines(caplog)
  # The first update, then every ceil(50 / 10) = 5 steps, and the last.
  assert ([int(re.search(r'step (\d+)/', l).group(1)) for l in lines]
          == [51] + list(range(56, 100, 5)) + [100])
  assert lines[0] == '[pretrain job 1/2 target] train step 51/100 (51%) loss 2.5 elapsed 20s ETA ?'
  # 5 steps of 10 tokens in 10 s; 2 s per step (the compile left out) leaves 44 steps = 88 s.
  assert lines[1] == ('[pretrain job 1/2 target] train step 56/100 (56%) loss 2.5 tokens/s 5 '
                      'elapsed 30s ETA 1m28s')
  assert lines[-1].endswith('step 100/100 (100%) loss 2.5 tokens/s 5 elapsed 1m58s ETA 0s')
  assert progress.prefix() == ''  # the scope ended


def test_lines_every_t_seconds_and_unknown_total(caplog, monkeypatch):
  now = [0.0]
  monkeypatch.setattr(progress.time, 'time', lambda: now[0])
  caplog.set_level(logging.INFO, 'gqa_spec.progress')
  bar = progress.Progress('eval', total=None, unit='batch', bar=False, every_steps=1000,
                          every_seconds=30)
  for batch, t in zip(range(1, 7), [0.0, 1.0, 2.0, 31.0, 32.0, 62.0]):
    now[0] = t
    bar.update(batch)
  assert _lines(caplog) == ['eval batch 1 elapsed 0s', 'eval batch 4 elapsed 31s',
                            'eval batch 6 elapsed 1m02s']


def test_disabled_progress_is_silent(caplog):
  caplog.set_level(logging.INFO, 'gqa_spec.progress')
  bar = progress.Progress('train', total=10, bar=False, enabled=False)
  bar.update(10, loss=1.0)
  assert not _lines(caplog)


def test_reproduce_jobs_log_their_stage_job_and_eta(caplog, tmp_path):
  caplog.set_level(logging.INFO, 'gqa_spec.progress')
  ctx = jobs_lib.Context(preset=None, out_dir=str(tmp_path / 'out'), work_dir=str(tmp_path))
  jobs_lib.finish_job(ctx, 'timing', 'b', {'done': True})  # finished earlier: skipped
  with progress.scope('reproduce smoke', 'stage 6/8 timing'):
    records = jobs_lib.run_jobs(ctx, 'timing', [('a', lambda: {'x': 1}), ('b', lambda: {}),
                                                 ('c', lambda: {'x': 3})])
  assert [r.get('x') for r in records] == [1, None, 3]
  lines = _lines(caplog)
  assert len(lines) == 2  # one line per job run
  assert re.fullmatch(r'\[reproduce smoke stage 6/8 timing job 1/3 a\] done in \d+s; stage ETA '
                      r'\d+s \(1 job\(s\) left at this pace\)', lines[0]), lines[0]
  assert lines[1].startswith('[reproduce smoke stage 6/8 timing job 3/3 c] done in ')
  assert 'stage ETA 0s (0 job(s) left' in lines[1]


def test_stage_job_seconds_sum_the_jobs_of_every_invocation(tmp_path):
  ctx = jobs_lib.Context(preset=None, out_dir=str(tmp_path / 'out'), work_dir=str(tmp_path))
  assert jobs_lib.job_seconds(ctx, 'timing') is None  # a stage without jobs
  jobs_lib.finish_job(ctx, 'timing', 'a', {'wall_seconds': 10.5})  # an earlier, killed run's
  jobs_lib.run_jobs(ctx, 'timing', [('a', lambda: {}), ('b', lambda: {'x': 1})])
  with open(tmp_path / 'jobs' / 'timing' / 'b.json') as f:
    b = json.load(f)['wall_seconds']
  assert jobs_lib.job_seconds(ctx, 'timing') == round(10.5 + b, 1)


@pytest.mark.parametrize('threshold,kept', [(0, False), (10**9, True)])
def test_reproduce_jobs_release_compiled_executables_past_the_map_threshold(
    tmp_path, monkeypatch, threshold, kept):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  assert jobs_lib.memory_maps() > 0  # Linux: the count the threshold is compared with
  monkeypatch.setattr(jobs_lib, 'MAPS_BEFORE_RELEASE', threshold)
  monkeypatch.setattr(jobs_lib, 'map_limit', lambda: 10**12)  # no job's growth comes near it
  ctx = jobs_lib.Context(preset=None, out_dir=str(tmp_path / 'out'), work_dir=str(tmp_path))
  step = jax.jit(lambda x: x + 1)
  sizes = []

  def job():
    step(jnp.ones(3))
    sizes.append(step._cache_size())
    return {}

  jobs_lib.run_jobs(ctx, 'timing', [('a', job), ('b', job)])
  assert sizes == [1, 1]
  # Past the threshold the first job's executable is dropped after it; below it, it is kept.
  assert step._cache_size() == (1 if kept else 0)


def test_reproduce_jobs_release_before_a_job_like_the_largest_could_pass_the_limit(monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  maps = [1000]
  monkeypatch.setattr(jobs_lib, 'memory_maps', lambda: maps[0])
  monkeypatch.setattr(jobs_lib, 'map_limit', lambda: 10_000)
  monkeypatch.setattr(jobs_lib, '_MAPS', {'last': None, 'largest_growth': 0})
  step = jax.jit(lambda x: x * 2)
  step(jnp.ones(2))
  jobs_lib.release_compiled()  # the first call: nothing to compare with
  maps[0] = 3000  # a job added 2000: 3000 + 2 x 2000 < 9000
  jobs_lib.release_compiled()
  assert step._cache_size() == 1
  maps[0] = 5100  # 5100 + 2 x 2100 > 9000, far below MAPS_BEFORE_RELEASE
  jobs_lib.release_compiled()
  assert step._cache_size() == 0


def test_coarse_progress_writes_only_every_t_seconds(caplog, monkeypatch):
  now = [0.0]
  monkeypatch.setattr(progress.time, 'time', lambda: now[0])
  caplog.set_level(logging.INFO, 'gqa_spec.progress')
  with progress.coarse():
    bar = progress.Progress('train', total=100, bar=False, every_seconds=30)
  now[0] = 20.0  # the first step compiles: the clock of lines and tokens/s starts after it
  bar.update(1, loss=1.0, tokens=1000.0)
  for step in range(2, 101):  # then 1 s per step: a line every 30 s, not the last step's
    now[0] += 1.0
    bar.update(step, loss=1.0, tokens=10.0)
  lines = _lines(caplog)
  assert [int(re.search(r'step (\d+)/', l).group(1)) for l in lines] == [31, 61, 91]
  assert lines[0] == 'train step 31/100 (31%) loss 1 tokens/s 10 elapsed 50s ETA 1m09s'
  # A job shorter than every_seconds writes nothing; outside the block the usual lines return.
  caplog.clear()
  with progress.coarse():
    short = progress.Progress('train', total=10, bar=False, every_seconds=30)
  short.update(10, loss=1.0)
  assert not _lines(caplog)
  progress.Progress('train', total=10, bar=False, every_seconds=30).update(10, loss=1.0)
  assert len(_lines(caplog)) == 1
