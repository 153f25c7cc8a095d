"""A run stopped (SIGTERM), killed (SIGKILL), or killed inside an asynchronous checkpoint save, then
restarted, ends with the same parameters as an uninterrupted run.

Every run goes through `gqa-spec train` with gin, on the real seqio span-corruption pipeline over a
tiny DDTP corpus, with dropout on: equality needs the same data order after resume (seqio seed +
skip-ahead), the same optimizer state and the same per-step dropout rng. The uninterrupted
reference run is shared by the tests of this module.
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

TOTAL_STEPS = 60
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
trainer.CheckpointConfig.save_period = 5
trainer.CheckpointConfig.keep = 2
"""


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
  # ceil(60 / 10) steps, and at the last.
  logged = re.findall(r'INFO gqa_spec.progress: train step (\d+)/60 \(\d+%\) loss [\d.]+ '
                      r'(?:tokens/s \S+ )?elapsed \S+ ETA \S+\n', result.stderr)
  assert list(map(int, logged)) == list(range(1, 60, 6)) + [60], result.stderr[-3000:]
  _, params, step = load_any(model_dir)
  assert step == TOTAL_STEPS
  return params


def _resume_and_compare(tmp_path, model_dir, env, reference, resumed_from):
  """Re-runs into `model_dir`: it must resume from `resumed_from` and end on `reference`."""
  result = subprocess.run(_command(tmp_path, model_dir), env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'resumed from {model_dir}/checkpoints/{resumed_from}\n' in result.stderr
  _, resumed, step = load_any(model_dir)
  assert step == TOTAL_STEPS
  jax.tree_util.tree_map(np.testing.assert_array_equal, resumed, reference)  # bitwise
  # The killed run logged steps past its checkpoint; the log keeps each step once.
  steps = [r['step'] for r in map(json.loads, open(os.path.join(model_dir, 'train_log.jsonl')))
           if r['split'] == 'train']
  assert steps == sorted(set(steps)) and steps[-1] == TOTAL_STEPS, steps


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
def test_sigkill_and_resume_reaches_the_same_parameters(tmp_path, tiny_data_dir, reference):
  env = _env(tiny_data_dir)
  killed_dir = str(tmp_path / 'killed')
  proc = subprocess.Popen(_command(tmp_path, killed_dir), env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  _wait_for(lambda: _steps(killed_dir), proc)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  killed_at = _steps(killed_dir)
  assert killed_at and killed_at[-1] < TOTAL_STEPS, killed_at  # it died mid-run
  _resume_and_compare(tmp_path, killed_dir, env, reference, killed_at[-1])


@pytest.mark.slow
def test_sigterm_stops_promptly_saves_the_reached_step_and_resumes_exactly(
    tmp_path, tiny_data_dir, reference):
  env = _env(tiny_data_dir)
  stopped_dir = str(tmp_path / 'stopped')
  proc = subprocess.Popen(_command(tmp_path, stopped_dir), env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  _wait_for(lambda: _steps(stopped_dir), proc)  # compiled and training
  sent = time.time()
  os.kill(proc.pid, signal.SIGTERM)
  _, stderr = proc.communicate(timeout=120)
  latency = time.time() - sent
  assert proc.returncode == 0, stderr[-3000:]
  # Steps here take ~0.1 s, so max(30 s, two step times) is 30 s.
  assert latency < 30, latency
  stopped_at = int(re.search(r'stopped by signal at step (\d+)', stderr).group(1))
  assert stopped_at < TOTAL_STEPS, stderr[-3000:]  # it stopped mid-run...
  assert _steps(stopped_dir)[-1] == stopped_at  # ...with a checkpoint at the step it reached
  _resume_and_compare(tmp_path, stopped_dir, env, reference, stopped_at)


@pytest.mark.slow
def test_sigkill_inside_an_asynchronous_save_resumes_from_the_last_complete_checkpoint(
    tmp_path, tiny_data_dir, reference):
  # Every save stalls 2 s between writing its data and committing it (the checkpointing test
  # hook), in the background while training goes on: the kill lands inside the step-10 save,
  # whose data is written but not committed, by construction rather than by timing luck.
  env = _env(tiny_data_dir, GQA_SPEC_TEST_SAVE_STALL_SECONDS='2')
  killed_dir = str(tmp_path / 'killed')
  proc = subprocess.Popen(_command(tmp_path, killed_dir), env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  _wait_for(lambda: os.path.exists(os.path.join(killed_dir, 'save_stall_10')), proc)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  entries = os.listdir(os.path.join(killed_dir, 'checkpoints'))
  assert [e for e in entries if e.startswith('10.')], entries  # step 10's uncommitted directory
  assert _steps(killed_dir) == [5], entries  # only complete checkpoints count
  lines = '\n'.join(status.status(killed_dir))
  assert 'latest complete checkpoint: step 5 (checkpoints/5)' in lines, lines
  assert 'incomplete (uncommitted, ignored on resume): 10.' in lines, lines
  assert f'process: not running (pid {proc.pid}, started' in lines, lines  # the lock of the killed
  _resume_and_compare(tmp_path, killed_dir, _env(tiny_data_dir), reference, 5)
