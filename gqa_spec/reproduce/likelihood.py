"""Teacher-forced log-likelihood of the test references: the quality metric that resolves at small
scale.

BLEU and ROUGE score one greedy decode per example against one reference: at this study's scale
(models far below the papers' quality) most of the test set scores near zero either way, and a
difference between two models shows only where one of them crosses a word match. The likelihood
of the reference moves with every token of every example, so the same test set resolves smaller
differences. It is a proxy: the papers judge the decoded text, and a model can rank references
well and still decode poorly (or the reverse).

Per example, with the model's logits on the reference fed as decoder input (teacher forcing, no
dropout), over the reference's tokens (its EOS included, padding not):
  logp     sum of log p(token | inputs, reference prefix), in nats
  tokens   the number of reference tokens
  correct  how many of them are the model's argmax
Corpus statistics of any set of examples (a bootstrap resample, `bootstrap.score`):
  loglik     total logp / total tokens: nats per target token, higher is better (minus the
             cross-entropy the training loss reports)
  token_acc  100 x total correct / total tokens
The examples are the ones the decoding evaluation scores (the task's test split at the task's
feature lengths, the first `num_examples`, in order), so the statistics pair with BLEU/ROUGE's.

`unigram_statistics` is the trivial language-model baseline the claims gate on: every reference
token scored by the unigram distribution of the training targets' tokens (add-one smoothed over the
vocabulary), the argmax being the most frequent training token.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

COLUMNS = ('logp', 'tokens', 'correct')  # per-example statistics, in this order
LOGP_DECIMALS = 4


def statistics_from_logits(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
  """`[b, 3]` float64 (`COLUMNS`) of teacher-forced `logits` `[b, L, V]` on `targets` `[b, L]`
  (0 is padding)."""
  logits = np.asarray(logits, np.float64)
  targets = np.asarray(targets)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # [b, L, V]
  token_logp = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [b, L]
  mask = targets > 0
  correct = (logits.argmax(axis=-1) == targets) & mask
  return np.stack([(token_logp * mask).sum(axis=1), mask.sum(axis=1), correct.sum(axis=1)],
                  axis=1).astype(np.float64)


@functools.lru_cache(maxsize=None)
def _statistics_fn(config):
  """The jitted teacher-forced statistics of one model config (one per config, so the evaluate
  stage's models of equal shape share its compiled programs)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top

  model = Transformer(config)

  @jax.jit
  def stats(params, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens):
    logits = model.apply({'params': params}, encoder_input_tokens, decoder_input_tokens,
                         decoder_target_tokens, enable_dropout=False).astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # [b, L, V]
    token_logp = jnp.take_along_axis(log_probs, decoder_target_tokens[..., None], axis=-1)[..., 0]
    mask = decoder_target_tokens > 0
    correct = (jnp.argmax(logits, axis=-1) == decoder_target_tokens) & mask
    return jnp.stack([jnp.sum(jnp.where(mask, token_logp, 0.0), axis=1),
                      jnp.sum(mask, axis=1).astype(jnp.float32),
                      jnp.sum(correct, axis=1).astype(jnp.float32)], axis=1)  # [b, 3]

  return stats


def _batched_statistics(config, params, rows: Sequence[Mapping[str, np.ndarray]],
                        batch_size: int) -> np.ndarray:
  """`[n, 3]` statistics of unpacked feature rows, `batch_size` at a time (the last batch padded
  with empty rows, so one program serves every batch)."""
  stats = _statistics_fn(config)
  keys = ('encoder_input_tokens', 'decoder_input_tokens', 'decoder_target_tokens')
  out = []
  for start in range(0, len(rows), batch_size):
    chunk = list(rows[start:start + batch_size])
    real = len(chunk)
    chunk += [{k: np.zeros_like(chunk[0][k]) for k in keys}] * (batch_size - real)
    batch = {k: np.stack([r[k] for r in chunk]) for k in keys}
    out.append(np.asarray(stats(params, *(batch[k] for k in keys)), np.float64)[:real])
  return np.concatenate(out) if out else np.zeros((0, len(COLUMNS)))


def token_examples(task_name: str, split: str, lengths: Mapping[str, int],
                   num_examples: Optional[int]) -> List[Dict[str, np.ndarray]]:
  """`{'inputs', 'targets'}` token arrays (trimmed to `lengths`, EOS kept) of the examples the
  decoding evaluation scores: a seqio task's or an exported one's (no TensorFlow)."""
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if exported.is_exported(task_name):
    (task,), _ = exported.resolve(task_name)
    task.check(split, lengths)
    n = task.num_examples(split)
    n = n if num_examples is None else min(n, num_examples)
    return [task.example(split, i, lengths) for i in range(n)]
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow)
  evaluator = seqio.Evaluator(task_name, feature_converter=seqio.EncDecFeatureConverter(pack=False),
                              eval_split=split, sequence_length=dict(lengths),
                              num_examples=num_examples, use_memory_cache=True,
                              async_compute_metrics=False)
  return [{'inputs': np.asarray(ex['inputs'], np.int32),
           'targets': np.asarray(ex['targets'], np.int32)}
          for ex in evaluator.cached_task_datasets[task_name].as_numpy_iterator()]


def model_statistics(config, params, examples: Sequence[Mapping[str, np.ndarray]],
                     lengths: Mapping[str, int], batch_size: int) -> np.ndarray:
  """`[n, 3]` teacher-forced statistics of `params` on `examples` (`token_examples`)."""
  from gqa_spec.data import features  # pylint: disable=g-import-not-at-top
  rows = [features.unpacked_row(ex, lengths) for ex in examples]
  return _batched_statistics(config, params, rows, batch_size)


def checkpoint_statistics(checkpoint_path: str, task_name: str, split: str,
                          lengths: Mapping[str, int], num_examples: Optional[int],
                          batch_size: int) -> np.ndarray:
  """`model_statistics` of a training run's chosen checkpoint (as `evaluate_checkpoint` loads it)."""
  from gqa_spec.checkpoints.load import load_any  # pylint: disable=g-import-not-at-top
  config, params, _ = load_any(checkpoint_path, model=True)
  return model_statistics(config, params, token_examples(task_name, split, lengths, num_examples),
                          lengths, batch_size)


def unigram_statistics(train_targets: Iterable[Sequence[int]], vocab_size: int,
                       examples: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
  """`[n, 3]` statistics of the add-one-smoothed unigram model of `train_targets` (token id
  sequences, EOS included) on `examples`' targets."""
  counts = np.ones(vocab_size, np.float64)
  for seq in train_targets:
    seq = np.asarray(seq, np.int64)
    counts += np.bincount(seq[seq > 0], minlength=vocab_size)[:vocab_size]
  log_probs = np.log(counts / counts.sum())  # [V]
  best = int(np.argmax(counts))
  rows = []
  for ex in examples:
    t = np.asarray(ex['targets'], np.int64)
    t = t[t > 0]
    rows.append([float(log_probs[t].sum()), len(t), int(np.sum(t == best))])
  return np.array(rows, np.float64).reshape(len(rows), len(COLUMNS))


def train_target_tokens(task_name: str) -> List[np.ndarray]:
  """The token ids (EOS included, untrimmed) of every training target of a seqio or exported task."""
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if exported.is_exported(task_name):
    (task,), _ = exported.resolve(task_name)
    tokens, offsets = task._arrays('train', 'targets')  # pylint: disable=protected-access
    return [np.asarray(tokens[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)]
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  ds = tasks.get(task_name).get_dataset(sequence_length=None, split='train', shuffle=False)
  return [np.asarray(ex['targets']) for ex in ds.as_numpy_iterator()]


# ---------------------------------------------------------------------------------------------
# Stored form (stage JSON) and corpus statistics.


def encode(stats: np.ndarray) -> Dict[str, str]:
  """`{column: 'v1 v2 ...'}` of `[n, 3]` statistics (logp to `LOGP_DECIMALS` decimals)."""
  stats = np.asarray(stats, np.float64).reshape(-1, len(COLUMNS))
  return {'logp': ' '.join(f'{x:.{LOGP_DECIMALS}f}' for x in stats[:, 0]),
          'tokens': ' '.join(str(int(x)) for x in stats[:, 1]),
          'correct': ' '.join(str(int(x)) for x in stats[:, 2])}


def decode(columns: Mapping[str, str]) -> np.ndarray:
  """`[n, 3]` float64 statistics of `encode`'s columns."""
  missing = [c for c in COLUMNS if c not in columns]
  if missing:
    raise ValueError(f'per-example likelihood statistics lack columns {missing}')
  cols = [np.array(columns[c].split(), np.float64) for c in COLUMNS]
  if len({len(c) for c in cols}) != 1:
    raise ValueError('per-example likelihood columns differ in length')
  return np.stack(cols, axis=1)


def loglik(stats: np.ndarray) -> float:
  """Nats per target token: total logp / total tokens."""
  total = np.asarray(stats, np.float64).sum(axis=0)
  return float(total[0] / total[1]) if total[1] else 0.0


def token_accuracy(stats: np.ndarray) -> float:
  """100 x total correct / total tokens."""
  total = np.asarray(stats, np.float64).sum(axis=0)
  return float(100.0 * total[2] / total[1]) if total[1] else 0.0


def record(stats: np.ndarray) -> Dict[str, Any]:
  """The evaluate stage's `likelihood` entry of a model or baseline row."""
  return {'loglik': loglik(stats), 'token_acc': token_accuracy(stats),
          'tokens': int(np.asarray(stats).sum(axis=0)[1]) if len(stats) else 0,
          'per_example': encode(stats)}
