"""Whether a task's vocabulary fits a model: every token id the task can produce must have an
embedding row, or the model reads ids past its table (JAX clamps them) and scores nonsense.

  check({'ddtp_summarize': 8100}, config.vocab_size, 'the model')
  check_vocabulary('--vocab spm.model', vocab.vocab_size, config.vocab_size, 'model M')

The callers know their tasks' vocabularies (seqio's or an export's); this module imports neither.
"""

from __future__ import annotations

from typing import Mapping

from gqa_spec.errors import UserError

EXTRA_IDS = 100  # the sentinels every task's SentencePiece vocabulary adds (`data.vocabulary`)


def check(vocab_sizes: Mapping[str, int], model_vocab_size: int, model: str) -> None:
  """Raises `UserError` naming both sizes when a task's vocabulary exceeds the model's.

  Args:
    vocab_sizes: task name -> vocabulary size (pieces + extra ids).
    model_vocab_size: the model config's `vocab_size` (its embedding rows).
    model: what the model is, for the message (a checkpoint path, 'model_config').
  """
  for task, size in sorted(vocab_sizes.items()):
    if size > model_vocab_size:
      raise UserError(f'task {task} has a vocabulary of {size} ids, but {model} embeds only '
                      f'{model_vocab_size}: the model was trained for another vocabulary')


def check_vocabulary(name: str, size: int, model_vocab_size: int, model: str) -> None:
  """`check` for a vocabulary the user names rather than a task's (`generate --vocab SPM`): raises
  `UserError` when its `size` ids (pieces + extra ids, as `data.vocabulary` builds it) exceed the
  model's embedding rows, as `eval` and `infer` refuse a task's.

  Args:
    name: the vocabulary as the user gave it, e.g. '--vocab spm.model'.
    size: its vocabulary size (pieces + extra ids).
    model_vocab_size: the model config's `vocab_size`.
    model: what the model is, for the message (a checkpoint path).
  """
  if size > model_vocab_size:
    raise UserError(f'{name} has a vocabulary of {size} ids, but {model} embeds only '
                    f'{model_vocab_size}: the model was trained for another vocabulary')
