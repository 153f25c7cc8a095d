"""The papers' metrics as seqio metric functions: `fn(targets, predictions) -> {name: value}`.

  rouge(targets, predictions)        ROUGE-1/2/Lsum F-measure x 100 (rouge-score, as T5)
  bleu(targets, predictions)         corpus sacreBLEU, T5's settings (intl tokenisation, exp smoothing)
  trivia_qa(targets, predictions)    EM and F1 x 100, max over each question's aliases, SQuAD-normalised

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


def rouge(targets: Sequence[str], predictions: Sequence[str],
          rouge_types: Sequence[str] = ROUGE_TYPES) -> Dict[str, float]:
  """Mean ROUGE F-measure x 100 over the examples (no stemming, as T5)."""
  scorer = rouge_scorer.RougeScorer(list(rouge_types))
  scores = [scorer.score(_sentence_lines(t), _sentence_lines(p))
            for t, p in zip(targets, predictions)]
  return {key: 100.0 * float(np.mean([s[key].fmeasure for s in scores])) if scores else 0.0
          for key in rouge_types}


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


def normalize_squad(answer: str) -> str:
  """SQuAD's normalisation: lowercase, no punctuation, no articles, single spaces."""
  answer = answer.lower()
  answer = ''.join(ch for ch in answer if ch not in set(string.punctuation))
  answer = re.sub(r'\b(a|an|the)\b', ' ', answer)
  return ' '.join(answer.split())


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

  Args:
    targets: per question, its list of acceptable answers (the `answers` feature).
    predictions: the model's answers.
  """
  em, f1 = [], []
  for answers, prediction in zip(targets, predictions):
    answers = [normalize_squad(a) for a in answers]
    prediction = normalize_squad(prediction)
    em.append(max(float(a == prediction) for a in answers))
    f1.append(max(_f1(a, prediction) for a in answers))
  return {'em': 100.0 * float(np.mean(em)) if em else 0.0,
          'f1': 100.0 * float(np.mean(f1)) if f1 else 0.0}


def answers_postprocessor(output: str, example=None, is_target: bool = False):
  """seqio postprocess_fn for QA: a target becomes its example's `answers` list (all aliases)."""
  if is_target:
    return [a.decode('utf-8') if isinstance(a, bytes) else str(a) for a in example['answers']]
  return output
