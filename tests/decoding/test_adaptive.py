"""Adaptive draft lengths (`decoding/adaptive.py`): exact outputs whatever length each call used.

Greedy: tiny T5 target (GQA-2) and a perturbed copy as the draft on the ragged batch of 4, every
policy; the iterations use different draft lengths (0 included; per row for the heuristic), and the
output is greedy decoding's, token for token. Sampling: the table stubs of
`test_speculative_stub.py` (40k rows, one jitted batch), chi-square on the joint distribution of the
first three tokens.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import adaptive, autoregressive, cost_calibration, speculative, theory
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.drafts import CopyDraft, ModelDraft, NgramDraft
from gqa_spec.decoding.drafts.ngram import fit_ngram
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.errors import UserError
from tests.decoding.conftest import (FakeClock, INPUTS, MAX_LEN, TableDecoder, batch_lengths,
                                     model_and_params)
from tests.decoding.test_speculative_stub import (N, NO_EOS, P_VALUE_THRESHOLD, TARGET, _chisquare,
                                                  _empirical, _exact_first_three, _tables)
from tests.decoding.test_speculative_t5 import greedy_reference, perturbed_params

GAMMA_MAX = 4


def _greedy(adaptive_gamma, draft_kind='perturbed'):
  model, params = model_and_params(2)
  target = T5Decoder(model)
  enc = jnp.asarray(INPUTS)
  if draft_kind == 'perturbed':
    draft = ModelDraft.t5(model)
    dstate = draft.decoder.init(perturbed_params('gqa'), enc, MAX_LEN + GAMMA_MAX + 2)
  else:
    draft = CopyDraft(model.config.vocab_size)
    dstate = draft.init(enc)
  result = adaptive.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, adaptive_gamma.call_tokens)),
      draft, dstate, jax.random.PRNGKey(0), adaptive=adaptive_gamma, max_decode_len=MAX_LEN)
  ref_seqs, ref_lengths = greedy_reference('gqa', len(INPUTS))
  np.testing.assert_array_equal(np.asarray(result.lengths), ref_lengths)
  np.testing.assert_array_equal(np.asarray(result.sequences)[:, :MAX_LEN + 1], ref_seqs)
  summary = speculative.summarize(result)
  trace = summary['gamma_per_call_per_row']
  assert [len(t) for t in trace] == list(np.asarray(result.target_calls))
  np.testing.assert_array_equal(  # the histogram counts the trace
      summary['gamma_histogram_per_row'],
      [np.bincount(t, minlength=GAMMA_MAX + 1) for t in trace])
  assert summary['proposed'] == sum(map(sum, trace))
  return summary


def test_optimal_policy_is_one_length_for_the_batch_and_greedy_exact():
  summary = _greedy(AdaptiveGamma(gamma_max=GAMMA_MAX, cost_ratio=0.6, alpha_init=0.97))
  trace = summary['gamma_per_call_per_row']
  assert trace[0][0] == GAMMA_MAX  # alpha_init 0.97 at c = 0.6: Theorem 8's best is gamma_max
  # Iteration i is call i of every row still decoding (rows are active from the start): one draft
  # length for all of them at every iteration.
  iterations = max(map(len, trace))
  per_iteration = [{t[i] for t in trace if len(t) > i} for i in range(iterations)]
  assert all(len(g) == 1 for g in per_iteration), per_iteration
  gammas = [g.pop() for g in per_iteration]
  assert len(set(gammas) - {0}) >= 2  # the length moved with the rows' acceptance
  assert 0 in gammas and all(g == 0 for g in gammas[gammas.index(0):])  # 0 is final
  # The iterations at 0 ran as plain target steps, without the draft.
  plain = gammas.count(0)
  assert summary['draft_steps'] <= GAMMA_MAX * (summary['loop_iterations'] - plain)
  assert summary['draft_steps_saved'] >= GAMMA_MAX * plain


def _held(target, state, draft, dstate, ad, first, held=True, config=SamplingConfig()):
  """The optimal policy's own loop with every row starting at `first` (the calibration's timing
  runs): `held` True, its choice made every iteration and not taken."""
  return adaptive._speculative(  # pylint: disable=protected-access
      target, state, draft, dstate, jax.random.PRNGKey(0), adaptive=ad, max_decode_len=MAX_LEN,
      config=config, eos_id=autoregressive.EOS, skip=None,
      first_gammas=np.full((state_rows(target, state),), first, np.int32),
      held=np.asarray(held, bool))


def state_rows(target, state):
  return target.index(state).shape[0]


def test_a_held_optimal_loop_is_the_chain_loop_at_its_first_length():
  # The calibration times the optimal policy's own program held at each width: its choice is made
  # every iteration and not taken. Held at 2, every call of every row is at 2 and the result is
  # `speculative.decode`'s at gamma 2, token for token and acceptance for acceptance; the same
  # program not held (a traced False) moves, as the test above shows the policy does.
  model, params = model_and_params(2)
  target, enc = T5Decoder(model), jnp.asarray(INPUTS)
  draft = ModelDraft.t5(model)
  dstate = draft.decoder.init(perturbed_params('gqa'), enc, MAX_LEN + GAMMA_MAX + 2)
  state = target.init(params, enc, MAX_LEN + GAMMA_MAX + 1)
  optimal = AdaptiveGamma(gamma_max=GAMMA_MAX, cost_ratio=0.6, alpha_init=0.97)
  held = _held(target, state, draft, dstate, optimal, 2)
  chain = speculative.decode(target, state, draft, dstate, jax.random.PRNGKey(0), gamma=2,
                             max_decode_len=MAX_LEN)
  trace = speculative.summarize(held)['gamma_per_call_per_row']
  assert all(set(t) == {2} for t in trace), trace
  for field in ('lengths', 'target_calls', 'beta_sum', 'beta_count', 'accepted'):
    np.testing.assert_array_equal(np.asarray(getattr(held, field)),
                                  np.asarray(getattr(chain, field)), err_msg=field)
  ref_seqs, _ = greedy_reference('gqa', len(INPUTS))
  np.testing.assert_array_equal(np.asarray(held.sequences)[:, :MAX_LEN + 1], ref_seqs)
  moved = speculative.summarize(_held(target, state, draft, dstate, optimal, 2, held=False))
  assert any(set(t) != {2} for t in moved['gamma_per_call_per_row']), moved


def test_the_batch_length_is_theorem_8_at_the_slowest_active_row():
  ad = AdaptiveGamma(gamma_max=8, cost_ratio=0.1, verify_ratio=1.5)
  alpha = jnp.asarray([0.95, 0.6, 0.3, 0.9])
  own = np.asarray(theory.optimal_gammas(alpha, 0.1, 8, 1.5))  # each row's own Theorem 8 gamma
  assert own[0] > own[1] > own[2] == 0 and own[3] > own[1]  # measured: 8, 2, 0, 6
  # Many positions behind every row: the rows' spread is far beyond their noise, no shrinkage,
  # and no doubt about gamma 0.
  many = jnp.full((4,), 1e6)
  gamma = lambda active, w=many: int(adaptive.batch_gamma(alpha, w, jnp.asarray(active), ad))
  assert gamma([True, True, True, True]) == own[2] == 0  # the row accepting least decides
  assert gamma([True, True, False, True]) == own[1]  # a finished row has no say
  assert gamma([True, False, False, True]) == own[3]
  assert gamma([True, False, False, False]) == own[0]  # batch 1: the row's own gamma
  jitted = jax.jit(lambda a, w, m: adaptive.batch_gamma(a, w, m, ad))  # inside the loop: traced
  assert int(jitted(alpha, many, jnp.asarray([True, True, False, True]))) == own[1]
  # Gamma 0 is final: with few positions behind the row at 0.3 (its standard error ~0.2), the
  # batch does not leave speculation on it alone; it proposes Theorem 8's gamma at alpha + 1 SE.
  few = jnp.asarray([1e6, 1e6, 5.0, 1e6])
  estimate, se = adaptive.batch_alpha(alpha, few, jnp.asarray([False, False, True, False]))
  assert float(estimate) == pytest.approx(0.3) and float(se) == pytest.approx(
      np.sqrt(0.3 * 0.7 / 5), rel=1e-5)
  upper = int(theory.optimal_gammas(jnp.asarray([0.3 + float(se)]), 0.1, 8, 1.5)[0])
  assert upper > 0 and gamma([False, False, True, False], few) == upper
  low = jnp.asarray([0.05, 0.05, 0.05, 0.05])  # and leaves it when the upper value says 0 too
  assert int(adaptive.batch_gamma(low, jnp.full((4,), 20.0), jnp.ones((4,), bool), ad)) == 0


def test_the_batch_alpha_shrinks_noisy_rows_toward_the_pooled_alpha():
  """The lowest of 8 rows' running alphas, each over a few positions, reads the slowest row low;
  the batch's estimate (`batch_alpha`) shrinks each row toward the pooled alpha by how much of
  the rows' spread their noise explains. Statistical, fixed seed: 2000 batches of 8 rows with the
  same true acceptance 0.75, each row's estimate the ratio over 8 Bernoulli positions."""
  rng = np.random.default_rng(0)
  true, n, rows, trials = 0.75, 8, 8, 2000
  on = jnp.ones((rows,), bool)

  def lowest_of(alpha, weight):  # [trials, rows] -> [trials] the batch's estimate
    estimate = jax.vmap(lambda a: adaptive.batch_alpha(a, weight, on)[0])
    return np.asarray(jax.jit(estimate)(jnp.asarray(alpha, jnp.float32)))

  alpha = rng.binomial(n, true, size=(trials, rows)) / n  # [trials, rows]
  shrunk = lowest_of(alpha, jnp.full((rows,), float(n)))  # [trials]
  raw = alpha.min(axis=1)  # [trials] the plain minimum
  assert true - raw.mean() > 0.2  # measured: 0.23 below the truth
  assert abs(shrunk.mean() - true) < 0.06  # measured: 0.04 below
  # Rows that truly differ keep their own estimates: one row at 0.2 among rows at 0.9, each over
  # 200 positions (standard error 0.028), gives the batch's acceptance, its own estimate moved by
  # less than 0.02 in every trial (measured: at most 0.008).
  spread = np.where(np.arange(rows) == 3, 0.2, 0.9)  # [rows]
  alpha = rng.binomial(200, spread, size=(200, rows)) / 200  # [200, rows]
  lowest = lowest_of(alpha, jnp.full((rows,), 200.0))  # [200]
  assert np.all(np.abs(lowest - alpha[:, 3]) < 0.02), np.abs(lowest - alpha[:, 3]).max()


def test_heuristic_schedule_with_confidence_stop_is_greedy_exact():
  summary = _greedy(AdaptiveGamma(gamma_max=GAMMA_MAX, policy='heuristic', gamma_init=2,
                                  confidence=0.5))
  trace = summary['gamma_per_call_per_row']
  assert all(t[0] <= 2 for t in trace)
  assert len({g for t in trace for g in t}) >= 2
  assert min(g for t in trace for g in t) >= 1  # the heuristic never goes below 1
  # The confidence stop cut proposals below the schedule: fewer draft calls than the schedule's.
  assert 0 < summary['draft_steps'] < summary['loop_iterations'] * GAMMA_MAX


def test_draft_without_propose_upto_is_greedy_exact_and_refuses_confidence():
  ad = AdaptiveGamma(gamma_max=GAMMA_MAX, policy='heuristic')
  summary = _greedy(ad, draft_kind='copy')
  # A draft that cannot stop early proposes the iteration's verification width: the narrowest
  # compiled one holding the longest row's gamma (iteration i is call i of every row still going).
  trace = summary['gamma_per_call_per_row']
  longest = [max(t[i] for t in trace if len(t) > i) for i in range(max(map(len, trace)))]
  assert summary['loop_iterations'] == len(longest)
  widths = [adaptive.verify_width(g, ad.verify_widths) for g in longest]
  assert summary['draft_steps'] == sum(widths) < GAMMA_MAX * len(longest), (widths, summary)
  with pytest.raises(UserError, match='draft-confidence needs a model draft'):
    _greedy(AdaptiveGamma(gamma_max=GAMMA_MAX, confidence=0.5), draft_kind='copy')


@pytest.mark.parametrize('adaptive_gamma, config', [
    (AdaptiveGamma(gamma_max=3, cost_ratio=0.9, alpha_init=0.97, decay=0.3),
     SamplingConfig(temperature=1.0)),
    (AdaptiveGamma(gamma_max=3, policy='heuristic', gamma_init=1, confidence=0.35),
     SamplingConfig(temperature=0.7, top_k=3)),
])
def test_sampling_distribution_is_unchanged(adaptive_gamma, config):
  p, q = _tables()
  max_len = 3
  ts = TARGET.init(p, N, cache_length(max_len, adaptive_gamma.call_tokens))
  ds = TableDecoder().init(q, N, max_len + adaptive_gamma.gamma_max + 2)
  result = adaptive.decode(TARGET, ts, ModelDraft(TableDecoder()), ds, jax.random.PRNGKey(0),
                           adaptive=adaptive_gamma, max_decode_len=max_len, config=config,
                           eos_id=NO_EOS)
  assert (np.asarray(result.lengths) == max_len).all()
  histogram = np.asarray(result.gamma_histogram).sum(axis=0)  # [gamma_max + 1]
  assert np.count_nonzero(histogram) >= 2  # the rows used several draft lengths
  if adaptive_gamma.policy == 'optimal':
    assert histogram[0] > 0  # some rows took plain target steps
  summary = speculative.summarize(result)
  assert 0.05 < summary['acceptance_rate'] < 0.95
  seqs = np.asarray(result.sequences)
  assert _chisquare(_empirical(seqs), _exact_first_three(p, config)) > P_VALUE_THRESHOLD


def test_optimal_gammas_follow_theorem_8():
  alphas = np.array([0.05, 0.3, 0.6, 0.8, 0.95, 1.0], np.float32)
  for c in (0.0, 0.05, 0.3, 1.0):
    got = np.asarray(theory.optimal_gammas(jnp.asarray(alphas), c, 8))
    for a, g in zip(alphas, got):
      values = [theory.walltime_improvement(float(a), gamma, c) for gamma in range(9)]
      assert values[g] >= max(values) - 1e-5, (a, c, g)  # Theorem 8's best, 0 included
  got = np.asarray(theory.optimal_gammas(jnp.asarray(alphas), 0.3, 8))
  assert got[0] == got[1] == 0  # alpha <= c: speculation does not pay
  assert 0 < got[2] < got[3] <= got[4] <= got[5] == 8
  assert theory.optimal_gamma(0.8, 0.3, max_gamma=8) == got[3]
  # A verification call costing v = 3 steps (Theorem 8 generalised): speculation pays later.
  got = np.asarray(theory.optimal_gammas(jnp.asarray(alphas), 0.05, 8, verify_ratio=3.0))
  for a, g in zip(alphas, got):
    values = [1.0] + [theory.walltime_improvement(float(a), gamma, 0.05, 3.0)
                      for gamma in range(1, 9)]
    assert values[g] >= max(values) - 1e-5, (a, g)
  assert got[2] == 0 < got[4]  # alpha 0.6 does not pay for v = 3; alpha 0.95 does
  # v per gamma (a verification call growing with its width): each row's best under its own costs.
  v = (1.1, 1.3, 1.6, 2.0, 2.6, 3.2, 3.9, 4.6)
  got = np.asarray(theory.optimal_gammas(jnp.asarray(alphas), 0.05, 8, verify_ratio=v))
  for a, g in zip(alphas, got):
    values = [1.0] + [theory.walltime_improvement(float(a), gamma, 0.05, v[gamma - 1])
                      for gamma in range(1, 9)]
    assert values[g] >= max(values) - 1e-5, (a, g)
  assert got[0] == 0 < got[1] < got[5] < 8  # a growing v keeps even alpha = 1 below gamma_max
  # One v for every gamma (v(gamma_max) everywhere) would have turned alpha 0.3 and 0.6 off.
  flat = np.asarray(theory.optimal_gammas(jnp.asarray(alphas), 0.05, 8, verify_ratio=v[-1]))
  assert flat[1] == flat[2] == 0


def test_optimal_gammas_read_from_steps_equal_the_formula():
  """`theory.optimal_gammas` reads Theorem 8's gamma from steps made on the host
  (`optimal_gamma_steps`): on dense grids of alpha it equals the float64 formula everywhere but
  within float32 resolution of a step's edge, for scalar and per-gamma verification costs."""
  v_measured = (1.49, 1.58, 1.58, 1.58, 1.58, 1.58, 1.58, 1.58)  # an H200's held calibration
  v_growing = (1.1, 1.3, 1.6, 2.0, 2.6, 3.2, 3.9, 4.6)
  alphas = np.linspace(0.0, 1.0, 20001).astype(np.float32)
  for c, gmax, v in [(0.0, 8, v_measured), (0.05, 8, v_growing), (0.3, 8, 1.0), (0.9, 8, 1.6),
                     (0.05, 16, 1.2), (0.5, 4, 0.8), (2.0, 8, 1.5)]:
    edges, gammas = theory.optimal_gamma_steps(c, gmax, v)
    assert len(gammas) == len(edges) + 1 and np.all(np.diff(edges) > 0)
    vs = tuple(np.broadcast_to(np.asarray(v, np.float64), (gmax,)).tolist())
    want = theory._theorem8_gammas(alphas.astype(np.float64), c, gmax, vs)
    got = np.asarray(theory.optimal_gammas(jnp.asarray(alphas), c, gmax, v))
    near = np.any(np.abs(alphas[:, None] - edges[None]) <= 2 * np.spacing(np.float32(1)), axis=1)
    assert np.all((got == want) | near), (c, gmax, v)
    assert np.mean(near) < 0.01
  # ... and where the batch's wait for its slowest row is priced (its rows' output lengths)
  for lengths in [batch_lengths(8, 30.0), batch_lengths(4, 12.0),
                  batch_lengths(1, 40.0), ((18.0, 22.0, 25.0, 29.0, 32.0, 32.0),),
                  ((12.0,), (30.0,), (25.0,))]:
    edges, gammas = theory.optimal_gamma_steps(0.02, 8, v_measured, lengths)
    want = theory._theorem8_gammas(alphas.astype(np.float64), 0.02, 8, v_measured, lengths)
    got = np.asarray(theory.optimal_gammas(jnp.asarray(alphas), 0.02, 8, v_measured, lengths))
    near = np.any(np.abs(alphas[:, None] - edges[None]) <= 2 * np.spacing(np.float32(1)), axis=1)
    assert np.all((got == want) | near) and np.mean(near) < 0.01, lengths
  # the first gamma (a Python int, on the host) is the same function
  ad = AdaptiveGamma(gamma_max=8, cost_ratio=0.05, verify_ratio=v_growing, alpha_init=0.7)
  assert ad.first_gamma() == int(theory.optimal_gammas(jnp.asarray([0.7]), 0.05, 8, v_growing)[0])
  ad = dataclasses.replace(ad, lengths=batch_lengths(8, 20.0))
  assert ad.first_gamma() == int(theory.optimal_gammas(jnp.asarray([0.7]), 0.05, 8, v_growing,
                                                       batch_lengths(8, 20.0))[0])


def test_the_policy_prices_the_batchs_wait_for_its_slowest_row():
  # The widened smoke pair's 0.2-noise draft at batch 8, greedy (results/benchmarks/
  # adaptive_gamma_smoke_widened_confirmed): c 0.022, v as calibrated, alpha 0.62. Each row's own
  # Theorem 8 says gamma 1 pays (1.62 tokens for 1.56 steps); the batch of 8 rows of ~30 tokens
  # waits ~11% longer than that for its slowest row, and ran at 0.90x greedy decoding there: with
  # the batch priced, the policy does not speculate. At batch 1 only the last call's overshoot
  # is priced (~1%), and it still speculates.
  v = (1.54, 2.03, 2.55, 2.89, 4.36, 4.36, 4.98, 4.98)
  per_row = AdaptiveGamma(gamma_max=8, cost_ratio=0.022, verify_ratio=v, alpha_init=0.62)
  assert per_row.first_gamma() == 1 and per_row.speculates
  assert not dataclasses.replace(per_row, lengths=batch_lengths(8, 30.0)).speculates
  assert dataclasses.replace(per_row, lengths=batch_lengths(1, 30.0)).first_gamma() == 1
  # The 0.1-noise draft there (alpha 0.85): gamma 2 by each row's Theorem 8, gamma 1 for the
  # batch (measured: gamma 1 1.09x, gamma 2 1.06x greedy decoding).
  v = (1.60, 2.10, 2.73, 3.19, 4.66, 4.66, 5.36, 5.36)
  per_row = AdaptiveGamma(gamma_max=8, cost_ratio=0.030, verify_ratio=v, alpha_init=0.85)
  assert per_row.first_gamma() == 2
  assert dataclasses.replace(per_row, lengths=batch_lengths(8, 30.0)).first_gamma() == 1
  for bad in [((),), ((30.0, 0.0),), (('x',),), 30.0]:
    with pytest.raises(UserError, match='lengths'):
      AdaptiveGamma(lengths=bad)
  # the lengths are kept hashable and each batch's rows sorted: the same setting, one cache entry
  assert AdaptiveGamma(lengths=[[30, 12]]) == AdaptiveGamma(lengths=((12.0, 30.0),))


def test_the_batchs_wait_is_priced_from_each_rows_length():
  # Rows shorter than the batch's longest rarely decide when it ends: the widened smoke pair's
  # first batch of 8 translations (greedy lengths 18-32, two rows at the cap of 32) waits less
  # than 8 rows of 32 tokens, and more than its longest row alone. The 0.1-noise draft's fixed
  # gamma 1 / 2 / 4 runs on 16 inputs took 191 iterations in all; priced from each row's length
  # 195, with every row at its batch's longest 208 (scratch check, 2026-11-29).
  row_lengths = ((18.0, 22.0, 24.0, 24.0, 25.0, 29.0, 32.0, 32.0),)
  alphas = np.array([0.6, 0.8])
  per_row = theory.batch_inflation(alphas, 4, row_lengths)
  longest = theory.batch_inflation(alphas, 4, batch_lengths(8, 32.0))
  alone = theory.batch_inflation(alphas, 4, batch_lengths(1, 32.0))
  assert np.all(alone[:, 1:] < per_row[:, 1:]) and np.all(per_row[:, 1:] < longest[:, 1:])
  assert np.all(per_row[:, 0] == 1.0)
  # so where gamma 1 pays per row but not for 8 rows of the longest length, it pays for this
  # batch (the 0.1-noise draft's costs there, at alpha 0.75); at 0.85 gamma 2 again, 1 priced at
  # the longest
  v = (1.60, 2.10, 2.73, 3.19, 4.66, 4.66, 5.36, 5.36)
  ad = AdaptiveGamma(gamma_max=8, cost_ratio=0.030, verify_ratio=v, alpha_init=0.75)
  assert ad.first_gamma() == 1
  assert not dataclasses.replace(ad, lengths=batch_lengths(8, 32.0)).speculates
  assert dataclasses.replace(ad, lengths=row_lengths).first_gamma() == 1
  ad = dataclasses.replace(ad, alpha_init=0.85)
  assert dataclasses.replace(ad, lengths=batch_lengths(8, 32.0)).first_gamma() == 1
  assert dataclasses.replace(ad, lengths=row_lengths).first_gamma() == 2


def test_verification_widths():
  assert adaptive.verify_gammas(8) == (1, 2, 3, 4, 6, 8)
  assert adaptive.verify_gammas(1) == (1,) and adaptive.verify_gammas(5) == (1, 2, 3, 4, 5)
  assert adaptive.verify_gammas(20) == (1, 2, 3, 4, 6, 8, 12, 16, 20)
  assert [adaptive.verify_width(g, adaptive.verify_gammas(8)) for g in range(1, 9)] == [
      1, 2, 3, 4, 6, 6, 8, 8]


def test_narrow_verification_calls_are_greedy_exact():
  # Per-gamma v, cheap for short proposals: the rows' gammas spread over several widths (the
  # batch's call is the narrowest holding its longest proposal), and the output stays greedy's.
  summary = _greedy(AdaptiveGamma(gamma_max=GAMMA_MAX, cost_ratio=0.05,
                                  verify_ratio=(1.05, 1.1, 1.2, 1.5)))
  gammas = {g for t in summary['gamma_per_call_per_row'] for g in t}
  assert len(gammas - {0, GAMMA_MAX}) >= 2, gammas
  trace = summary['gamma_per_call_per_row']  # call i of every row is iteration i (module test)
  longest = [max(t[i] for t in trace if len(t) > i) for i in range(max(map(len, trace)))]
  assert any(0 < g < GAMMA_MAX for g in longest), longest  # calls narrower than gamma_max + 1


@pytest.mark.parametrize('kwargs, message', [
    (dict(gamma_max=0), 'gamma_max'), (dict(policy='fast'), 'policy'),
    (dict(cost_ratio=-1.0), 'cost ratio'), (dict(confidence=1.0), 'confidence'),
    (dict(gamma_init=9), 'gamma_init'), (dict(decay=1.0), 'decay'),
    (dict(gamma_max=2, verify_ratio=(1.0,)), 'per-gamma verify'),
    (dict(gamma_max=1, verify_ratio=(0.0,)), 'per-gamma verify')])
def test_bad_settings_are_user_errors(kwargs, message):
  with pytest.raises(UserError, match=message):
    AdaptiveGamma(**kwargs)


def test_costs_that_never_pay_give_plain_steps_only():
  # c = 2: not even alpha_init = 0.9 pays for a draft token, so every row starts (and stays) at 0
  # and the program is the plain loop alone: greedy's output, no draft call.
  ad = AdaptiveGamma(gamma_max=GAMMA_MAX, cost_ratio=2.0, verify_ratio=1.5)
  assert ad.first_gamma() == 0 and not ad.speculates
  assert cache_length(MAX_LEN, ad.call_tokens) == MAX_LEN + 1  # one slot per token
  summary = _greedy(ad)
  assert all(set(t) == {0} for t in summary['gamma_per_call_per_row'])
  assert summary['draft_steps'] == 0 and summary['proposed'] == 0
  # without a draft state (none is made where no row speculates): greedy decoding itself
  model, params = model_and_params(2)
  target = T5Decoder(model)
  state = target.init(params, jnp.asarray(INPUTS), MAX_LEN + 1)
  draft = CopyDraft(model.config.vocab_size)
  result = adaptive.decode(target, state, draft, None, jax.random.PRNGKey(0), adaptive=ad,
                           max_decode_len=MAX_LEN)
  reference = autoregressive.decode(target, state, jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(result.sequences, reference.sequences)
  np.testing.assert_array_equal(result.gamma_histogram[:, 0], reference.target_calls)
  np.testing.assert_array_equal(result.gamma_histogram[:, 1:], 0)
  positions = np.arange(MAX_LEN)[None]
  np.testing.assert_array_equal(result.gamma_trace,
                                np.where(positions < reference.target_calls[:, None], 0, -1))


def _greedy_output(model, params, enc):
  target = T5Decoder(model)
  out = autoregressive.decode(target, target.init(params, enc, MAX_LEN + 1),
                              jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
  return np.asarray(out.sequences), np.asarray(out.lengths)


def test_teacher_forced_agreement_is_the_one_token_acceptance_at_every_position():
  model, params = model_and_params(2)
  enc = jnp.asarray(INPUTS)
  seqs, lengths = _greedy_output(model, params, enc)
  padded = np.pad(seqs, ((0, 0), (0, GAMMA_MAX + 1)))
  # a bigram fitted on other rows' outputs: its token is a table lookup, so the agreement can be
  # counted here, position by position
  table = fit_ngram([s[1:n + 1] for s, n in zip(seqs[:2], lengths[:2])], 2,
                    model.config.vocab_size)
  bigram = NgramDraft(model.config.vocab_size)
  successor = table.successor()
  propose_one = lambda d: lambda s, q, at: (d.propose(s, q, at, None, 1, SamplingConfig())[0][:, 0],
                                            s)
  seconds, agreement = cost_calibration.teacher_forced(propose_one(bigram), bigram.commit,
                                                       bigram.init(table), padded, lengths)
  row_hits = [sum(int(successor[s[i]] == s[i + 1]) for i in range(n))
              for s, n in zip(seqs, lengths)]
  assert seconds > 0 and agreement == sum(row_hits) / lengths.sum()
  assert 0 < agreement < 1, agreement
  # More batches (each row alone here, as batch 1 would be) are read, untimed, while fewer than
  # min_positions positions are counted, and no further: the agreement is over what was read.
  one = lambda i: (bigram.init(table), padded[i:i + 1], lengths[i:i + 1])
  taken = []
  more = (taken.append(i) or one(i) for i in range(1, len(seqs)))
  need = int(lengths[0] + lengths[1] + 1)  # row 0 and 1 are short of it; row 2 reaches it
  _, pooled = cost_calibration.teacher_forced(propose_one(bigram), bigram.commit, *one(0),
                                              more=more, min_positions=need)
  assert taken == [1, 2] and lengths[:3].sum() >= need
  assert pooled == sum(row_hits[:3]) / lengths[:3].sum()
  # the target as its own draft (its cache advanced one true token at a time, rolled back to 0
  # between the timed passes) agrees everywhere
  draft = ModelDraft.t5(model)

  def model_token(s, q, at):
    tokens, _, s = draft.propose(s, q, at, jax.random.PRNGKey(0), 1, SamplingConfig())
    return tokens[:, 0], s

  _, same = cost_calibration.teacher_forced(model_token, draft.commit,
                                            draft.init(params, enc, MAX_LEN, 1), padded,
                                            lengths, min_calls=3 * MAX_LEN)
  assert same == 1.0


def _bigram(model, params, enc, tokens=None):
  """A bigram fitted on greedy decoding's outputs on `enc` (alpha high), or on `tokens`."""
  if tokens is None:
    seqs, lengths = _greedy_output(model, params, enc)
    tokens = [s[1:n + 1] for s, n in zip(seqs, lengths)]
  bigram = NgramDraft(model.config.vocab_size)
  return bigram, bigram.init(fit_ngram(tokens, 2, model.config.vocab_size))


def test_measured_costs_stop_at_the_bound_or_time_the_loop_at_every_width():
  model, params = model_and_params(2)
  target, enc = T5Decoder(model), jnp.asarray(INPUTS)
  state = target.init(params, enc, MAX_LEN + GAMMA_MAX + 2)
  greedy_iterations = int(autoregressive.decode(target, state, jax.random.PRNGKey(0),
                                                max_decode_len=MAX_LEN).loop_iterations)
  # With the fake clock the 1- and 2-token calls take alike: v's lower bound is exactly 1, and
  # the unit (a greedy step) is 1 / greedy decoding's iterations.
  # A draft that always proposes a token greedy decoding never emits (alpha 0): no gamma pays
  # even at that bound, the first stage decides, every v is the bound.
  seqs, lengths = _greedy_output(model, params, enc)
  unseen = next(t for t in range(2, model.config.vocab_size) if t not in set(seqs.ravel()))
  never, never_state = _bigram(model, params, enc, [[unseen] * 4])
  cal = cost_calibration.measure_costs(target, state, never, never_state, MAX_LEN, GAMMA_MAX,
                                       clock=FakeClock())
  assert cal.alpha == 0.0 and cal.cost_ratio == 0.0  # an n-gram: its proposal is in v
  assert cal.verify_ratio == (1.0,) * GAMMA_MAX
  assert cal.step_seconds == 1.0 / greedy_iterations
  assert cal.lengths == (tuple(sorted(float(n) for n in lengths)),)  # one batch read
  assert not AdaptiveGamma(gamma_max=GAMMA_MAX).calibrated(cal).speculates
  # A bigram fitted on these very outputs (alpha high) passes the bound: the policy's own loop is
  # timed held at every compiled width, v(gamma) = its seconds per iteration at the width holding
  # gamma (at least those of the narrower widths) over a greedy step, never below the bound; its
  # alpha is the loop's own at gamma 1.
  bigram, table = _bigram(model, params, enc)
  cal = cost_calibration.measure_costs(target, state, bigram, table, MAX_LEN, GAMMA_MAX,
                                       clock=FakeClock())
  assert cal.cost_ratio == 0.0 and cal.step_seconds == 1.0 / greedy_iterations
  policy = AdaptiveGamma(gamma_max=GAMMA_MAX).calibrated(
      cost_calibration.Calibration(0.0, (1.0,) * GAMMA_MAX, 0.5))
  widths = adaptive.verify_gammas(GAMMA_MAX)
  seconds = {w: 1.0 / int(_held(target, state, bigram, table, policy, w).loop_iterations)
             for w in widths}
  for g in range(1, GAMMA_MAX + 1):
    w = adaptive.verify_width(g, widths)
    slowest = max(seconds[u] for u in widths if u <= w)
    assert cal.verify_ratio[g - 1] == pytest.approx(max(slowest * greedy_iterations, 1.0)), g
  one = speculative.decode(target, state, bigram, table, jax.random.PRNGKey(0), gamma=1,
                           max_decode_len=MAX_LEN)
  assert 0.5 < cal.alpha == pytest.approx(float(one.beta_sum) / float(one.beta_count))
  ad = AdaptiveGamma(gamma_max=GAMMA_MAX).calibrated(cal)
  assert (ad.cost_ratio, ad.verify_ratio, ad.alpha_init, ad.lengths) == (
      cal.cost_ratio, cal.verify_ratio, cal.alpha, cal.lengths)
  # A model draft has a cost per token: its teacher-forced pass over the positions, in units.
  # The unit is a step of autoregressive decoding at the decoding's own temperature.
  draft, hot = ModelDraft.t5(model), SamplingConfig(temperature=1.0)
  cal = cost_calibration.measure_costs(
      target, state, draft, draft.init(perturbed_params('gqa'), enc, MAX_LEN, GAMMA_MAX), MAX_LEN,
      GAMMA_MAX, config=hot, clock=FakeClock())
  hot_iterations = int(autoregressive.decode(target, state, jax.random.PRNGKey(0),
                                             max_decode_len=MAX_LEN, config=hot).loop_iterations)
  n = int(max(lengths))
  assert cal.cost_ratio == pytest.approx(hot_iterations / (n * -(-64 // n)))
  assert 0 < cal.alpha < 1 and len(cal.verify_ratio) == GAMMA_MAX


def test_alpha_is_measured_over_the_batches_after_the_first_as_far_as_it_needs(monkeypatch):
  # Batch 1 (one row, MAX_LEN = 10 tokens at most) counts fewer positions than
  # CALIBRATION_POSITIONS: the next batches are read, both for the first stage's agreement and,
  # where the loop runs, for its alpha, which pools the gamma-1 loop over the same batches; the
  # timing stays on the first batch. With a bound of 2 rows' worth, the third batch is never made.
  model, params = model_and_params(2)
  target = T5Decoder(model)
  rows = [jnp.asarray(INPUTS[i:i + 1]) for i in range(len(INPUTS))]
  seqs, lengths = _greedy_output(model, params, jnp.asarray(INPUTS))
  bigram, table = _bigram(model, params, jnp.asarray(INPUTS))
  slots = MAX_LEN + GAMMA_MAX + 2
  made = []

  def states():
    for i, enc in enumerate(rows[1:], 1):
      made.append(i)
      yield target.init(params, enc, slots), table

  monkeypatch.setattr(cost_calibration, 'CALIBRATION_POSITIONS', int(lengths[0] + 1))
  first = target.init(params, rows[0], slots)
  cal = cost_calibration.measure_costs(target, first, bigram, table, MAX_LEN, GAMMA_MAX,
                                       more=states(), clock=FakeClock())
  assert made == [1] and cal.cost_ratio == 0  # one more batch reached the bound
  # the output lengths priced: the two batches' (one row each)
  assert cal.lengths == ((float(lengths[0]),), (float(lengths[1]),))
  runs = [speculative.decode(target, target.init(params, enc, slots), bigram, table,
                             jax.random.PRNGKey(0), gamma=1, max_decode_len=MAX_LEN)
          for enc in rows[:2]]
  assert cal.alpha == pytest.approx(sum(float(r.beta_sum) for r in runs)
                                    / sum(float(r.beta_count) for r in runs))
  alone = cost_calibration.measure_costs(target, first, bigram, table, MAX_LEN, GAMMA_MAX,
                                         clock=FakeClock()).alpha
  assert alone == pytest.approx(float(runs[0].beta_sum) / float(runs[0].beta_count))


def test_a_draft_reading_the_targets_hidden_states_is_calibrated_on_the_loop():
  # Chimera proposes from the hidden states of the loop's own verification calls, which the
  # teacher-forced pass does not make: its alpha is the gamma-1 run's, the loop always runs.
  from tests.decoding.test_speculative_chimera import CFG, _setup  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.drafts.chimera import ChimeraDraft  # pylint: disable=g-import-not-at-top
  model, params, draft_params = _setup(trained_like=True)
  gmax = CFG.num_draft_heads  # 3
  target, enc = T5Decoder(model), jnp.asarray(INPUTS)
  state = target.init(params, enc, MAX_LEN + gmax + 2)
  draft = ChimeraDraft(CFG)
  dstate = draft.init(draft_params, params['token_embedder']['embedding'], len(INPUTS), MAX_LEN)
  cal = cost_calibration.measure_costs(target, state, draft, dstate, MAX_LEN, gmax,
                                       clock=FakeClock())
  assert len(cal.verify_ratio) == gmax
  run = _held(target, state, draft, dstate, AdaptiveGamma(gamma_max=gmax), 1)
  assert 0 < cal.alpha == float(run.beta_sum) / float(run.beta_count)


def test_running_alpha_is_the_discounted_ratio_and_reads_the_acceptance_unbiased():
  # By hand: a prior of 0.9 over 8 positions, then a call whose first token was rejected (one
  # position, beta 0), then one that accepted 3 of 3: the weight before a call times the decay per
  # position it tried, its own positions 1 each; a row that tried nothing keeps its own.
  d = 0.85
  alpha, weight = jnp.asarray([0.9, 0.5]), jnp.asarray([8.0, 8.0])
  tried = jnp.asarray([[True, False, False], [False, False, False]])
  beta = jnp.asarray([[0.0, 0.7, 0.7], [1.0, 1.0, 1.0]])
  alpha, weight = adaptive.running_alpha(alpha, weight, beta, tried, d)
  np.testing.assert_allclose(alpha, [d * 8 * 0.9 / (d * 8 + 1), 0.5], rtol=1e-6)
  np.testing.assert_allclose(weight, [d * 8 + 1, 8.0], rtol=1e-6)
  alpha, weight = adaptive.running_alpha(alpha, weight, jnp.ones((2, 3)), jnp.ones((2, 3), bool), d)
  np.testing.assert_allclose(alpha[0], (d ** 4 * 8 * 0.9 + 3) / (d ** 4 * 8 + d ** 3 + 3),
                             rtol=1e-6)
  # The memory is in positions, not calls: calls of 1 and of 8 positions settle at 6.7 and 11
  # positions of weight (n / (1 - d^n)), where a discount of 0.7 per call gave 3.3 and 27.
  for n, settled in ((1, 1 / (1 - d)), (8, 8 / (1 - d ** 8))):
    w = jnp.asarray([8.0])
    for _ in range(60):
      _, w = adaptive.running_alpha(jnp.asarray([0.5]), w, jnp.ones((1, n)), jnp.ones((1, n), bool),
                                    d)
    np.testing.assert_allclose(w[0], settled, rtol=1e-3)
  # Greedy proposals of 8 tokens, each accepted with probability a (i.i.d.), tried up to the first
  # rejection: over 3000 calls the estimate averages a within 0.05; the mean of each call's mean
  # (an earlier estimator) read it low by more than 0.1 (0.31, 0.62, 0.77).
  rng = np.random.RandomState(0)
  truth = np.array([0.5, 0.8, 0.9])
  alpha, weight = jnp.full((3,), 0.7), jnp.full((3,), 8.0)
  old = np.full(3, 0.7)
  ours, olds = [], []
  for call in range(3000):
    accept = rng.rand(3, 8) < truth[:, None]  # [3, 8]
    k = np.where(accept.all(axis=1), 8, np.argmin(accept, axis=1))  # accepted prefix
    tried = np.arange(8)[None] <= np.minimum(k, 7)[:, None]  # [3, 8]
    beta = (np.arange(8)[None] < k[:, None]).astype(np.float32)
    alpha, weight = adaptive.running_alpha(alpha, weight, jnp.asarray(beta), jnp.asarray(tried),
                                           d)
    old = 0.7 * old + 0.3 * (beta * tried).sum(axis=1) / tried.sum(axis=1)
    if call >= 100:
      ours.append(np.asarray(alpha))
      olds.append(old)
  np.testing.assert_allclose(np.mean(ours, axis=0), truth, atol=0.05)
  assert (truth - np.mean(olds, axis=0) > 0.1).all()


def test_the_calibrated_alpha_is_a_lasting_prior_that_keeps_rows_off_lucky_runs():
  """`AdaptiveGamma.calibrated` keeps the calibration's alpha as `CALIBRATED_PRIOR_WEIGHT`
  positions in every row's estimate (`with_prior`). The widened smoke pair's costs at batch 1
  (c 0.008, v 1.41..2.54): Theorem 8 gives gamma 1 at alpha 0.64 and gamma 8 from ~0.72. 1000
  rows at batch 1 accept i.i.d. at 0.64 (greedy betas) for 16 iterations from the calibrated
  alpha 0.64; without the lasting prior a run of accepted tokens takes a row's ~6-position
  estimate past 0.72, and a fixed seed's rows spend 24% of their iterations at gamma >= 4 (the
  benchmark found 42 of 116 calls at gamma 8 on that pair); with it, 5% (the thresholds: above
  15% and below 8%)."""
  v = (1.41, 1.84, 2.10, 2.44, 2.54, 2.54, 2.54, 2.54)
  cal = cost_calibration.Calibration(0.008, v, 0.64)
  ad = AdaptiveGamma(gamma_max=8).calibrated(cal)
  assert ad.prior_weight == adaptive.CALIBRATED_PRIOR_WEIGHT and ad.alpha_init == 0.64
  # the prior by hand: 16 positions at 0.64 beside 4 at 1.0; the estimate varies as 4 / 20 times
  # a ratio over 4 positions, as a ratio over 20^2 / 4 = 100 positions would
  est, w = adaptive.with_prior(jnp.asarray([1.0]), jnp.asarray([4.0]), ad)
  np.testing.assert_allclose([est[0], w[0]], [(16 * 0.64 + 4) / 20, 100.0], rtol=1e-6)
  fading = dataclasses.replace(ad, prior_weight=0.0)
  assert adaptive.with_prior(jnp.asarray([1.0]), jnp.asarray([4.0]), fading)[0][0] == 1.0

  def long_share(settings):
    rows, g = 1000, settings.gamma_max
    rng = np.random.RandomState(0)
    choose = jax.jit(jax.vmap(lambda a, w: adaptive.batch_gamma(a[None], w[None],
                                                                jnp.ones((1,), bool), settings)))
    alpha, weight = jnp.full((rows,), settings.alpha_init), jnp.full((rows,), float(g))
    want, long = np.full(rows, settings.first_gamma()), 0
    assert settings.first_gamma() == 1
    for _ in range(16):
      accept = (rng.rand(rows, g) < 0.64) & (np.arange(g)[None] < want[:, None])  # [rows, g]
      k = np.argmin(np.concatenate([accept, np.zeros((rows, 1), bool)], axis=1), axis=1)
      tried = (np.arange(g)[None] <= k[:, None]) & (np.arange(g)[None] < want[:, None])
      alpha, weight = adaptive.running_alpha(alpha, weight, jnp.asarray(accept, jnp.float32),
                                             jnp.asarray(tried), settings.decay)
      want = np.where(want > 0, np.asarray(choose(alpha, weight)), 0)
      long += int((want >= 4).sum())
    return long / (16 * rows)

  with_lasting, without = long_share(ad), long_share(fading)
  assert with_lasting < 0.08 and without > 0.15, (with_lasting, without)


@pytest.mark.parametrize('widths', [(8,), (1, 2, 3, 4, 6, 8), (1, 2, 4, 8, 16)])
def test_width_index_is_searchsorted(widths):
  longest = jnp.arange(-1, max(widths) + 3)
  got = jax.vmap(lambda x: adaptive.width_index(widths, x))(longest)
  np.testing.assert_array_equal(got, np.searchsorted(np.asarray(widths), np.asarray(longest)))
  assert got.dtype == jnp.int32
