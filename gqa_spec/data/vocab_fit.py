"""Whether a task's vocabulary fits a model: every token id the task can produce must have an
embedding row, or the model reads ids past its table (JAX clamps them) and scores nonsense.

  check(task_vocab_sizes('ddtp_summarize'), config.vocab_size, 'the model')

TensorFlow is imported only for registered seqio tasks; exported ones (`exported:DIR/TASK`) read
their SentencePiece model alone.
"""

from __future__ import annotations

from typing import Dict, Mapping

from gqa_spec.data import exported
from gqa_spec.errors import UserError


def task_vocab_sizes(name: str) -> Dict[str, int]:
  """Task name -> its vocabulary's size (pieces + extra ids), for a task or each of a mixture's.

  Raises:
    UserError: an unknown task or mixture (the message lists the known ones).
  """
  if exported.is_exported(name):
    tasks, _ = exported.resolve(name)
    return {t.name: t.vocabulary.vocab_size for t in tasks}
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow only for seqio tasks)
  from gqa_spec.data import tasks as registry  # pylint: disable=g-import-not-at-top
  registry.get(name)
  return {t.name: max(f.vocabulary.vocab_size for f in t.output_features.values())
          for t in seqio.get_subtasks(seqio.get_mixture_or_task(name))}


def check(vocab_sizes: Mapping[str, int], model_vocab_size: int, model: str) -> None:
  """Raises `UserError` naming both sizes when a task's vocabulary exceeds the model's.

  Args:
    vocab_sizes: task name -> vocabulary size (`task_vocab_sizes`).
    model_vocab_size: the model config's `vocab_size` (its embedding rows).
    model: what the model is, for the message (a checkpoint path, 'model_config').
  """
  for task, size in sorted(vocab_sizes.items()):
    if size > model_vocab_size:
      raise UserError(f'task {task} has a vocabulary of {size} ids, but {model} embeds only '
                      f'{model_vocab_size}: the model was trained for another vocabulary')
