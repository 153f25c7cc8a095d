"""The run directory: every file and folder name inside one, the RUNNING lock's name, and relative paths.

JAX-free (only the standard library), so `gqa-spec status` and any layer may import it. A run
directory is `trainer.train`'s model_dir; a reproduction's work dir holds many of them.

  <model_dir>/
    checkpoints/<step>/   orbax checkpoints (`CHECKPOINTS_DIR`, `checkpoints.manager`)
    vocab/sentencepiece.model  the task's vocabulary, carried into every checkpoint written from
                          the run, as in a native checkpoint (`VOCAB_FILE`)
    best/ + best.json     the best evaluation's native export and its record (`BEST_DIR`, `BEST_FILE`)
    train_log.jsonl       one JSON object per logged train/eval record (`TRAIN_LOG_FILE`)
    train/, eval/         TensorBoard event files
    RUNNING.json          the lock a writing process holds (`RUNNING_FILE`, `rundir_lock`)
    converted/            uptraining: the converted GQA/MQA starting point (`CONVERTED_DIR`)
      uptrain.json        its conversion record (`UPTRAIN_FILE`)
    draft.json            a draft run: kind, target, draft config (`DRAFT_FILE`)
    draft/                a model draft's native export (`DRAFT_EXPORT_DIR`)

The lock itself (one writer per run directory; "still writing" for `gqa-spec status`) is
`gqa_spec.rundir_lock`.

Paths a record keeps to other run directories are stored relative to the record's own directory
(`relative_to` / `resolve`), so a copied or moved work dir resumes.

Every JSON record read back (`best.json`, `draft.json`, `uptrain.json`, a stage's JSON, the lock)
goes through `read_record`, which checks its shape: a file that is not JSON, not an object, or
lacks a field or holds one of another type is one line naming the file and what is wrong
(`RecordError`), never a KeyError or TypeError deep in the reader.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional, Tuple, Union

from gqa_spec.errors import UserError

CHECKPOINTS_DIR = 'checkpoints'
BEST_DIR = 'best'
BEST_FILE = 'best.json'
TRAIN_LOG_FILE = 'train_log.jsonl'
RUNNING_FILE = 'RUNNING.json'
CONVERTED_DIR = 'converted'
UPTRAIN_FILE = 'uptrain.json'
DRAFT_FILE = 'draft.json'
DRAFT_EXPORT_DIR = 'draft'
VOCAB_FILE = os.path.join('vocab', 'sentencepiece.model')


def relative_to(path: str, record_dir: str) -> str:
  """`path` as a record in `record_dir` stores it: relative when both are local paths."""
  if '://' in path:
    return path
  return os.path.relpath(os.path.abspath(path), os.path.abspath(record_dir))


def resolve(stored: str, record_dir: str) -> str:
  """The path a record in `record_dir` names (absolute records, from older runs, as they are)."""
  if '://' in stored or os.path.isabs(stored):
    return stored
  return os.path.normpath(os.path.join(record_dir, stored))


class RecordError(UserError):
  """A record file read back is not of the shape its reader expects."""


Types = Union[type, Tuple[type, ...]]
_NAMES = {bool: 'a boolean', int: 'an integer', float: 'a number', str: 'a string',
          dict: 'an object', list: 'a list', type(None): 'null'}


def _kind(value) -> str:
  return _NAMES.get(type(value), type(value).__name__)


def _fits(value, types: Types) -> bool:
  types = types if isinstance(types, tuple) else (types,)
  if isinstance(value, bool):  # a JSON true is no number
    return bool in types
  if float in types and isinstance(value, int):
    return True
  return isinstance(value, types)


def check_record(record, fields: Mapping[str, Types], path: str, what: str,
                 optional: Mapping[str, Types] = None) -> dict:
  """`record` (parsed JSON) if it is an object whose `fields` (name -> type or types) are there
  with those types, and whose `optional` fields, where present, too; `RecordError` otherwise."""
  if not isinstance(record, dict):
    raise RecordError(f'{path} ({what}): {_kind(record)}, not a JSON object')
  for name in fields:
    if name not in record:
      raise RecordError(f'{path} ({what}): its field {name!r} is missing')
  for name, types in dict(fields, **(optional or {})).items():
    if name in record and not _fits(record[name], types):
      raise RecordError(f'{path} ({what}): its field {name!r} is {_kind(record[name])} '
                        f'({json.dumps(record[name])[:40]}), not '
                        + ' or '.join(_NAMES.get(t, t.__name__) for t in
                                      (types if isinstance(types, tuple) else (types,))))
  return record


def read_record(path: str, fields: Mapping[str, Types], what: str,
                optional: Mapping[str, Types] = None) -> dict:
  """The JSON object in the file `path`, checked by `check_record`; `RecordError` (one line naming
  `path` and what is wrong) when it is not JSON or not of that shape. `what` names the record
  ('run record best.json'). A missing file raises FileNotFoundError, as `open` does."""
  try:
    with open(path, 'rb') as f:
      data = f.read()
  except IsADirectoryError:
    raise RecordError(f'{path} ({what}): a directory') from None
  try:
    record = json.loads(data.decode('utf-8'))
  except UnicodeDecodeError as e:
    raise RecordError(f'{path} ({what}): not UTF-8 text (byte {e.start})') from None
  except ValueError as e:
    reason = 'empty' if not data.strip() else f'not JSON ({e})'
    raise RecordError(f'{path} ({what}): {reason}') from None
  return check_record(record, fields, path, what, optional)


def optional_record(path: str, fields: Mapping[str, Types], what: str,
                    optional: Mapping[str, Types] = None) -> Optional[dict]:
  """`read_record`, or None when there is no file at `path`."""
  try:
    return read_record(path, fields, what, optional)
  except FileNotFoundError:
    return None
