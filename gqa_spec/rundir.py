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
"""

from __future__ import annotations

import os

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
