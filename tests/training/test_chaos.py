"""Chaos (issue 61): a tiny training run with periodic checkpoints and `best/` exports, killed with
SIGKILL at seeded random moments and resumed each time, ends with the parameters of an
uninterrupted run, bit for bit; every export seen between the kills loads (or is absent), and no
temporary file is left at the end.

Each run is a process of its own (`trainer.train` on synthetic batches, TensorFlow kept out so
TensorBoard's import does not dominate a start-up); the runs share a compilation cache and the
suite's XLA flags, so their numbers are the same. A kill comes once the run has logged a step drawn
from the seeded schedule: every other one as soon as the next export of `best/` has begun (its
temporary directory exists), the others after a seeded delay of up to half a second (inside a
step, an asynchronous checkpoint save, an export or the write of `best.json`).
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from gqa_spec import rundir
from gqa_spec.checkpoints import native
from gqa_spec.checkpoints.load import load_any

TOTAL_STEPS = 24
KILLS = int(os.environ.get('GQA_SPEC_CHAOS_KILLS', '4'))
SEED = int(os.environ.get('GQA_SPEC_CHAOS_SEED', '61'))

_CHILD = """
import sys
sys.modules['tensorflow'] = None  # no TensorBoard events: the JSONL log only
from gqa_spec.models.config import T5Config
from gqa_spec.training import trainer
from gqa_spec.training.data import DatasetConfig
config = T5Config(vocab_size=256, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                  num_encoder_layers=1, num_decoder_layers=1)
trainer.train(model_dir=sys.argv[1], model_config=config,
              train_dataset_cfg=DatasetConfig('synthetic', {'inputs': 8, 'targets': 8},
                                              batch_size=2, pack=False),
              total_steps=int(sys.argv[2]),
              checkpoint_cfg=trainer.CheckpointConfig(save_period=2, keep=2),
              evaluator=lambda params, step: {'score': float(step)}, eval_period=3,
              best_metric='score', log_period=1, progress_bar=False)
"""

# What a writer leaves while it writes: atomic's `.NAME.tmpPID[.old]`, orbax's uncommitted step
# directories, the lock and its side files.
_TEMPORARY = re.compile(r'^\..+\.tmp\d+(\.old)?$|orbax-checkpoint-tmp|^RUNNING\.json')


def _env(cache):
  return dict(os.environ, PYTHONPATH=os.getcwd(), JAX_PLATFORMS='cpu',
              JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')


def _start(run, env, log):
  with open(log, 'a') as stderr:
    return subprocess.Popen([sys.executable, '-c', _CHILD, str(run), str(TOTAL_STEPS)], env=env,
                            stdout=subprocess.DEVNULL, stderr=stderr)


def _logged_step(run):
  """The last step in the run's JSONL log (0: none yet)."""
  try:
    with open(run / rundir.TRAIN_LOG_FILE) as f:
      steps = [json.loads(line).get('step', 0) for line in f if line.endswith('\n')]
  except (OSError, ValueError):
    return 0
  return max(steps, default=0)


def _temporaries(run):
  return sorted(os.path.relpath(os.path.join(d, n), run) for d, dirs, files in os.walk(run)
                for n in dirs + files if _TEMPORARY.search(n))


def _params(path):
  _, params, step = load_any(str(path))
  return step, jax.tree.map(np.asarray, params)


@pytest.mark.slow
def test_killed_at_random_moments_and_resumed_ends_as_an_uninterrupted_run(tmp_path):
  env = _env(tmp_path / 'xla_cache')
  reference = tmp_path / 'reference'
  proc = _start(reference, env, tmp_path / 'reference.log')
  assert proc.wait(timeout=600) == 0, (tmp_path / 'reference.log').read_text()[-3000:]

  chaos, log = tmp_path / 'chaos', tmp_path / 'chaos.log'
  rng = random.Random(SEED)
  schedule = sorted(rng.sample(range(1, TOTAL_STEPS), KILLS))
  killed, left, logged = 0, [], 0
  for i, kill_at in enumerate(schedule):
    proc = _start(chaos, env, log)
    export = f'.{rundir.BEST_DIR}.tmp{proc.pid}'  # its export of best/, while being written
    kill_at = max(kill_at, logged + 1)  # a step this run logs itself, not one of the run before
    deadline = time.time() + 600
    while _logged_step(chaos) < kill_at and proc.poll() is None and time.time() < deadline:
      time.sleep(0.01)
    if i % 2 == 0:  # inside the next export of best/: as soon as its temporary directory appears
      while not os.path.exists(chaos / export) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    else:
      time.sleep(rng.uniform(0.0, 0.5))
    proc.send_signal(signal.SIGKILL)
    code = proc.wait(timeout=60)
    assert code in (-signal.SIGKILL, 0), log.read_text()[-3000:]  # 0: it ended before the kill
    killed += code == -signal.SIGKILL
    logged = _logged_step(chaos)
    left += [export] if os.path.exists(chaos / export) else []
    # What a kill leaves: the previous export or none, never a partial one.
    if (chaos / rundir.BEST_DIR).exists():
      config, _, _ = native.load_checkpoint(str(chaos / rundir.BEST_DIR))  # verifies checksums
      assert config.vocab_size == 256
    if (chaos / rundir.BEST_FILE).exists():
      rundir.read_record(str(chaos / rundir.BEST_FILE), {'step': int, 'value': float}, 'best')
  proc = _start(chaos, env, log)
  assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
  assert left, 'no kill landed inside an export'  # what the resumes below had to sweep
  # Each killed run held the lock (it had logged a step): the next one took it over.
  assert log.read_text().count('took over the lock of a writer that is gone') == killed >= 1, (
      log.read_text()[-3000:])

  step, params = _params(chaos)
  ref_step, ref_params = _params(reference)
  assert step == ref_step == TOTAL_STEPS
  for (name, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(params),
                               jax.tree_util.tree_leaves_with_path(ref_params)):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(name))
  # The last export is the same as the uninterrupted run's, too.
  best = jax.tree.leaves(native.load_checkpoint(str(chaos / rundir.BEST_DIR))[1])
  ref_best = jax.tree.leaves(native.load_checkpoint(str(reference / rundir.BEST_DIR))[1])
  assert all(np.array_equal(a, b) for a, b in zip(best, ref_best))
  assert _temporaries(chaos) == [] and _temporaries(reference) == []
