"""Reader of T5X's legacy (pre-orbax) checkpoints, e.g. the public T5.1.1 ones.

Layout (t5x `checkpoints.Checkpointer`, format version 3):
  checkpoint_N/
    checkpoint                          msgpack (flax.serialization):
                                          {'version': 3, 'optimizer': {'target': params,
                                                                       'state': optimizer state}}
    target.decoder.layers_0.mlp.wo.kernel/   one zarr TensorStore array per partitioned parameter
    ...                                     (`name.replace('/', '.')`, gzip-compressed chunks)
A leaf of the msgpack tree is either the array itself (small or unpartitioned ones, flax's ndarray
extension type) or the JSON of the `tensorstore.Spec` it was written to, whose kvstore path is
relative to the checkpoint directory. Format version 0 is a plain flax checkpoint: the tree is the
optimizer state itself. Only `target` (the parameters) is read; Adafactor's `state` is ignored.
T5X parameter names equal ours, so `target` is our parameter tree once cast to the config's dtype.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

import numpy as np

from gqa_spec.checkpoints.native import cast_params, check_params
from gqa_spec.errors import UserError
from gqa_spec.models import layout
from gqa_spec.models.config import T5Config

Params = Any

CHECKPOINT_FILE = 'checkpoint'


def find_checkpoint_file(path: str) -> str:
  """Resolves a model dir (latest `checkpoint_N`), a `checkpoint_N` dir or the msgpack file."""
  if os.path.isdir(path):
    steps = []
    for entry in os.listdir(path):
      match = re.fullmatch(r'checkpoint_(\d+)', entry)
      if match and os.path.isfile(os.path.join(path, entry, CHECKPOINT_FILE)):
        steps.append(int(match.group(1)))
    steps.sort()
    if not os.path.isfile(os.path.join(path, CHECKPOINT_FILE)) and steps:
      path = os.path.join(path, f'checkpoint_{steps[-1]}')
    path = os.path.join(path, CHECKPOINT_FILE)
  if not os.path.isfile(path):
    raise UserError(f'{path}: no T5X checkpoint file (expected a checkpoint_N directory holding '
                    "a msgpack 'checkpoint' file)")
  return path


def _is_spec(leaf: Any) -> bool:
  return isinstance(leaf, Mapping) and 'driver' in leaf and ('kvstore' in leaf or 'path' in leaf)


def _read_tensorstore(spec: Mapping[str, Any], checkpoint_dir: str, name: str) -> np.ndarray:
  import tensorstore as ts  # pylint: disable=g-import-not-at-top; only T5X import needs it
  spec = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in spec.items()}
  metadata = spec.setdefault('metadata', {})
  # As t5x: open whatever chunking/compression the array was written with.
  metadata.pop('chunks', None)
  metadata.pop('compressor', None)
  if spec.get('dtype') == 'uint16' or metadata.get('dtype') == '<u2':
    raise UserError(f'{name}: bfloat16 stored as uint16 (T5X format version < 3) is not supported')
  if 'path' in spec.get('kvstore', {}):  # tensorstore >= 0.1.14
    relative = spec['kvstore']['path']
  elif 'path' in spec:
    relative = spec.pop('path')
    spec['kvstore'] = dict(spec.get('kvstore', {}))
  else:
    raise UserError(f'{name}: tensorstore spec without a path: {spec}')
  # gs:// checkpoints copied to local disk keep their gcs driver in the spec.
  spec['kvstore'] = {'driver': 'file', 'path': os.path.join(checkpoint_dir, relative)}
  try:
    return np.asarray(ts.open(spec, open=True).result().read().result())
  except Exception as e:  # pylint: disable=broad-except; tensorstore raises ValueError and others
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f'{name}: cannot read {spec["kvstore"]["path"]}: {message}') from None


def _materialise(tree: Mapping[str, Any], checkpoint_dir: str, prefix: str) -> dict:
  out = {}
  for key, value in tree.items():
    name = f'{prefix}/{key}'
    if _is_spec(value):
      out[key] = _read_tensorstore(value, checkpoint_dir, name)
    elif isinstance(value, Mapping):
      out[key] = _materialise(value, checkpoint_dir, name)
    elif isinstance(value, np.ndarray) or np.isscalar(value):
      out[key] = np.asarray(value)
    else:
      raise UserError(f'{name}: unexpected {type(value).__name__} leaf in the T5X checkpoint')
  return out


def read_target(path: str) -> Params:
  """The raw `target` tree (parameters, stored dtypes) of a T5X legacy checkpoint.

  Args:
    path: model dir, `checkpoint_N` dir or its msgpack `checkpoint` file.

  Returns:
    Nested dict of numpy arrays, T5X names (`decoder/layers_0/self_attention/key/kernel`).
  """
  from flax import serialization  # pylint: disable=g-import-not-at-top
  path = find_checkpoint_file(path)
  with open(path, 'rb') as f:
    raw = f.read()
  if raw.startswith(b'model_checkpoint_path'):
    raise UserError(f'{path}: a TensorFlow checkpoint index, not a T5X checkpoint')
  try:
    contents = serialization.msgpack_restore(raw)
  except Exception as e:  # pylint: disable=broad-except; msgpack raises several types
    raise UserError(f'{path}: corrupt T5X msgpack checkpoint ({type(e).__name__}: {e})') from None
  if not isinstance(contents, Mapping):
    raise UserError(f'{path}: not a T5X checkpoint (top level is not a map)')
  state = contents.get('optimizer', contents) if contents.get('version', 0) else contents
  if not isinstance(state, Mapping) or not isinstance(state.get('target'), Mapping):
    raise UserError(f"{path}: T5X checkpoint has no 'target' parameter tree")
  return _materialise(state['target'], os.path.dirname(path), 'target')


def load_t5x(path: str, config: T5Config) -> Params:
  """Loads a T5X legacy checkpoint's parameters for `config`.

  Args:
    path: model dir, `checkpoint_N` dir or its msgpack `checkpoint` file.
    config: the model config (T5X checkpoints carry none); every parameter's name and shape is
      checked against it (in T5X's unrolled `layers_i` names, whatever `config.scan_layers`).

  Returns:
    Our parameter tree, cast to `config.param_dtype`, in `config`'s layer layout.
  """
  params = read_target(path)
  check_params(params, config.replace(scan_layers=False), f'T5X checkpoint {path}')
  return layout.to_layout(cast_params(params, config), config.scan_layers)
