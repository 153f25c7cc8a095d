"""Per-example test scores and the paired bootstrap over test examples.

The evaluate stage stores, per model and task, what the corpus metric needs per example
(`encode`): BLEU's sufficient statistics (lengths and n-gram matches, `metrics.BLEU_STATISTICS`)
or ROUGE-1 F. Any resample of the test set can then be re-scored exactly as the corpus metric
(`score`): BLEU from the summed statistics, ROUGE-1 as the mean. Stored compactly: one string of
space-separated numbers per column (ROUGE-1 to 4 decimals, i.e. within 1e-4 of the unrounded mean).
The teacher-forced likelihood metrics `loglik` and `token_acc` (`likelihood.py`) share one stored
form, per-example log-likelihood sums, token counts and correct tokens (`likelihood.encode`), and
re-score as ratios of sums the same way.

`paired_bootstrap` resamples test examples with replacement, the same indices for every model of
a task (paired), and reports the 95% percentile interval of a weighted sum of model scores
averaged over tasks (e.g. MQA - MHA). It covers the noise of which test examples were drawn; it
does not cover training noise (initialisation seeds, data order, dropout), which this study does
not repeat.
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence, Tuple

import numpy as np

from gqa_spec.data import metrics
from gqa_spec.reproduce import likelihood

LIKELIHOOD_METRICS = ('loglik', 'token_acc')  # nats per target token, token accuracy x 100

RESAMPLES = 1000
SEED = 0
ROUGE_DECIMALS = 4


def encode(metric: str, targets: Sequence[str], predictions: Sequence[str]) -> Dict[str, str]:
  """`{column: 'v1 v2 ...'}` per-example scores of `metric` ('bleu' or 'rouge1')."""
  if metric == 'bleu':
    stats = metrics.bleu_statistics(targets, predictions)  # [n, 10]
    return {name: ' '.join(str(int(x)) for x in stats[:, i])
            for i, name in enumerate(metrics.BLEU_STATISTICS)}
  if metric == 'rouge1':
    f = 100.0 * metrics.rouge_per_example(targets, predictions, ('rouge1',))['rouge1']  # [n]
    return {'rouge1': ' '.join(f'{x:.{ROUGE_DECIMALS}f}' for x in f)}
  raise ValueError(f'no per-example form of metric {metric!r} (bleu, rouge1)')


def decode(metric: str, columns: Mapping[str, str]) -> np.ndarray:
  """The stored scores: BLEU `[n, 10]` int64 statistics, ROUGE-1 `[n]` float64, the likelihood
  metrics' `[n, 3]` float64 statistics."""
  if metric in LIKELIHOOD_METRICS:
    return likelihood.decode(columns)
  if metric == 'bleu':
    missing = [c for c in metrics.BLEU_STATISTICS if c not in columns]
    if missing:
      raise ValueError(f'per-example BLEU statistics lack columns {missing}')
    cols = [np.array(columns[c].split(), np.int64) for c in metrics.BLEU_STATISTICS]
    return np.stack(cols, axis=1)  # [n, 10]
  if metric == 'rouge1':
    return np.array(columns['rouge1'].split(), np.float64)  # [n]
  raise ValueError(f'no per-example form of metric {metric!r} (bleu, rouge1, loglik, token_acc)')


def score(metric: str, data: np.ndarray, indices=None) -> float:
  """The corpus metric of the examples `indices` (default all) of decoded per-example `data`."""
  rows = data if indices is None else data[indices]
  if metric == 'bleu':
    return metrics.bleu_from_statistics(rows)
  if metric == 'loglik':
    return likelihood.loglik(rows)
  if metric == 'token_acc':
    return likelihood.token_accuracy(rows)
  return float(np.mean(rows)) if len(rows) else 0.0


def paired_bootstrap(tasks: Sequence[Tuple[str, Mapping[str, np.ndarray]]],
                     weights: Mapping[str, float], resamples: int = RESAMPLES,
                     seed: int = SEED) -> Tuple[float, float, float]:
  """`(point, low, high)`: sum_m weights[m] * score_m, averaged over tasks, and its 95% interval.

  Args:
    tasks: per task `(metric, {model: decoded per-example data})`; every model of `weights` must
      be present, all with the same examples.
    weights: model -> coefficient (e.g. `{'mqa': 1, 'mha': -1}` for MQA - MHA).
    resamples: bootstrap resamples.
    seed: the resampling seed (fixed: the interval is reproducible).
  """
  rng = np.random.default_rng(seed)
  point = 0.0
  samples = np.zeros(resamples)
  for metric, data in tasks:
    sizes = {len(data[m]) for m in weights}
    if len(sizes) != 1:
      raise ValueError(f'models of a paired comparison were scored on different test sets: sizes '
                       f'{sorted(sizes)}')
    n = sizes.pop()
    point += sum(w * score(metric, data[m]) for m, w in weights.items()) / len(tasks)
    for b in range(resamples):
      idx = rng.integers(0, n, n)
      samples[b] += sum(w * score(metric, data[m], idx) for m, w in weights.items()) / len(tasks)
  low, high = np.percentile(samples, [2.5, 97.5])
  return float(point), float(low), float(high)
