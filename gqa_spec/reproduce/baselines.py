"""Table 1's trivial baselines: the scores a model has to clearly beat before it says anything.

  copy input          translation: the English source, unchanged, as the German output (BLEU
                      credits names, numbers and words the two languages share)
  first sentence      summarization: the input's first sentence
  first N words       summarization: the input's first N words, N the median word count of the
                      task's training targets (so the baseline never sees the test targets)

  unigram LM          the likelihood metrics (`likelihood.py`): every reference token scored by the
                      unigram distribution of the task's training target tokens (add-one
                      smoothed), its argmax the most frequent one

They are scored on exactly the examples the models are scored on (a `seqio.Evaluator` over the
same task, split, feature lengths and first `num_examples`, as `InferenceEvaluator` builds) with
the task's own metric functions (`gqa_spec.data.metrics`). The task prefix
(`translate English to German:`, `summarize:`) is removed from the input first; the input is not
truncated to the model's input length (a baseline reads the whole source, an advantage, if any).
"""

from __future__ import annotations

import re
import statistics
from typing import Dict, List, Mapping, Sequence, Tuple

from gqa_spec.errors import UserError

# The task prefixes of `gqa_spec.data.preprocessors` (removed before copying).
PREFIXES = ('translate English to German:', 'summarize:')
_SENTENCE_END = re.compile(r'(?<=[.!?])\s+')


def strip_prefix(text: str) -> str:
  """`text` without a known task prefix and surrounding whitespace."""
  text = text.strip()
  for prefix in PREFIXES:
    if text.startswith(prefix):
      return text[len(prefix):].strip()
  return text


def first_sentence(text: str) -> str:
  """Up to and including the first `.`, `!` or `?` followed by whitespace (or all of `text`);
  line breaks count as spaces."""
  text = ' '.join(text.split())
  return _SENTENCE_END.split(text, maxsplit=1)[0]


def first_words(text: str, n: int) -> str:
  """The first `n` whitespace-separated words of `text`."""
  if n < 1:
    raise UserError(f'first_words needs n >= 1, got {n}')
  return ' '.join(text.split()[:n])


def median_words(texts: Sequence[str]) -> int:
  """The median word count of `texts`, rounded (at least 1)."""
  if not texts:
    raise UserError('median_words of no texts')
  return max(1, round(statistics.median(len(t.split()) for t in texts)))


def predictions(kind: str, sources: Sequence[str], lead_words: int = 0) -> Dict[str, List[str]]:
  """The baselines' outputs for `sources` (prefix already removed), by baseline name.

  kind: 'translate' (copy input) or 'summarize' (first sentence, first `lead_words` words).
  """
  if kind == 'translate':
    return {'copy input': list(sources)}
  if kind == 'summarize':
    return {'first sentence': [first_sentence(s) for s in sources],
            f'first {lead_words} words': [first_words(s, lead_words) for s in sources]}
  raise UserError(f"baseline kind must be 'translate' or 'summarize', got {kind!r}")


def _decode(x) -> str:
  return x.decode('utf-8') if isinstance(x, bytes) else str(x)


def task_examples(task_name: str, split: str, lengths: Mapping[str, int],
                  num_examples: int) -> Tuple[List[str], List]:
  """`(sources without prefix, metric targets)` of the examples `InferenceEvaluator` scores (a
  seqio task, or an exported one: its stored texts, read without TensorFlow)."""
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if exported.is_exported(task_name):
    (task,), _ = exported.resolve(task_name)
    texts = task.texts(split)[:num_examples]
    return ([strip_prefix(t['inputs_pretokenized']) for t in texts],
            exported.targets(task, split, num_examples))
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow)
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  task = tasks.get(task_name)
  evaluator = seqio.Evaluator(task_name, feature_converter=seqio.EncDecFeatureConverter(pack=False),
                              eval_split=split, sequence_length=dict(lengths),
                              num_examples=num_examples, use_memory_cache=True,
                              async_compute_metrics=False)
  sources, targets = [], []
  for ex in evaluator.cached_task_datasets[task_name].as_numpy_iterator():
    sources.append(strip_prefix(_decode(ex['inputs_pretokenized'])))
    target = _decode(ex['targets_pretokenized'])
    if task.postprocess_fn is not None:
      target = task.postprocess_fn(target, example=ex, is_target=True)
    targets.append(target)
  return sources, targets


def _train_targets(task_name: str) -> List[str]:
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if exported.is_exported(task_name):
    (task,), _ = exported.resolve(task_name)
    return [t['targets_pretokenized'] for t in task.texts('train')]
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  ds = tasks.get(task_name).get_dataset(sequence_length=None, split='train', shuffle=False)
  return [_decode(ex['targets_pretokenized']) for ex in ds.as_numpy_iterator()]


def evaluate(task_metrics: Mapping[str, str], task_lengths: Mapping[str, Tuple[int, int]],
             split: str, num_examples: int, source=lambda name: name) -> List[dict]:
  """Rows `{task, baseline, label, metric, score, examples, per_example}` for every task of
  `task_metrics` (`per_example`: `bootstrap.encode`'s scores, in the models' example order, so the
  claims' baseline gate can pair them). `source`: the name a task is read by (`Context.task`).
  (`{task name: 'bleu' | 'rouge1'}`; a name containing 'translate' is a translation task)."""
  from gqa_spec.data import metrics  # pylint: disable=g-import-not-at-top
  from gqa_spec.reproduce import bootstrap  # pylint: disable=g-import-not-at-top
  rows = []
  for task_name, metric in task_metrics.items():
    inputs_len, targets_len = task_lengths[task_name]
    sources, targets = task_examples(source(task_name), split,
                                     {'inputs': inputs_len, 'targets': targets_len}, num_examples)
    if 'translate' in task_name:
      outputs = predictions('translate', sources)
    else:
      outputs = predictions('summarize', sources,
                            median_words(_train_targets(source(task_name))))
    fn = metrics.bleu if metric == 'bleu' else metrics.rouge
    for name, preds in outputs.items():
      rows.append({'task': task_name, 'baseline': name, 'label': name, 'metric': metric,
                   'score': float(fn(targets, preds)[metric]), 'examples': len(targets),
                   'per_example': bootstrap.encode(metric, targets, preds)})
  return rows


UNIGRAM = 'unigram LM'


def likelihood_baselines(task_lengths: Mapping[str, Tuple[int, int]], split: str,
                         num_examples: int, vocab_size: int,
                         source=lambda name: name) -> List[dict]:
  """Rows `{task, baseline, label, metric: 'loglik', score, examples, likelihood}` of the unigram
  language model of each task's training targets, on the references the models' likelihood is
  computed on (`likelihood.token_examples`: same split, lengths and first `num_examples`)."""
  from gqa_spec.reproduce import likelihood  # pylint: disable=g-import-not-at-top
  rows = []
  for task_name, (inputs_len, targets_len) in task_lengths.items():
    examples = likelihood.token_examples(source(task_name), split,
                                         {'inputs': inputs_len, 'targets': targets_len},
                                         num_examples)
    stats = likelihood.unigram_statistics(likelihood.train_target_tokens(source(task_name)),
                                          vocab_size, examples)
    record = likelihood.record(stats)
    rows.append({'task': task_name, 'baseline': UNIGRAM,
                 'label': 'unigram LM of the training targets', 'metric': 'loglik',
                 'score': record['loglik'], 'examples': len(examples), 'likelihood': record})
  return rows
