"""The teacher-forced likelihood metric (`reproduce/likelihood.py`) and its unigram baseline."""

import jax
import numpy as np
import pytest

from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from gqa_spec.reproduce import bootstrap, likelihood
from gqa_spec.training.train_step import init_params


def test_statistics_from_logits_by_hand():
  # One example, vocab 3, two target tokens then padding.
  logits = np.log(np.array([[[0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]]))
  targets = np.array([[2, 2, 0]])
  stats = likelihood.statistics_from_logits(logits, targets)
  np.testing.assert_allclose(stats, [[np.log(0.3) + np.log(0.8), 2, 1]])  # argmax 1 then 2
  assert likelihood.loglik(stats) == pytest.approx((np.log(0.3) + np.log(0.8)) / 2)
  assert likelihood.token_accuracy(stats) == pytest.approx(50.0)


def test_model_statistics_equal_a_direct_computation_from_its_logits():
  config = T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                    num_encoder_layers=1, num_decoder_layers=1)
  params = init_params(config, jax.random.PRNGKey(0))
  lengths = {'inputs': 8, 'targets': 6}
  rng = np.random.default_rng(0)
  examples = []
  for n_in, n_tgt in ((5, 3), (8, 6), (2, 1), (7, 4), (3, 6)):  # 5 examples: batches of 2, last short
    examples.append({'inputs': np.append(rng.integers(2, 64, n_in - 1), 1).astype(np.int32),
                     'targets': np.append(rng.integers(2, 64, n_tgt - 1), 1).astype(np.int32)})
  stats = likelihood.model_statistics(config, params, examples, lengths, batch_size=2)
  assert stats.shape == (5, 3)
  from gqa_spec.data import features  # pylint: disable=g-import-not-at-top
  for ex, row in zip(examples, stats):
    f = features.unpacked_row(ex, lengths)
    logits = Transformer(config).apply({'params': params}, f['encoder_input_tokens'][None],
                                       f['decoder_input_tokens'][None],
                                       f['decoder_target_tokens'][None], enable_dropout=False)
    direct = likelihood.statistics_from_logits(np.asarray(logits), f['decoder_target_tokens'][None])
    np.testing.assert_allclose(row, direct[0], rtol=1e-4, atol=1e-4)
    assert row[1] == len(ex['targets'])  # every reference token, EOS included
  # a random model: about log(64) nats per token, never positive
  assert -2 * np.log(64) < likelihood.loglik(stats) < 0


def test_unigram_baseline_counts_the_training_targets_add_one():
  train = [[5, 5, 7, 1], [5, 1]]  # counts: 5 x3, 7 x1, 1 (EOS) x2; padding 0 never counted
  vocab = 8
  counts = np.ones(vocab)
  counts[5] += 3
  counts[7] += 1
  counts[1] += 2
  p = counts / counts.sum()
  examples = [{'targets': np.array([5, 7, 1, 0, 0])}, {'targets': np.array([3, 1])}]
  stats = likelihood.unigram_statistics(train, vocab, examples)
  np.testing.assert_allclose(stats[0], [np.log(p[5] * p[7] * p[1]), 3, 1])  # argmax is 5
  np.testing.assert_allclose(stats[1], [np.log(p[3] * p[1]), 2, 0])  # 3 unseen: add-one mass


def test_stored_statistics_rescore_in_the_bootstrap():
  stats = np.array([[-10.5, 5, 2], [-3.25, 1, 1], [-20.0, 8, 3]])
  columns = likelihood.encode(stats)
  for metric, expected in (('loglik', -33.75 / 14), ('token_acc', 100 * 6 / 14)):
    data = bootstrap.decode(metric, columns)
    np.testing.assert_allclose(data, stats)
    assert bootstrap.score(metric, data) == pytest.approx(expected)
    assert bootstrap.score(metric, data, np.array([1, 1])) == pytest.approx(
        -3.25 if metric == 'loglik' else 100.0)  # a resample: ratio of the resampled sums
  with pytest.raises(ValueError, match='lack columns'):
    likelihood.decode({'logp': '1 2'})


def test_exported_tasks_give_the_evaluated_examples_and_training_targets(tiny_gpu_export):
  """Without TensorFlow (`--exported`): the test examples are the exported task's, trimmed to the
  evaluation lengths with EOS kept, and the unigram baseline's training targets are its train
  split's token sequences."""
  import os  # pylint: disable=g-import-not-at-top
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  from gqa_spec.reproduce import baselines, presets  # pylint: disable=g-import-not-at-top
  name = 'exported:' + os.path.join(tiny_gpu_export, presets.TRANSLATE)
  lengths = {'inputs': 16, 'targets': 8}
  examples = likelihood.token_examples(name, 'test', lengths, 5)
  (task,), _ = exported.resolve(name)
  assert len(examples) == min(5, task.num_examples('test'))
  for i, ex in enumerate(examples):
    np.testing.assert_array_equal(ex['targets'], task.example('test', i, lengths)['targets'])
    assert len(ex['targets']) <= 8 and ex['targets'][-1] == 1  # EOS kept after trimming
  train = likelihood.train_target_tokens(name)
  assert len(train) == task.num_examples('train') and all(t[-1] == 1 for t in train)
  rows = baselines.likelihood_baselines({presets.TRANSLATE: (16, 8)}, 'test', 5, 512,
                                        source=lambda t: 'exported:' + os.path.join(
                                            tiny_gpu_export, t))
  (row,) = rows
  assert row['baseline'] == baselines.UNIGRAM and row['examples'] == len(examples)
  expected = likelihood.unigram_statistics(train, 512, examples)
  assert row['score'] == pytest.approx(likelihood.loglik(expected)) and row['score'] < 0
