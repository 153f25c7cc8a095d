"""Uptraining (Ainslie et al. 2023, Sec. 2.1): MHA checkpoint -> convert -> alpha more pre-training.

  1. Load the multi-head checkpoint (our run dir, native, HF or T5X legacy: `checkpoints.load.load_any`).
  2. Convert the decoder's self- and cross-attention K/V to `model_config.num_kv_heads` heads
     (`gqa_spec.convert`: mean-pool by default, or first / random) and save the result as a native
     checkpoint in `<model_dir>/converted` (the alpha = 0 model of the paper's Fig. 5; written
     once, so a resumed uptraining run skips steps 1-2).
  3. Continue pre-training with the original recipe (the gin run config is `runs/pretrain.gin`'s)
     for `ceil(alpha * S)` steps, where S is the original pre-training length.

Step counter and schedule: training resumes at global step S and ends at `S + ceil(alpha * S)`, so
the rsqrt schedule continues where pre-training left it (learning rate 1/sqrt(S) onwards) rather
than warming up again; "pre-trained for a further alpha proportion of original pre-training steps
with the original pre-training setup" reads most naturally as continuing that run. The optimizer
state starts afresh for every parameter: the K/V projections changed shape and meaning, and
public checkpoints (HF) carry no optimizer state at all; with Adafactor's count restarting at 0
the first second-moment estimate is the current gradient's, so no stale statistics are carried
over. The data stream restarts (same shuffle seed) at the uptraining run's first step.

S is the step the checkpoint records (our run dirs: their latest step; T5X: `checkpoint_<S>`);
native and HF checkpoints record none, so `original_train_steps` must be given for them.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Optional

import jax

from gqa_spec.rundir import CONVERTED_DIR, UPTRAIN_FILE

# uptrain.json's fields that are read back, and their types (`rundir.read_record`).
UPTRAIN_FIELDS = {'num_kv_heads': int, 'original_train_steps': int}
from gqa_spec import atomic, distributed, rundir, rundir_lock
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.checkpoints.load import load_any, vocab_of
from gqa_spec.training import trainer



def convert_checkpoint(model_dir: str, initial_checkpoint_path: str, model_config: T5Config,
                       method: str = 'mean', original_train_steps: Optional[int] = None,
                       seed: int = 0) -> dict:
  """Steps 1-2: writes `<model_dir>/converted` (once) and returns its `uptrain.json` record."""
  from gqa_spec import convert  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  converted = os.path.join(model_dir, CONVERTED_DIR)
  record_path = os.path.join(converted, UPTRAIN_FILE)
  # process 0's view on every process: it writes the record, maybe while another one looks
  if distributed.from_process_zero([os.path.isfile(record_path)])[0]:
    return rundir.read_record(record_path, UPTRAIN_FIELDS, 'uptraining record',
                              optional={'source': str, 'method': str})
  source_config, params, step = load_any(initial_checkpoint_path,
                                         model_config.replace(num_kv_heads=None),
                                         model_config.scan_layers)
  steps = original_train_steps if original_train_steps is not None else step
  if not steps or steps < 1:
    raise UserError(f'{initial_checkpoint_path}: the checkpoint records no pre-training step '
                    'count; set ORIGINAL_TRAIN_STEPS (uptraining runs alpha x that many steps)')
  params, config = convert.convert_params(jax.device_get(params), source_config,
                                          model_config.num_kv_heads, method, seed)
  native.save_checkpoint(converted, config, params, vocab_path=vocab_of(initial_checkpoint_path),
                         overwrite=True)
  record = {'source': os.path.relpath(initial_checkpoint_path, converted),  # this file's dir
            'method': method,
            'source_num_kv_heads': source_config.num_kv_heads,
            'num_kv_heads': config.num_kv_heads, 'original_train_steps': int(steps)}
  # Written last: its presence marks a complete conversion.
  if distributed.is_writer():
    atomic.write_json(record_path, record, indent=2)
  return record


def uptrain(*, model_dir: str, model_config: T5Config, initial_checkpoint_path: str,
            method: str = 'mean', alpha: float = 0.05, original_train_steps: Optional[int] = None,
            conversion_seed: int = 0,
            train_fn: Callable[..., trainer.TrainResult] = trainer.train) -> trainer.TrainResult:
  """Converts an MHA checkpoint to `model_config.num_kv_heads` K/V heads and uptrains it.

  Args:
    model_dir: the uptraining run directory.
    model_config: the converted model (its `num_kv_heads` is the target G).
    initial_checkpoint_path: the multi-head checkpoint.
    method: 'mean' (the paper's), 'first' or 'random'.
    alpha: uptraining steps as a fraction of the original pre-training steps.
    original_train_steps: S when the checkpoint does not record it.
    conversion_seed: seed of 'random'.
    train_fn: `trainer.train`, usually gin-configured with the original pre-training recipe;
      called with model_dir, model_config, the converted checkpoint, initial_step and total_steps.

  Returns:
    The trainer's result.
  """
  if not 0 < alpha <= 10:
    raise UserError(f'alpha must be in (0, 10], got {alpha}')
  # Held across the conversion and the training (the trainer takes it again, as the same process).
  with rundir_lock.running(model_dir, enabled=jax.process_index() == 0):
    record = convert_checkpoint(model_dir, initial_checkpoint_path, model_config, method,
                                original_train_steps, conversion_seed)
    start = record['original_train_steps']
    return train_fn(model_dir=model_dir, model_config=model_config,
                    initial_checkpoint_path=os.path.join(model_dir, CONVERTED_DIR),
                    initial_step=start, total_steps=start + math.ceil(alpha * start))
