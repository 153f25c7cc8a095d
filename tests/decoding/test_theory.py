"""Leviathan et al.'s formulas against hand values and a Monte-Carlo check of Eq. 1."""

import numpy as np
import pytest

from gqa_spec.decoding import theory
from tests.decoding.conftest import batch_lengths


def test_closed_forms_match_the_paper():
  # Eq. 1 / Figure 2 style values.
  assert theory.expected_tokens(0.0, 5) == 1.0
  assert theory.expected_tokens(1.0, 5) == 6.0
  assert theory.expected_tokens(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)
  # Corollary 9: gamma = 1 gives (1 + alpha) / (1 + c).
  assert theory.walltime_improvement(0.6, 1, 0.2) == pytest.approx(1.6 / 1.2)
  # Sec. A.5: T5-XXL / T5-small, alpha = 0.75 (greedy, l = 1), c = 0.015, gamma = 8 -> ~3.3X.
  assert theory.walltime_improvement(0.75, 8, 0.015) == pytest.approx(3.3, abs=0.1)
  # Verification costing more than one step lowers the prediction; c may depend on gamma.
  assert theory.walltime_improvement(0.8, 4, 0.05, lambda g: 1 + 0.1 * g) < \
      theory.walltime_improvement(0.8, 4, 0.05)


def test_optimal_gamma():
  for a, c in [(0.6, 0.05), (0.8, 0.02), (0.9, 0.1)]:
    best = theory.optimal_gamma(a, c)
    values = [theory.walltime_improvement(a, g, c) for g in range(1, 65)]
    assert best == 1 + int(np.argmax(values))
  assert theory.optimal_gamma(0.9, 0.01) > theory.optimal_gamma(0.5, 0.01)
  assert theory.optimal_gamma(0.8, 0.02, verify_ratio=lambda g: 1 + 0.3 * g) < \
      theory.optimal_gamma(0.8, 0.02)


def test_eq1_matches_simulation():
  rng = np.random.RandomState(0)
  a, gamma = 0.7, 4
  accepted = np.cumprod(rng.rand(200_000, gamma) < a, axis=1).sum(axis=1)
  assert np.mean(accepted + 1) == pytest.approx(theory.expected_tokens(a, gamma), rel=0.01)


def _batch_iterations(alpha, gamma, lengths, rng, reps=4000):
  """Simulated iterations of a batch whose rows need `lengths` tokens (every row's acceptances
  independent at `alpha`, `gamma` proposed a call), mean over `reps` batches."""
  lengths = np.asarray(lengths, np.float64)[None]  # [1, rows]
  done = np.zeros((reps, lengths.shape[1]))
  calls = np.zeros((reps, lengths.shape[1]))
  while np.any(done < lengths):
    accepted = np.cumprod(rng.random((reps, lengths.shape[1], gamma)) < alpha,
                          axis=-1).sum(axis=-1)
    active = done < lengths
    done += active * (accepted + 1)
    calls += active
  return calls.max(axis=1).mean()


def test_batch_inflation_matches_simulated_batches():
  alphas = np.array([0.6, 0.85])
  assert np.all(theory.batch_inflation(alphas, 4, ()) == 1.0)  # not priced
  # rows of one length: 1 + o / l + E[max of n normals] sigma / sqrt(mu l), E[max of 8] = 1.4236
  # and of 2 1 / sqrt(pi) (tables of order statistics); one row: the overshoot o alone
  powers = alphas[:, None] ** np.arange(5)[None]  # [2, 5]
  mu = np.cumsum(powers, axis=1)
  ex2 = np.cumsum((2 * np.arange(5) + 1)[None] * powers, axis=1)
  sigma = np.sqrt(ex2 - mu * mu)
  for rows, z in ((1, 0.0), (2, 1 / np.sqrt(np.pi)), (8, 1.4236)):
    want = 1 + (ex2 - mu) / (2 * mu * 30.0) + z * sigma / np.sqrt(mu * 30.0)
    np.testing.assert_allclose(theory.batch_inflation(alphas, 4, batch_lengths(rows, 30.0)),
                               want, atol=2e-4)
  rng = np.random.default_rng(0)
  unequal = (18, 22, 24, 24, 25, 29, 32, 32)  # the widened smoke pair's first batch at batch 8
  for lengths in [(20,), (60,), (20,) * 8, (60,) * 8, unequal, (10, 40, 40, 45)]:
    inflation = theory.batch_inflation(alphas, 4, (lengths,))  # [2, 5]
    assert np.all(inflation[:, 0] == 1.0)  # one token an iteration: exactly the longest row's
    for i, a in enumerate(alphas):
      for gamma in (1, 2, 4):
        want = _batch_iterations(a, gamma, lengths, rng) / (
            max(lengths) / theory.expected_tokens(a, gamma))
        # within 5% of simulated batches (measured: -2.6% to +0.3%)
        assert inflation[i, gamma] == pytest.approx(want, rel=0.05), (lengths, a, gamma)
        assert len(lengths) < 8 or want > 1.02  # 8 rows wait for each other
  # several batches: their iterations over their longest rows' Eq. 1, summed
  two = theory.batch_inflation(alphas, 4, ((20,) * 8, (60,) * 8))
  one = [theory.batch_inflation(alphas, 4, ((n,) * 8,)) for n in (20, 60)]
  np.testing.assert_allclose(two, (one[0] * 20 + one[1] * 60) / 80, rtol=1e-9)
