"""A run killed with SIGKILL and restarted ends with the same parameters as an uninterrupted run.

Both runs go through `gqa-spec train` with gin, on the real seqio span-corruption pipeline over a
tiny DDTP corpus, with dropout on: equality needs the same data order after resume (seqio seed +
skip-ahead), the same optimizer state and the same per-step dropout rng.
"""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from gqa_spec.training import initial

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


def _steps(model_dir):
  directory = os.path.join(model_dir, 'checkpoints')
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


@pytest.mark.slow
def test_sigkill_and_resume_reaches_the_same_parameters(tmp_path, tiny_data_dir):
  # Cheap XLA optimisation shortens the compiles; every run uses it, so equality stays bitwise.
  env = dict(os.environ, GQA_SPEC_DATA_DIR=tiny_data_dir, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true')
  reference_dir, killed_dir = str(tmp_path / 'reference'), str(tmp_path / 'killed')
  subprocess.run(_command(tmp_path, reference_dir), env=env, check=True, capture_output=True)

  proc = subprocess.Popen(_command(tmp_path, killed_dir), env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while not _steps(killed_dir) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  killed_at = _steps(killed_dir)
  assert killed_at and killed_at[-1] < TOTAL_STEPS, killed_at  # it died mid-run

  result = subprocess.run(_command(tmp_path, killed_dir), env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'resumed from {killed_dir}/checkpoints/' in result.stderr

  _, reference, ref_step = initial.load(reference_dir)
  _, resumed, step = initial.load(killed_dir)
  assert ref_step == step == TOTAL_STEPS
  jax.tree_util.tree_map(np.testing.assert_array_equal, resumed, reference)  # bitwise
