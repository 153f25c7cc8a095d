"""Whether a task's vocabulary fits a model: every token id the task can produce must have an
embedding row, or the model reads ids past its table (JAX clamps them) and scores nonsense.

  check({'ddtp_summarize': 8100}, config.vocab_size, 'the model')
  check({'spm.model': vocab.vocab_size}, config.vocab_size, 'model M', what='--vocab')

The callers know their tasks' vocabularies (seqio's or an export's); this module imports neither.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from gqa_spec.errors import UserError

EXTRA_IDS = 100  # the sentinels every task's SentencePiece vocabulary adds (`data.vocabulary`)


def check(vocab_sizes: Mapping[str, int], model_vocab_size: int, model: str,
          checkpoint: Optional[str] = None, what: str = 'task') -> None:
  """Raises `UserError` naming both sizes when a task's vocabulary exceeds the model's.

  Args:
    vocab_sizes: task name (or vocabulary file) -> vocabulary size (pieces + extra ids).
    model_vocab_size: the model config's `vocab_size` (its embedding rows).
    model: what the model is, for the message (a checkpoint path, 'model_config').
    checkpoint: the checkpoint the model comes from, if any: the message then names the data
      directory its run trained on (`data_hint`).
    what: what the keys of `vocab_sizes` are, for the message ('--vocab': a file given so; no
      data hint then).
  """
  for task, size in sorted(vocab_sizes.items()):
    if size > model_vocab_size:
      hint = '; ' + data_hint(checkpoint) if what == 'task' else ''
      raise UserError(f'{what} {task} has a vocabulary of {size} ids, but {model} embeds only '
                      f'{model_vocab_size}: the model was trained for another vocabulary{hint}')


def recorded_data_dir(checkpoint: Optional[str]) -> Optional[str]:
  """The DDTP data dir `checkpoint` was trained on, when it can be told; else None.

  A checkpoint carries its vocabulary (`vocab/sentencepiece.model`); the reproduction keeps its
  data beside its models (`<work dir>/data`, e.g. `runs/smoke/data`). The data dir is the nearest
  `data/` of an enclosing directory whose vocabulary is the checkpoint's, byte for byte.
  """
  if not checkpoint:
    return None
  own = os.path.join(checkpoint, 'vocab', 'sentencepiece.model')
  try:
    with open(own, 'rb') as f:
      vocab = f.read()
  except OSError:
    return None
  directory = os.path.abspath(checkpoint)
  while True:
    candidate = os.path.join(directory, 'data', 'sentencepiece.model')
    try:
      with open(candidate, 'rb') as f:
        if f.read() == vocab:
          return os.path.relpath(os.path.dirname(candidate))
    except OSError:
      pass
    parent = os.path.dirname(directory)
    if parent == directory:
      return None
    directory = parent


def data_hint(checkpoint: Optional[str]) -> str:
  """What to set so that a task's data and vocabulary are those `checkpoint` was trained on."""
  data_dir = recorded_data_dir(checkpoint)
  if data_dir is None:
    return ('point GQA_SPEC_DATA_DIR (its vocabulary: GQA_SPEC_VOCAB) at the data it was trained '
            'on (the smoke reproduction\'s: runs/smoke/data)')
  return (f'its run trained on {data_dir}: set GQA_SPEC_DATA_DIR={data_dir} (and leave '
          'GQA_SPEC_VOCAB unset, or set it to its sentencepiece.model)')
