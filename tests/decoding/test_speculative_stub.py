"""Speculative sampling on fixed probability tables (t5x-style stubs): exact distributions, stats.

Target and draft are `TableDecoder`s whose next-token logits depend on (position, current token),
so the exact target distribution of the first three tokens is a product of three table rows.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from gqa_spec.decoding import sampling, speculative
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import cache_length
from tests.decoding.conftest import TableDecoder

V = 6
NO_EOS = 99  # never generated: every row runs to max_decode_len
N = 40_000  # samples, decoded as one jitted batch
P_VALUE_THRESHOLD = 1e-3  # fixed seeds: a deterministic test; fails only for a real bias

TARGET = TableDecoder()
DRAFT = ModelDraft(TableDecoder())


def _tables(seed=0):
  rng = np.random.RandomState(seed)
  p = rng.normal(size=(3, V, V)) * 1.5  # [position, current token, next-token logits]
  q = p + rng.normal(size=(3, V, V)) * 1.5  # a correlated but different draft
  return p.astype(np.float32), q.astype(np.float32)


def _exact_first_three(table, config):
  probs = np.asarray(sampling.adjust_logits(jnp.asarray(table), config))  # [3, V, V]
  exact = np.zeros((V, V, V))
  for a, b, c in itertools.product(range(V), repeat=3):
    exact[a, b, c] = probs[0, 0, a] * probs[1, a, b] * probs[2, b, c]
  return exact


def _empirical(seqs):
  counts = np.zeros((V, V, V))
  np.add.at(counts, (seqs[:, 1], seqs[:, 2], seqs[:, 3]), 1)
  return counts


def _chisquare(counts, expected_probs):
  expected = expected_probs.ravel() / expected_probs.sum() * counts.sum()  # float32 rounding
  observed = counts.ravel()
  assert observed[expected == 0].sum() == 0, 'a token with target probability 0 was emitted'
  big = expected >= 5
  obs = np.append(observed[big], observed[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  return stats.chisquare(obs, exp).pvalue


def _run(p_table, q_table, config, gamma, max_len=3, batch=N, seed=0):
  ts = TARGET.init(p_table, batch, cache_length(max_len, gamma + 1))
  ds = TableDecoder().init(q_table, batch, max_len + gamma + 2)
  return speculative.decode(TARGET, ts, DRAFT, ds, jax.random.PRNGKey(seed), gamma=gamma,
                            max_decode_len=max_len, config=config, eos_id=NO_EOS)


@pytest.mark.parametrize('config, gamma', [
    (SamplingConfig(temperature=1.0), 2),
    (SamplingConfig(temperature=0.7, top_k=3), 2),
    (SamplingConfig(temperature=1.0, top_p=0.8), 1),
])
def test_first_three_tokens_follow_the_target_distribution(config, gamma):
  p, q = _tables()
  result = _run(p, q, config, gamma)
  seqs = np.asarray(result.sequences)
  assert (np.asarray(result.lengths) == 3).all()
  summary = speculative.summarize(result)
  assert 0.05 < summary['acceptance_rate'] < 0.95  # rejection, correction and bonus all exercised
  assert _chisquare(_empirical(seqs), _exact_first_three(p, config)) > P_VALUE_THRESHOLD


def test_lenience_bounds_every_token_by_p_over_l():
  lenience = 0.5
  p_logits = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.04, 0.01], np.float32))
  q_logits = np.log(np.array([0.1, 0.1, 0.1, 0.1, 0.1, 0.5], np.float32))  # loves token 5
  p_table = np.broadcast_to(p_logits, (3, V, V)).copy()
  q_table = np.broadcast_to(q_logits, (3, V, V)).copy()
  config = SamplingConfig(temperature=1.0, lenience=lenience)
  seqs = np.asarray(_run(p_table, q_table, config, gamma=1, max_len=1).sequences)
  freq = np.bincount(seqs[:, 1], minlength=V) / N
  p, q = np.exp(p_logits.astype(np.float64)), np.exp(q_logits.astype(np.float64))
  sigma = np.sqrt(p / lenience * (1 - p / lenience) / N)
  assert (freq <= p / lenience + 4 * sigma).all()
  assert freq[5] > 1.5 * p[5]  # lenience does change the distribution (token 5: up to 2x)
  # Exactly: accept x w.p. min(q, p / l); else resample from norm(max(0, p - q)).
  beta = np.minimum(q, p / lenience).sum()
  expected = np.minimum(q, p / lenience) + (1 - beta) * np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()
  pvalue = stats.chisquare(np.bincount(seqs[:, 1], minlength=V), expected / expected.sum() * N).pvalue
  assert pvalue > P_VALUE_THRESHOLD


@pytest.mark.parametrize('config', [SamplingConfig(temperature=1.0), sampling.GREEDY])
@pytest.mark.parametrize('gamma', [1, 3])
def test_draft_equal_to_target_is_always_accepted(config, gamma):
  p, _ = _tables()
  max_len = 3 * (gamma + 1)
  result = _run(p, p, config, gamma, max_len=max_len, batch=64)
  summary = speculative.summarize(result)
  assert summary['acceptance_rate'] == 1.0
  assert summary['mean_tokens_per_call'] == gamma + 1
  assert summary['accepted_per_position'] == [3 * 64] * gamma


def _chain_table(pairs, size=5):
  t = np.full((1, size, size), -10.0, np.float32)
  for a, b in pairs:
    t[0, a, b] = 0.0
  return t


def test_statistics_match_a_hand_computed_greedy_case():
  # Target: start -> 2 -> 3 -> 4 -> EOS(1). Draft: start -> 2 -> 3 -> 2, 4 -> 1 -> 1.
  target = _chain_table([(0, 2), (2, 3), (3, 4), (4, 1), (1, 1)])
  draft = _chain_table([(0, 2), (2, 3), (3, 2), (4, 1), (1, 1)])
  ts = TARGET.init(target, 1, 32)
  ds = TableDecoder().init(draft, 1, 32)
  result = speculative.decode(TARGET, ts, DRAFT, ds, jax.random.PRNGKey(0), gamma=3,
                              max_decode_len=10)
  # Iteration 1 proposes 2, 3, 2: accepts 2 and corrects to 4. Iteration 2 proposes 1, 1, 1:
  # accepts all three, EOS ends the row after its first token.
  assert np.asarray(result.sequences)[0, :6].tolist() == [0, 2, 3, 4, 1, 0]
  s = speculative.summarize(result)
  assert (s['tokens'], s['target_calls'], s['proposed'], s['accepted']) == (4, 2, 6, 5)
  assert s['accepted_per_position'] == [2, 2, 1]
  assert s['accept_histogram'] == [0, 0, 1, 1]
  assert s['mean_tokens_per_call'] == 2.0
  assert s['alpha'] == pytest.approx(5 / 6)


def test_greedy_lenience_accepts_near_argmax_tokens():
  # p(next) = [.5, .3, .2] over tokens 2..4 after every token; the draft always proposes 3.
  logits = np.full((1, 5, 5), -30.0, np.float32)
  logits[0, :, 2:] = np.log([0.5, 0.3, 0.2])
  draft = _chain_table([(a, 3) for a in range(5)])
  ts = TARGET.init(logits, 1, 16)
  for lenience, accepted in [(1.0, 0), (0.7, 0), (0.5, 4)]:
    ds = TableDecoder().init(draft, 1, 16)
    result = speculative.decode(TARGET, ts, DRAFT, ds, jax.random.PRNGKey(0), gamma=4,
                                max_decode_len=5, config=SamplingConfig(lenience=lenience),
                                eos_id=NO_EOS)
    # p(3) = .3 >= l * .5 iff l <= .6
    assert int(result.accepted[0]) == accepted, lenience
