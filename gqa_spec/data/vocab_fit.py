"""Whether a task's vocabulary fits a model: every token id the task can produce must have an
embedding row, or the model reads ids past its table (JAX clamps them) and scores nonsense.

  check({'ddtp_summarize': 8100}, config.vocab_size, 'the model')

The callers know their tasks' vocabularies (seqio's or an export's); this module imports neither.
"""

from __future__ import annotations

from typing import Mapping

from gqa_spec.errors import UserError

EXTRA_IDS = 100  # the sentinels every task's SentencePiece vocabulary adds (`data.vocabulary`)


def check(vocab_sizes: Mapping[str, int], model_vocab_size: int, model: str,
          what: str = 'task') -> None:
  """Raises `UserError` naming both sizes when a task's vocabulary exceeds the model's.

  Args:
    vocab_sizes: task name (or vocabulary file) -> vocabulary size (pieces + extra ids).
    model_vocab_size: the model config's `vocab_size` (its embedding rows).
    model: what the model is, for the message (a checkpoint path, 'model_config').
    what: what the keys of `vocab_sizes` are, for the message ('--vocab': a file given so).
  """
  for task, size in sorted(vocab_sizes.items()):
    if size > model_vocab_size:
      raise UserError(f'{what} {task} has a vocabulary of {size} ids, but {model} embeds only '
                      f'{model_vocab_size}: the model was trained for another vocabulary')
