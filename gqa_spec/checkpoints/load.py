"""Initial checkpoints: parameters (and the step, when recorded) from any checkpoint we can read.

`load_any(path)` recognises, in this order:
  trainer run dir   `<path>/checkpoints/<step>/` (ours): the latest step's parameters, its config
                    and its step;
  native            `config.json` + `params/` (`gqa_spec.checkpoints.native`): no step;
  HF transformers   `config.json` + `model.safetensors` / `pytorch_model.bin` / an index: no step;
  T5X legacy        `checkpoint_<N>/checkpoint` msgpack: step N; T5X stores no model config, so
                    the caller names it (`t5x_config`).
Optimizer state is never read: a new run (fine-tuning, uptraining) starts its own.

A *model* to decode, evaluate, convert or export (`load_model`, `load_any(model=True)`) may also be
given as a training run directory: its `best/` when it has one (the best evaluation), else its
latest complete checkpoint; `RUN/checkpoints/N` names step N. Which one was taken is said in one
line (`run_checkpoint`'s note).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
from typing import Any, Optional, Tuple

import jax

from gqa_spec import arguments, rundir
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.rundir import BEST_DIR, BEST_FILE, CHECKPOINTS_DIR

Params = Any
log = logging.getLogger(__name__)

LAYOUTS = arguments.LAYOUTS


def scan_layers_of(layout: Optional[str], name: str = 'layout') -> Optional[bool]:
  """`load_any`'s `scan_layers` for a layout name: None (as stored), 'unrolled' or 'scanned'."""
  if layout is None:
    return None
  if layout not in LAYOUTS:
    raise UserError(f'{name} must be one of {", ".join(LAYOUTS)} (or None: as stored), got '
                    f'{layout!r}')
  return layout == 'scanned'


def run_checkpoint(path: str) -> Optional[Tuple[str, Optional[int], str]]:
  """Which model a training run directory (or `RUN/checkpoints/N`) holds: `(directory, step,
  note)`, where `directory` is a native checkpoint (`best/`: step None) or the run directory whose
  train-state checkpoint `step` to read, and `note` says which one in one line; None when `path` is
  neither."""
  from gqa_spec.checkpoints import manager, native  # pylint: disable=g-import-not-at-top
  path = os.path.normpath(path)
  parent, name = os.path.split(path)
  if name.isdigit() and os.path.basename(parent) == CHECKPOINTS_DIR and os.path.isdir(path):
    run = os.path.dirname(parent)
    if not all(os.path.isdir(os.path.join(path, item)) for item in ('state', 'meta')):
      raise UserError(f'{path}: not a complete checkpoint (its state/ and meta/ are missing)')
    return run, int(name), f'{path}: took step {name} of the training run {run}'
  if not manager.has_checkpoints(path):
    return None
  best = os.path.join(path, BEST_DIR)
  if os.path.isdir(os.path.join(best, native.PARAMS_DIR)):
    try:
      record = rundir.read_record(os.path.join(path, BEST_FILE),
                                  {'step': int, 'metric': str, 'value': float}, 'best record')
      what = f"{record['metric']} = {record['value']:.4g} at step {record['step']}"
    except (OSError, rundir.RecordError):
      what = 'its record best.json is unreadable'
    return best, None, f'{path}: a training run directory; took its best/ ({what})'
  latest = manager.Checkpointer(path).latest_step()
  if latest is None:
    raise UserError(f'{path}: a training run directory with no complete checkpoint yet')
  return path, latest, (f'{path}: a training run directory without best/; took its latest complete '
                        f'checkpoint, {CHECKPOINTS_DIR}/{latest}')


def load_model(path: str) -> Tuple[T5Config, Params, Optional[str]]:
  """`(config, params, vocab_path)` of a native checkpoint or a training run directory; for a run
  directory, `run_checkpoint`'s note goes to stderr (the commands' `--model`, `--draft`,
  `convert`, `export-hf`)."""
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  target = run_checkpoint(path)
  if target is None:
    return native.load_checkpoint(path)
  directory, step, note = target
  print(f'gqa-spec: {note}', file=sys.stderr)
  if step is None:
    return native.load_checkpoint(directory)
  config, params = _run_params(directory, step)
  return config, params, None


def load_any(path: str, t5x_config: Optional[T5Config] = None,
             scan_layers: Optional[bool] = None,
             model: bool = False) -> Tuple[T5Config, Params, Optional[int]]:
  """`(config, params, step or None)` of the checkpoint at `path` (see the module docstring).

  `scan_layers` True / False stacks / unstacks the layers (`models/layout.py`) whatever layout the
  checkpoint was written in, and sets the returned config's `scan_layers`; None keeps the
  checkpoint's own layout (T5X: `t5x_config`'s). `model`: a training run directory gives the model
  `run_checkpoint` chooses (logged), not its latest step.
  """
  target = run_checkpoint(path) if model else None
  if target is None:
    config, params, step = _load(path, t5x_config)
  else:
    directory, step, note = target
    log.info('%s', note)
    if step is None:  # best/: a native checkpoint
      config, params, _ = _load(directory, t5x_config)
    else:
      config, params = _run_params(directory, step)
  if scan_layers is not None:
    from gqa_spec.models import layout  # pylint: disable=g-import-not-at-top  (flax)
    config, params = layout.convert(config, params, scan_layers)
  return config, params, step


def vocab_of(path: str) -> Optional[str]:
  """The vocabulary file a checkpoint carries: a run directory's or a native checkpoint's
  `vocab/sentencepiece.model`, an HF directory's `spiece.model`; None when it carries none."""
  for name in (rundir.VOCAB_FILE, 'spiece.model'):  # native / run directory, HF
    if os.path.isfile(os.path.join(path, name)):
      return os.path.join(path, name)
  return None


def _load(path: str, t5x_config: Optional[T5Config]) -> Tuple[T5Config, Params, Optional[int]]:
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top  (slow imports)
  from gqa_spec.checkpoints import manager  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    raise UserError(f'{path}: checkpoint not found')
  if manager.has_checkpoints(path):
    step = manager.Checkpointer(path).latest_step()
    if step is None:
      raise UserError(f'{os.path.join(path, CHECKPOINTS_DIR)}: holds no complete checkpoint')
    return _run_params(path, step) + (step,)
  is_dir = os.path.isdir(path)
  if is_dir and os.path.isdir(os.path.join(path, native.PARAMS_DIR)):
    config, params, _ = native.load_checkpoint(path)
    return config, params, None
  if is_dir and os.path.isfile(os.path.join(path, 'config.json')) and (
      glob.glob(os.path.join(path, '*.safetensors*')) or glob.glob(os.path.join(path, '*.bin*'))):
    from gqa_spec.checkpoints import hf  # pylint: disable=g-import-not-at-top
    config, params, _ = hf.load_hf(path)
    return config, params, None
  from gqa_spec.checkpoints import t5x_legacy  # pylint: disable=g-import-not-at-top
  checkpoint_file = t5x_legacy.find_checkpoint_file(path)
  if t5x_config is None:
    raise UserError(f'{path}: a T5X checkpoint records no model config; name it (the model gin)')
  match = re.fullmatch(r'checkpoint_(\d+)', os.path.basename(os.path.dirname(checkpoint_file)))
  return t5x_config, t5x_legacy.load_t5x(path, t5x_config), int(match.group(1)) if match else None


def _run_params(run_dir: str, step: int) -> Tuple[T5Config, Params]:
  """The config and parameters (on this process's first device) of a trainer checkpoint."""
  from gqa_spec.checkpoints import manager, native  # pylint: disable=g-import-not-at-top
  ckpt = manager.Checkpointer(run_dir)
  try:
    config = T5Config.from_dict(ckpt.restore_meta(step)['model_config'])
    # this process's own device: on several processes jax.devices()[0] may be another host's
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
        native.abstract_params(config))
    return config, ckpt.restore_params(step, target)
  finally:
    ckpt.close()
