"""A run stopped (SIGTERM), killed (SIGKILL), or killed inside an asynchronous checkpoint save, then
restarted, ends with the same parameters as an uninterrupted run.

Every run goes through `gqa-spec train` with gin, on the real seqio span-corruption pipeline over a
tiny DDTP corpus, with dropout on: equality needs the same data order after resume (seqio seed +
skip-ahead), the same optimizer state and the same per-step dropout rng. A process spends 20-30 s
starting (TensorFlow, seqio's pipeline, the compiled steps from the shared cache) and ~0.1 s a step,
so the three interruptions are chained in one run directory, each run resuming where the previous
one ended, and compared with the uninterrupted reference run once, at the end.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from gqa_spec import status
from gqa_spec.checkpoints.load import load_any

TOTAL_STEPS = 30
SAVE_PERIOD = 5
_GIN = """
include 'models/t5_1_1/nano.gin'
include 'runs/pretrain.gin'
from __gin__ import dynamic_registration
from gqa_spec.models import config
from gqa_spec.training import trainer
config.T5Config:
  vocab_size = 512
  emb_dim = 32
  num_heads = 4
  head_dim = 8
  mlp_dim = 64
  num_encoder_layers = 1
  num_decoder_layers = 1
MIXTURE_OR_TASK_NAME = 'ddtp_span_corruption'
TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 16}
BATCH_SIZE = 4
DROPOUT_RATE = 0.1
WARMUP_STEPS = 10
trainer.train.log_period = 10
trainer.CheckpointConfig.keep = 2
""" + f'trainer.CheckpointConfig.save_period = {SAVE_PERIOD}\n'


# `gqa-spec train` with only the training commands registered, so that the test does not depend
# on the other command modules importing cleanly.
_TRAIN_CLI = """
import argparse, sys
from gqa_spec.training import commands
parser = argparse.ArgumentParser(prog='gqa-spec')
commands.register(parser.add_subparsers())
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def _command(tmp_path, model_dir):
  gin_file = tmp_path / 'tiny.gin'
  gin_file.write_text(_GIN)
  return [sys.executable, '-c', _TRAIN_CLI, 'train', f'--gin_file={gin_file}',
          f"--gin.MODEL_DIR='{model_dir}'", f'--gin.TRAIN_STEPS={TOTAL_STEPS}']


def _env(data_dir, **extra):
  # Cheap XLA optimisation shortens the compiles, and the runs share a compilation cache (the
  # reference run fills it); every run uses the same flags, so equality stays bitwise.
  return dict(os.environ, GQA_SPEC_DATA_DIR=data_dir, JAX_PLATFORMS='cpu',
              XLA_FLAGS='--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true',
              JAX_COMPILATION_CACHE_DIR=os.path.join(data_dir, 'xla_cache'),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0', **extra)


@pytest.fixture(scope='module')
def reference(tmp_path_factory, tiny_data_dir):
  """The parameters of an uninterrupted run to TOTAL_STEPS."""
  tmp_path = tmp_path_factory.mktemp('reference')
  model_dir = str(tmp_path / 'run')
  # No time-triggered progress lines: only the step cadence.
  env = _env(tiny_data_dir, GQA_SPEC_PROGRESS_SECONDS='1e9')
  result = subprocess.run(_command(tmp_path, model_dir), env=env, check=True, capture_output=True,
                          text=True)
  # stderr is a pipe, not a terminal: progress comes as lines, at the first step, then every
  # ceil(TOTAL_STEPS / 10) steps, and at the last.
  logged = re.findall(rf'INFO gqa_spec.progress: train step (\d+)/{TOTAL_STEPS} \(\d+%\) loss '
                      r'[\d.]+ (?:tokens/s \S+ )?elapsed \S+ ETA \S+\n', result.stderr)
  every = -(-TOTAL_STEPS // 10)
  assert list(map(int, logged)) == list(range(1, TOTAL_STEPS, every)) + [TOTAL_STEPS], (
      result.stderr[-3000:])
  _, params, step = load_any(model_dir)
  assert step == TOTAL_STEPS
  return params


def _start(tmp_path, name, model_dir, env):
  """Starts `gqa-spec train` into `model_dir`; its stderr goes to `tmp_path/<name>.stderr`."""
  with open(tmp_path / f'{name}.stderr', 'w') as stderr:
    return subprocess.Popen(_command(tmp_path, model_dir), env=env, stdout=subprocess.DEVNULL,
                            stderr=stderr)


def _stderr(tmp_path, name):
  return (tmp_path / f'{name}.stderr').read_text()


def _resumed_from(stderr, model_dir, step):
  return f'resumed from {model_dir}/checkpoints/{step}\n' in stderr


def _wait_for(predicate, proc, seconds=300):
  deadline = time.time() + seconds
  while not predicate() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  assert predicate(), f'timed out or exited (rc {proc.poll()})'


def _steps(model_dir):
  directory = os.path.join(model_dir, 'checkpoints')
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


@pytest.mark.slow
def test_sigkill_sigkill_inside_an_asynchronous_save_and_sigterm_each_resume_exactly(
    tmp_path, tiny_data_dir, reference):
  """One run directory, interrupted three ways in turn, each run resuming where the last one ended.

  1. SIGKILL once a checkpoint exists: the process dies by the signal, mid-run.
  2. Resumed (from the killed run's last checkpoint), with every save stalled between writing its
     data and committing it (`STALL_ENV`), SIGKILL inside the next save: the process dies by the
     signal; that step's uncommitted directory is there, only complete checkpoints count; `gqa-spec
     status` names the last complete checkpoint, the uncommitted one as ignored on resume, and the
     killed process (its lock) as not running.
  3. Resumed from the last complete checkpoint (not the uncommitted one), SIGTERM once it trains:
     exit status 0 within 30 s of the signal, stopped mid-run, with a checkpoint at the step it
     reached.
  4. Resumed from that step: exit status 0, a checkpoint at TOTAL_STEPS, parameters bitwise equal
     to the uninterrupted reference's, and each train step once in train_log.jsonl up to
     TOTAL_STEPS (runs 1-3 logged steps past the checkpoints resumed from).
  """
  env = _env(tiny_data_dir)
  model_dir = str(tmp_path / 'run')

  proc = _start(tmp_path, 'killed', model_dir, env)
  _wait_for(lambda: _steps(model_dir), proc)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  killed_at = _steps(model_dir)
  assert killed_at and killed_at[-1] < TOTAL_STEPS, killed_at  # it died mid-run

  # Every save stalls 2 s between writing its data and committing it (the checkpointing test
  # hook), in the background while training goes on: the kill lands inside the first save of this
  # run, whose data is written but not committed, by construction rather than by timing luck.
  proc = _start(tmp_path, 'killed_in_save', model_dir,
                _env(tiny_data_dir, GQA_SPEC_TEST_SAVE_STALL_SECONDS='2'))
  saving = killed_at[-1] + SAVE_PERIOD
  _wait_for(lambda: os.path.exists(os.path.join(model_dir, f'save_stall_{saving}')), proc)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  stderr = _stderr(tmp_path, 'killed_in_save')
  assert _resumed_from(stderr, model_dir, killed_at[-1]), stderr[-3000:]
  entries = os.listdir(os.path.join(model_dir, 'checkpoints'))
  assert [e for e in entries if e.startswith(f'{saving}.')], entries  # the uncommitted directory
  assert _steps(model_dir) == killed_at, entries  # only complete checkpoints count
  lines = '\n'.join(status.status(model_dir))
  assert (f'latest complete checkpoint: step {killed_at[-1]} (checkpoints/{killed_at[-1]})'
          in lines), lines
  assert f'incomplete (uncommitted, ignored on resume): {saving}.' in lines, lines
  assert f'process: not running (pid {proc.pid}, started' in lines, lines  # the lock of the killed

  proc = _start(tmp_path, 'stopped', model_dir, env)
  # Resumed, compiled and training: its first progress line (not a newer checkpoint, whose
  # asynchronous commit lags the training by a few steps, more on a busy machine).
  first = f'train step {killed_at[-1] + 1}/{TOTAL_STEPS} '
  _wait_for(lambda: first in _stderr(tmp_path, 'stopped'), proc)
  sent = time.time()
  os.kill(proc.pid, signal.SIGTERM)
  proc.wait(timeout=120)
  latency = time.time() - sent
  stderr = _stderr(tmp_path, 'stopped')
  assert proc.returncode == 0, stderr[-3000:]
  assert _resumed_from(stderr, model_dir, killed_at[-1]), stderr[-3000:]
  # Steps here take ~0.1 s, so max(30 s, two step times) is 30 s.
  assert latency < 30, latency
  stopped_at = int(re.search(r'stopped by signal at step (\d+)', stderr).group(1))
  assert stopped_at < TOTAL_STEPS, stderr[-3000:]  # it stopped mid-run...
  assert _steps(model_dir)[-1] == stopped_at  # ...with a checkpoint at the step it reached

  result = subprocess.run(_command(tmp_path, model_dir), env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert _resumed_from(result.stderr, model_dir, stopped_at), result.stderr[-3000:]
  _, resumed, step = load_any(model_dir)
  assert step == TOTAL_STEPS
  jax.tree_util.tree_map(np.testing.assert_array_equal, resumed, reference)  # bitwise
  # The interrupted runs logged steps past the checkpoints resumed from; the log keeps each once.
  steps = [r['step'] for r in map(json.loads, open(os.path.join(model_dir, 'train_log.jsonl')))
           if r['split'] == 'train']
  assert steps == sorted(set(steps)) and steps[-1] == TOTAL_STEPS, steps
