"""The native checkpoint: orbax parameters with the model config (and vocabulary) beside them.

Layout of a checkpoint directory; loading needs nothing but its path:
  config.json                  `T5Config.to_json()`
  params/                      orbax `StandardCheckpointer` PyTree (the flax 'params' collection)
  integrity.json               CRC-32 of every parameter's bytes as saved (`INTEGRITY_FILE`)
  vocab/sentencepiece.model    optional vocabulary, copied in when the checkpoint is written

Every failure to read one (missing directory or file, corrupt JSON, unreadable orbax data, a
parameter tree that does not fit the config, a parameter whose bytes differ from those saved) is a
`UserError` naming the path and the problem. A checkpoint written before `integrity.json` existed
loads with a logged note that it cannot be verified.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import zlib
from typing import Any, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec import atomic, distributed, rundir
from gqa_spec.checkpoints import aborted_reads, integrity
from gqa_spec.checkpoints.orbax_lock import LOCK
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from gqa_spec.partitioning import to_host

Params = Any  # nested dict of arrays, the flax 'params' collection

CONFIG_FILE = 'config.json'
PARAMS_DIR = 'params'
INTEGRITY_FILE = 'integrity.json'
VOCAB_FILE = rundir.VOCAB_FILE  # also a run directory's
HF_FILES = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin',
            'pytorch_model.bin.index.json')

log = logging.getLogger(__name__)


def abstract_params(config: T5Config) -> Params:
  """The parameter tree `config` defines, as `jax.ShapeDtypeStruct`s (nothing is allocated).

  Traced once per config (`_abstract_params`: tracing a 12-layer model's init takes seconds, and
  a load asked for it up to four times); each call returns its own copy of the tree."""
  return jax.tree_util.tree_map(lambda x: x, _abstract_params(config))


@functools.lru_cache(maxsize=64)
def _abstract_params(config: T5Config) -> Params:
  tokens = jnp.zeros((1, 1), jnp.int32)
  variables = jax.eval_shape(
      lambda: Transformer(config).init(jax.random.PRNGKey(0), tokens, tokens, tokens,
                                       enable_dropout=False))
  return variables['params']


def _flat(tree: Params) -> dict:
  return {'/'.join(path): leaf for path, leaf in _items(tree, ())}


def _items(tree, prefix):
  for key, value in tree.items():
    if isinstance(value, Mapping):
      yield from _items(value, prefix + (str(key),))
    else:
      yield prefix + (str(key),), value


def check_params(params: Params, config: T5Config, source: str) -> None:
  """Raises `UserError` unless `params` has exactly the names and shapes `config` defines.

  Args:
    params: the parameter tree to check.
    config: the model config it should fit.
    source: where the parameters came from, for the message.
  """
  expected = _flat(abstract_params(config))
  got = _flat(params)
  # Shapes first: for a checkpoint of another size the first wrong shape says the most.
  for name in sorted(set(expected) & set(got)):
    if tuple(np.shape(got[name])) != tuple(expected[name].shape):
      raise UserError(f'{source}: parameter {name} has shape {tuple(np.shape(got[name]))}, the '
                      f'model config needs {tuple(expected[name].shape)}')
  missing = sorted(set(expected) - set(got))
  if missing:
    raise UserError(f'{source}: parameter {missing[0]} is missing ({len(missing)} missing in all) '
                    'for the model config')
  unexpected = sorted(set(got) - set(expected))
  if unexpected:
    raise UserError(f'{source}: unexpected parameter {unexpected[0]} ({len(unexpected)} in all) '
                    'for the model config')


def cast_params(params: Params, config: T5Config) -> Params:
  """Casts every parameter to the config's parameter dtype (as numpy arrays)."""
  dtype = config.parameter_dtype
  return jax.tree.map(lambda x: np.asarray(x).astype(dtype), params)


def save_checkpoint(directory: str, config: T5Config, params: Params,
                    vocab_path: Optional[str] = None, overwrite: bool = False) -> None:
  """Writes a native checkpoint.

  Args:
    directory: the checkpoint directory; created, and must not exist unless `overwrite`. On
      several processes every one calls this (the parameters are gathered), only process 0 writes,
      and it returns on all once the checkpoint is complete.
    config: the model config, saved as `config.json`.
    params: the flax 'params' tree; checked against `config` before anything is written.
    vocab_path: optional SentencePiece model copied to `vocab/sentencepiece.model`.
    overwrite: replace an existing directory.
  """
  directory = os.path.abspath(directory)
  check_params(params, config, 'parameters to save')
  # What process 0 sees decides, on every process alike. A process that checked for itself could
  # find the directory process 0 has just written and raise while process 0 waits for it: the
  # gather below need not wait for the others when each process holds whole copies (a data x
  # model mesh whose model axis lies within a host), and CI saw it happen.
  problems = (f'{vocab_path}: vocabulary file not found',
              f'{directory}: output directory already exists (pass --overwrite to replace it)')
  problem = (1 if vocab_path is not None and not os.path.isfile(vocab_path) else
             2 if os.path.exists(directory) and not overwrite else 0)
  problem = int(distributed.from_process_zero([problem])[0])
  if problem:
    raise UserError(problems[problem - 1])
  # numpy leaves carry no sharding, so the checkpoint loads on any device layout. Parameters
  # spread over processes are gathered first: every process calls this, process 0 writes.
  host = to_host(params)
  if jax.process_index() == 0:
    # Filled beside `directory` and renamed over it when complete: a failed save (a full disk)
    # leaves no partial checkpoint, and the one it would replace (`best/`) intact.
    with atomic.directory(directory) as tmp:
      with LOCK, _local_checkpointer() as checkpointer:
        try:
          checkpointer.save(os.path.join(tmp, PARAMS_DIR), host)
        except (ValueError, RuntimeError) as e:  # tensorstore's errors carry no errno
          raise atomic.WriteError(f'{directory}: cannot write the parameters: '
                                  f'{str(e).strip().splitlines()[0] if str(e).strip() else e!r}; '
                                  'nothing was written there') from e
      atomic.write_json(os.path.join(tmp, INTEGRITY_FILE),
                        {'algorithm': 'crc32', 'arrays': checksums(host)}, indent=1)
      if vocab_path is not None:
        os.makedirs(os.path.join(tmp, 'vocab'))
        shutil.copyfile(vocab_path, os.path.join(tmp, VOCAB_FILE))
      atomic.write_text(os.path.join(tmp, CONFIG_FILE), config.to_json() + '\n')
  if jax.process_count() > 1:  # every process may read the checkpoint once this returns
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(f'native checkpoint {directory}')


def _local_checkpointer():
  """An orbax checkpointer of this process alone: a native checkpoint is written by one process
  and read by each on its own, so no orbax barrier waits for the others."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top; slow import, save/load only
  me = jax.process_index()
  return ocp.StandardCheckpointer(multiprocessing_options=ocp.options.MultiprocessingOptions(
      primary_host=me, active_processes={me}, barrier_sync_key_prefix=f'native_{me}'))


def checksums(params: Params) -> dict:
  """Parameter name -> CRC-32 (hex) of its bytes as stored (C order, its own dtype)."""
  return {name: f'{zlib.crc32(np.ascontiguousarray(x)) & 0xffffffff:08x}'
          for name, x in _flat(params).items()}


def verify(directory: str, params: Params) -> None:
  """Compares `params`, as read from the checkpoint, with its `integrity.json`.

  Raises:
    UserError: a parameter's checksum differs (names the checkpoint and the parameter), or the
      integrity file is unreadable.
  """
  path = os.path.join(directory, INTEGRITY_FILE)
  if not os.path.isfile(path):
    log.warning('%s: written without checksums (before integrity.json existed); its parameters '
                'cannot be verified', directory)
    return
  try:
    with open(path) as f:
      expected = json.load(f)['arrays']
  except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
    raise UserError(f'{path}: corrupt integrity file ({type(e).__name__})') from None
  flat = _flat(params)
  for name in sorted(flat):
    got = f'{zlib.crc32(np.ascontiguousarray(np.asarray(flat[name]))) & 0xffffffff:08x}'
    if expected.get(name) != got:
      raise UserError(f'{directory}: parameter {name} is corrupt (checksum {got}, saved '
                      f'{expected.get(name)}); the checkpoint data was damaged after writing')


def _hf_hint(directory: str) -> str:
  """A hint to `import-hf` when `directory` holds an HF transformers checkpoint, else ''."""
  if any(os.path.isfile(os.path.join(directory, name)) for name in HF_FILES):
    return (f'; it is a Hugging Face checkpoint: convert it first with `gqa-spec import-hf '
            f'{directory} OUT_DIR`')
  return ''


def load_config(directory: str) -> T5Config:
  """Reads `config.json` of a native checkpoint."""
  if not os.path.isdir(directory):
    raise UserError(f'{directory}: checkpoint directory not found')
  path = os.path.join(directory, CONFIG_FILE)
  hint = '' if os.path.isdir(os.path.join(directory, PARAMS_DIR)) else _hf_hint(directory)
  if hint:
    raise UserError(f'{directory}: not a gqa-spec checkpoint{hint}')
  if not os.path.isfile(path):
    raise UserError(f'{path}: missing; not a gqa-spec checkpoint directory')
  try:
    with open(path) as f:
      return T5Config.from_json(f.read())
  except (ValueError, TypeError, UnicodeDecodeError) as e:
    raise UserError(f'{path}: corrupt model config: {e}') from None


def vocab_path(directory: str) -> Optional[str]:
  """The checkpoint's vocabulary file, or None when it carries none."""
  path = os.path.join(directory, VOCAB_FILE)
  return path if os.path.isfile(path) else None


def load_checkpoint(directory: str) -> Tuple[T5Config, Params, Optional[str]]:
  """Reads a native checkpoint.

  Args:
    directory: a directory written by `save_checkpoint`.

  Returns:
    `(config, params, vocab_path)`: params are jax arrays in the config's parameter dtype on the
    default device; `vocab_path` is None when the checkpoint carries no vocabulary.
  """
  directory = os.path.abspath(directory)
  config = load_config(directory)
  params_dir = os.path.join(directory, PARAMS_DIR)
  if not os.path.isdir(params_dir):
    raise UserError(f'{params_dir}: missing; the checkpoint has no parameters')
  _check_storage(params_dir)
  expected = abstract_params(config)
  with LOCK, _local_checkpointer() as checkpointer:
    try:
      stored = checkpointer.metadata(params_dir).item_metadata.tree
    except Exception as e:  # pylint: disable=broad-except; orbax raises many types for bad data
      raise UserError(f'{params_dir}: unreadable orbax checkpoint ({type(e).__name__}: '
                      f'{integrity.first_line(e)})') from None
    check_params(stored, config, params_dir)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, s.dtype, sharding=device),
                          expected, _unflat_like(expected, _flat(stored)))
    aborted_reads.install()
    try:
      params = checkpointer.restore(params_dir, target)
    except Exception as e:  # pylint: disable=broad-except
      # damaged bytes that no longer decompress: name the array
      integrity.raise_if_unreadable(params_dir, e, directory, 'parameter')
      raise UserError(f'{params_dir}: corrupt orbax checkpoint ({type(e).__name__}: '
                      f'{integrity.first_line(e)})') from None
  verify(directory, params)
  params = jax.tree.map(lambda x: x.astype(config.parameter_dtype), params)
  return config, params, vocab_path(directory)


def _check_storage(params_dir: str) -> None:
  """Reads the OCDBT index (manifest and B-tree) before orbax does: a truncated or damaged one is a
  one-line `UserError` here, where orbax fails with an unrelated AttributeError and leaves asyncio
  callbacks raising after its event loop closed."""
  if not os.path.isfile(os.path.join(params_dir, 'manifest.ocdbt')):
    return  # not an OCDBT checkpoint: orbax's own errors apply
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  try:
    ts.KvStore.open({'driver': 'ocdbt', 'base': f'file://{params_dir}'}).result().list().result()
  except Exception as e:  # pylint: disable=broad-except; tensorstore raises ValueError and others
    raise UserError(f'{params_dir}: corrupt orbax checkpoint (its OCDBT index: '
                    f'{integrity.first_line(e)})') from None


def _unflat_like(tree: Params, flat: dict, prefix: str = '') -> Params:
  return {k: (_unflat_like(v, flat, f'{prefix}{k}/') if isinstance(v, dict) else flat[prefix + k])
          for k, v in tree.items()}
