"""The run directory: every file and folder name inside one, the RUNNING lock, and relative paths.

JAX-free (only the standard library), so `gqa-spec status` and any layer may import it. A run
directory is `trainer.train`'s model_dir; a reproduction's work dir holds many of them.

  <model_dir>/
    checkpoints/<step>/   orbax checkpoints (`CHECKPOINTS_DIR`, `checkpoints.manager`)
    vocab/sentencepiece.model  the task's vocabulary, carried into every checkpoint written from
                          the run, as in a native checkpoint (`VOCAB_FILE`)
    best/ + best.json     the best evaluation's native export and its record (`BEST_DIR`, `BEST_FILE`)
    train_log.jsonl       one JSON object per logged train/eval record (`TRAIN_LOG_FILE`)
    train/, eval/         TensorBoard event files
    RUNNING.json          the lock a writing process keeps (`RUNNING_FILE`, `running`)
    converted/            uptraining: the converted GQA/MQA starting point (`CONVERTED_DIR`)
      uptrain.json        its conversion record (`UPTRAIN_FILE`)
    draft.json            a draft run: kind, target, draft config (`DRAFT_FILE`)
    draft/                a model draft's native export (`DRAFT_EXPORT_DIR`)

"Still writing" comes from the lock file the trainer and `gqa-spec reproduce` keep while they run
(pid, host, start time; removed when they end, even by a signal): the process is alive when its pid
exists on this host. A lock left by a SIGKILL names a dead pid: "not running". From another host
only the lock's age can be told.

  with rundir.running(model_dir, total_steps=1000):
    ...  # train

Paths a record keeps to other run directories are stored relative to the record's own directory
(`relative_to` / `resolve`), so a copied or moved work dir resumes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Iterator

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


@contextlib.contextmanager
def running(directory: str, **info) -> Iterator[None]:
  """Marks `directory` as being written by this process for the duration of the block."""
  path = os.path.join(directory, RUNNING_FILE)
  with open(path, 'w') as f:
    json.dump(dict(info, pid=os.getpid(), host=socket.gethostname(), started=time.time()), f)
  try:
    yield
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)


def process_state(directory: str) -> str:
  """'running (pid N, ...)', 'not running', or what can be told of a lock from another host."""
  path = os.path.join(directory, RUNNING_FILE)
  try:
    with open(path) as f:
      lock = json.load(f)
  except (FileNotFoundError, json.JSONDecodeError):
    return 'not running'
  since = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(lock['started']))
  if lock['host'] != socket.gethostname():
    return f"a process on host {lock['host']} (pid {lock['pid']}) started writing at {since}"
  try:
    os.kill(lock['pid'], 0)
  except ProcessLookupError:
    return f"not running (pid {lock['pid']}, started {since}, ended without cleaning up: killed?)"
  except PermissionError:
    pass  # alive, another user's
  return f"running (pid {lock['pid']}, since {since})"


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
