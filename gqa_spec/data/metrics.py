"""The papers' metrics as seqio metric functions: `fn(targets, predictions) -> {name: value}`.

  rouge(targets, predictions)        ROUGE-1/2/Lsum F-measure x 100 (rouge-score, as T5)
  bleu(targets, predictions)         corpus sacreBLEU, T5's settings (intl tokenisation, exp smoothing)
Per-example forms, for paired bootstrap over test examples (`gqa_spec.reproduce.bootstrap`):
  rouge_per_example(...)             each example's F-measure (`rouge` is 100 x their mean)
  bleu_statistics(...)               each example's n-gram matches/totals and lengths; the corpus BLEU
                                     of any subset (or resample) is `bleu_from_statistics` of its rows
  trivia_qa(targets, predictions)    EM and F1 x 100, max over each question's aliases, normalised as
                                     the official TriviaQA evaluation (`normalize_trivia_qa`)

Differences from T5: ROUGE is the plain mean over examples (T5 reports the bootstrap median, which is
random and within sampling noise of the mean).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Dict, Sequence

import numpy as np
import sacrebleu
from rouge_score import rouge_scorer

ROUGE_TYPES = ('rouge1', 'rouge2', 'rougeLsum')


def _sentence_lines(summary: str) -> str:
  # rougeLsum treats lines as sentences; T5 puts each ' . '-separated sentence on its own line.
  return summary.replace(' . ', ' .\n')


def rouge_per_example(targets: Sequence[str], predictions: Sequence[str],
                      rouge_types: Sequence[str] = ROUGE_TYPES) -> Dict[str, np.ndarray]:
  """Each example's ROUGE F-measure in [0, 1] (no stemming, as T5): `{type: [n] float64}`."""
  scorer = rouge_scorer.RougeScorer(list(rouge_types))
  scores = [scorer.score(_sentence_lines(t), _sentence_lines(p))
            for t, p in zip(targets, predictions)]
  return {key: np.array([s[key].fmeasure for s in scores], np.float64) for key in rouge_types}


def rouge(targets: Sequence[str], predictions: Sequence[str],
          rouge_types: Sequence[str] = ROUGE_TYPES) -> Dict[str, float]:
  """Mean ROUGE F-measure x 100 over the examples (no stemming, as T5)."""
  per_example = rouge_per_example(targets, predictions, rouge_types)
  return {key: 100.0 * float(np.mean(f)) if len(f) else 0.0 for key, f in per_example.items()}


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> Dict[str, float]:
  """Corpus BLEU with sacreBLEU, T5's settings; targets may be strings or lists of references."""
  if targets and isinstance(targets[0], (list, tuple)):
    references = [list(r) for r in zip(*targets)]
  else:
    references = [list(targets)]
  score = sacrebleu.corpus_bleu(list(predictions), references, smooth_method='exp',
                                smooth_value=0.0, force=False, lowercase=False, tokenize='intl',
                                use_effective_order=False)
  return {'bleu': score.score}


# Columns of `bleu_statistics`: hypothesis and reference lengths, then matched and total n-grams.
BLEU_STATISTICS = ('sys_len', 'ref_len', 'correct_1', 'correct_2', 'correct_3', 'correct_4',
                   'total_1', 'total_2', 'total_3', 'total_4')


def _bleu_metric():
  from sacrebleu.metrics import BLEU  # pylint: disable=g-import-not-at-top
  return BLEU(tokenize='intl', smooth_method='exp', lowercase=False, force=False,
              effective_order=False)


def bleu_statistics(targets: Sequence[str], predictions: Sequence[str]) -> np.ndarray:
  """Each example's BLEU sufficient statistics, `[n, 10]` int64 in `BLEU_STATISTICS` order.

  Corpus BLEU is a function of these statistics summed over the examples, so
  `bleu_from_statistics(stats)` equals `bleu(targets, predictions)['bleu']` and the BLEU of a
  bootstrap resample is `bleu_from_statistics(stats[indices])`. One reference per example.
  """
  if len(targets) != len(predictions):
    raise ValueError(f'{len(targets)} targets but {len(predictions)} predictions')
  metric = _bleu_metric()
  rows = []
  for target, prediction in zip(targets, predictions):
    s = metric.corpus_score([prediction], [[target]])
    rows.append([s.sys_len, s.ref_len, *s.counts, *s.totals])
  return np.array(rows, np.int64).reshape(len(rows), len(BLEU_STATISTICS))


def bleu_from_statistics(stats: np.ndarray) -> float:
  """Corpus BLEU (T5's settings, as `bleu`) of per-example statistics `[n, 10]`, summed."""
  total = np.asarray(stats, np.int64).sum(axis=0)  # [10]
  score = _bleu_metric().compute_bleu(
      correct=[int(x) for x in total[2:6]], total=[int(x) for x in total[6:10]],
      sys_len=int(total[0]), ref_len=int(total[1]), smooth_method='exp', effective_order=False)
  return float(score.score)


# Replaced by a space, not deleted, in TriviaQA's normalisation (the official evaluation's
# `handle_punc` and `replace_underscore`; T5's `qa_utils.normalize_trivia_qa`).
TRIVIA_QA_PUNCTUATION = frozenset(string.punctuation + '\u2018\u2019\u00b4`_')


def _remove_articles_and_spaces(answer: str) -> str:
  return ' '.join(re.sub(r'\b(a|an|the)\b', ' ', answer).split())


def normalize_squad(answer: str) -> str:
  """SQuAD's normalisation: lowercase, punctuation deleted, no articles, single spaces."""
  punctuation = set(string.punctuation)
  answer = ''.join(ch for ch in answer.lower() if ch not in punctuation)
  return _remove_articles_and_spaces(answer)


def normalize_trivia_qa(answer: str) -> str:
  """The official TriviaQA evaluation's normalisation (and T5's `normalize_trivia_qa`).

  Lowercase; ASCII punctuation and the characters ‘ ’ ´ ` _ each become a space (SQuAD deletes
  them, so 'u.s.' is 'u s' here and 'us' there); the articles a/an/the become spaces; runs of
  whitespace become one space, none at either end.
  """
  answer = ''.join(' ' if ch in TRIVIA_QA_PUNCTUATION else ch for ch in answer.lower())
  return _remove_articles_and_spaces(answer)


def _f1(target: str, prediction: str) -> float:
  target_tokens, prediction_tokens = target.split(), prediction.split()
  common = collections.Counter(target_tokens) & collections.Counter(prediction_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(prediction_tokens)
  recall = num_same / len(target_tokens)
  return 2 * precision * recall / (precision + recall)


def trivia_qa(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> Dict[str, float]:
  """Exact match and token F1 x 100, each the max over the question's answer aliases.

  As T5's `trivia_qa` metric and the official TriviaQA evaluation: every alias and the prediction
  go through `normalize_trivia_qa`, then EM and SQuAD's token F1 take the max over aliases.

  Args:
    targets: per question, its list of acceptable answers (the `answers` feature).
    predictions: the model's answers.
  """
  em, f1 = [], []
  for answers, prediction in zip(targets, predictions):
    answers = [normalize_trivia_qa(a) for a in answers]
    prediction = normalize_trivia_qa(prediction)
    em.append(max(float(a == prediction) for a in answers))
    f1.append(max(_f1(a, prediction) for a in answers))
  return {'em': 100.0 * float(np.mean(em)) if em else 0.0,
          'f1': 100.0 * float(np.mean(f1)) if f1 else 0.0}


def answers_postprocessor(output: str, example=None, is_target: bool = False):
  """seqio postprocess_fn for QA: a target becomes its example's `answers` list (all aliases)."""
  if is_target:
    return [a.decode('utf-8') if isinstance(a, bytes) else str(a) for a in example['answers']]
  return output
