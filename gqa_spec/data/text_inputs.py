"""Raw text -> a seqio task's model inputs: the task's own preprocessing (prefix, lowercasing, whatever
its preprocessors do before tokenizing), its tokenizer and its EOS, as for its own examples.

  ids = text_inputs.task_inputs('ddtp_translate_en_de', ['A strategy game.'])
  # = the ids of 'translate English to German: A strategy game.' + EOS
  text_inputs.vocab_file('ddtp_translate_en_de')  # its SentencePiece model file

The text fills every string feature of one of the task's source examples (its element spec, read from
the source, so the task's data must be reachable), then the task's preprocessors run up to and
including `seqio.preprocessors.tokenize`; `inputs` is the result. A task whose source features are
not plain strings (TriviaQA's answers, MediaSum's turns) or that makes no `inputs` before tokenizing
(span corruption) is refused.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from gqa_spec.errors import UserError


def vocab_file(name: str) -> Optional[str]:
  """The SentencePiece model of a task's targets (a mixture's first task's), which the trainer
  copies into its run directory and every checkpoint it writes; None when the vocabulary is not
  read from a file."""
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if exported.is_exported(name):
    return exported.resolve(name)[0][0].vocabulary.path
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow only for seqio tasks)
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  tasks.get(name)
  vocab = seqio.get_subtasks(seqio.get_mixture_or_task(name))[0].output_features['targets'].vocabulary
  return getattr(vocab, 'sentencepiece_model_file', None)


def task_inputs(name: str, texts: Sequence[str]) -> List[List[int]]:
  """The token ids (EOS appended when the task's `inputs` feature adds it) of each text."""
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow only when a task is named)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  task = tasks.get(name)
  if not isinstance(task, seqio.Task):
    raise UserError(f'--task {name} is a mixture; name one of its tasks')
  steps = list(task.preprocessors)
  if seqio.preprocessors.tokenize not in steps or 'inputs' not in task.output_features:
    raise UserError(f'--task {name} does not tokenize text inputs; give input_ids')
  steps = steps[:steps.index(seqio.preprocessors.tokenize) + 1]
  split = 'validation' if 'validation' in task.source.splits else task.source.splits[0]
  spec = task.source.get_dataset(split=split, shuffle=False).element_spec
  if not isinstance(spec, dict) or not all(
      isinstance(s, tf.TensorSpec) and s.dtype == tf.string and s.shape.rank == 0
      for s in spec.values()):
    raise UserError(f'--task {name}: its source examples are not plain text fields; give '
                    'input_ids')
  ds = tf.data.Dataset.from_tensor_slices(
      {k: tf.constant(list(texts), tf.string, shape=[len(texts)]) for k in spec})
  for step in steps:
    ds = seqio.utils.add_kwargs_to_transform(step, sequence_length=None,
                                             output_features=task.output_features)(ds)
  if 'inputs' not in ds.element_spec:
    raise UserError(f'--task {name} makes no inputs from text; give input_ids')
  feature = task.output_features['inputs']
  eos = [feature.vocabulary.eos_id] if feature.add_eos else []
  out = [[int(t) for t in ex['inputs']] + eos for ex in ds.as_numpy_iterator()]
  if len(out) != len(texts):
    raise UserError(f'--task {name}: its preprocessing kept {len(out)} of {len(texts)} inputs')
  return out
