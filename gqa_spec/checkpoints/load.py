"""Initial checkpoints: parameters (and the step, when recorded) from any checkpoint we can read.

`load_any(path)` recognises, in this order:
  trainer run dir   `<path>/checkpoints/<step>/` (ours): the latest step's parameters, its config
                    and its step;
  native            `config.json` + `params/` (`gqa_spec.checkpoints.native`): no step;
  HF transformers   `config.json` + `model.safetensors` / `pytorch_model.bin` / an index: no step;
  T5X legacy        `checkpoint_<N>/checkpoint` msgpack: step N; T5X stores no model config, so
                    the caller names it (`t5x_config`).
Optimizer state is never read: a new run (fine-tuning, uptraining) starts its own.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Optional, Tuple

import jax

from gqa_spec import arguments
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config

Params = Any

LAYOUTS = arguments.LAYOUTS


def scan_layers_of(layout: Optional[str], name: str = 'layout') -> Optional[bool]:
  """`load_any`'s `scan_layers` for a layout name: None (as stored), 'unrolled' or 'scanned'."""
  if layout is None:
    return None
  if layout not in LAYOUTS:
    raise UserError(f'{name} must be one of {", ".join(LAYOUTS)} (or None: as stored), got '
                    f'{layout!r}')
  return layout == 'scanned'


def load_any(path: str, t5x_config: Optional[T5Config] = None,
             scan_layers: Optional[bool] = None) -> Tuple[T5Config, Params, Optional[int]]:
  """`(config, params, step or None)` of the checkpoint at `path` (see the module docstring).

  `scan_layers` True / False stacks / unstacks the layers (`models/layout.py`) whatever layout the
  checkpoint was written in, and sets the returned config's `scan_layers`; None keeps the
  checkpoint's own layout (T5X: `t5x_config`'s).
  """
  config, params, step = _load(path, t5x_config)
  if scan_layers is not None:
    from gqa_spec.models import layout  # pylint: disable=g-import-not-at-top  (flax)
    config, params = layout.convert(config, params, scan_layers)
  return config, params, step


def _load(path: str, t5x_config: Optional[T5Config]) -> Tuple[T5Config, Params, Optional[int]]:
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top  (slow imports)
  from gqa_spec.checkpoints import manager  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    raise UserError(f'{path}: initial checkpoint not found')
  if manager.has_checkpoints(path):
    ckpt = manager.Checkpointer(path)
    step = ckpt.latest_step()
    if step is None:
      raise UserError(f'{ckpt.directory}: holds no complete checkpoint')
    config = T5Config.from_dict(ckpt.restore_meta(step)['model_config'])
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                                    native.abstract_params(config))
    params = ckpt.restore_params(step, target)
    ckpt.close()
    return config, params, step
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
