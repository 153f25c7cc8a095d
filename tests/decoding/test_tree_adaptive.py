"""Adaptive best-first trees (`decoding/adaptive_tree.py`): exact outputs whatever size each row used.

Ranking: the first n nodes of a tree in rank order are the best-first tree of budget n. Greedy: a
tiny T5 target (GQA-2) with a perturbed copy as the tree draft on the ragged batch of 4 (rows end at
different node counts, calls at several widths, output token for token greedy decoding's); a table
target with a per-row table draft (a row whose draft is always rejected goes to 0 nodes, one whose
right path ranks deep in the tree to a large tree, one whose draft is always right to a small one).
Sampling: the table stubs of `test_tree_stub.py` (40k rows, one jitted batch), chi-square on the
joint distribution of the first three tokens, p > 1e-3 at fixed seeds.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import (adaptive_tree, autoregressive, cost_calibration, sampling,
                               speculative, theory, tree as tree_lib)
from gqa_spec.decoding.adaptive_tree import AdaptiveTree
from gqa_spec.decoding.cost_calibration import Calibration
from gqa_spec.decoding.drafts.ngram import fit_ngram
from gqa_spec.decoding.drafts.ngram import NgramTreeDraft
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.errors import UserError
from tests.decoding.conftest import (FakeClock, INPUTS, MAX_LEN, TableDecoder, batch_lengths,
                                     model_and_params)
from tests.decoding.test_speculative_stub import (N, NO_EOS, P_VALUE_THRESHOLD, _chisquare,
                                                  _empirical, _exact_first_three, _tables)
from tests.decoding.test_speculative_t5 import KV_HEADS, greedy_reference, perturbed_params


def _check_statistics(summary, result, nodes_max):
  chosen = summary['tree_nodes_per_call_per_row']
  assert [len(t) for t in chosen] == list(np.asarray(result.target_calls))
  np.testing.assert_array_equal(summary['tree_nodes_histogram_per_row'],
                                [np.bincount(t, minlength=nodes_max + 1) for t in chosen])
  verified = summary['tree_nodes_verified_per_call_per_row']
  for c, v in zip(chosen, verified):  # a call holds every active row's choice
    assert len(c) == len(v) and all(n <= w for n, w in zip(c, v))
  assert sum(summary['tree_nodes_histogram']) == summary['target_calls']


@pytest.mark.parametrize('config, replace', [
    (sampling.GREEDY, False), (SamplingConfig(temperature=1.0), False),
    (SamplingConfig(temperature=0.8, top_k=4), True)])
def test_first_ranked_nodes_are_the_smaller_best_first_tree(config, replace):
  table = jnp.asarray(np.random.RandomState(0).normal(size=(7, 7)).astype(np.float32) * 2)
  root = table[jnp.array([0, 3, 5])]  # [3, V]: three rows

  @jax.jit
  def ranked(budget_tree):
    tree, _, _ = budget_tree
    return tree_lib.by_rank(tree)[0]

  def grow(n):
    shape = TreeShape.best(n, depth=3, width=2, replace=replace)
    feed = lambda carry, tokens, parent, d: (table[tokens], carry)  # [b, F, V]
    return ranked(tree_lib.grow(shape, jax.random.PRNGKey(1), root, feed, None, config))

  full = grow(10)  # every candidate: 2 + 4 + 4
  assert (np.asarray(full.parents) < np.arange(10)).all()  # parents first
  for n in (1, 2, 3, 5, 8):
    small, cut = grow(n), tree_lib.first_nodes(full, n)
    for field in ('tokens', 'parents', 'depths', 'valid', 'q'):
      np.testing.assert_allclose(np.asarray(getattr(small, field)), np.asarray(getattr(cut, field)),
                                 err_msg=f'{field} at n={n}')


def test_t5_draft_is_greedy_exact_with_rows_at_different_sizes():
  model, params = model_and_params(KV_HEADS['gqa'])
  target, enc = T5Decoder(model), jnp.asarray(INPUTS)
  ad = AdaptiveTree.parse('best:auto:8,depth:3,width:2', cost_ratio=0.1,
                          verify_ratio=(1.0, 1.05, 1.2, 1.6))
  assert ad.widths == (1, 2, 4, 8) and ad.describe().startswith('best:auto:8,depth:3,width:2')
  draft = TreeModelDraft.t5(model)
  result = adaptive_tree.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, ad.call_tokens)), draft,
      draft.init(perturbed_params('gqa'), enc, MAX_LEN, ad.shape), jax.random.PRNGKey(0),
      adaptive=ad, max_decode_len=MAX_LEN)
  ref_seqs, ref_lengths = greedy_reference('gqa', len(INPUTS))
  np.testing.assert_array_equal(np.asarray(result.lengths), ref_lengths)
  np.testing.assert_array_equal(np.asarray(result.sequences)[:, :MAX_LEN + 1], ref_seqs)
  s = speculative.summarize(result)
  _check_statistics(s, result, 8)
  chosen = s['tree_nodes_per_call_per_row']
  assert all(t[0] == 8 for t in chosen)  # the first tree is the largest: it observes every width
  assert len({t[-1] for t in chosen}) >= 3  # rows settle at different sizes
  widths = {w for v in s['tree_nodes_verified_per_call_per_row'] for w in v}
  assert widths & {1, 2, 4}  # calls narrower than N_max
  assert 0 < s['accepted'] and sum(s['accept_histogram']) == s['target_calls']


@dataclasses.dataclass(frozen=True)
class RowTableDraft:
  """A tree draft whose logits depend on the row and the fed token only (state: `[b, V, V]`)."""

  def propose_tree(self, state, sequences, lengths, rng, shape, config):
    rows = jnp.arange(state.shape[0])
    last = jnp.take_along_axis(sequences, lengths[:, None], axis=1)[:, 0]  # [b]
    feed = lambda carry, tokens, parent, d: (state[rows[:, None], tokens], carry)  # [b, F, V]
    tree, _, _ = tree_lib.grow(shape, rng, state[rows, last], feed, None, config)
    return tree, state

  def commit_tree(self, state, sequences, lengths, path):
    del sequences, lengths, path
    return state


def test_rows_move_to_the_tree_size_their_acceptance_pays_for():
  vocab, max_len = 8, 24
  successor = (np.arange(vocab) * 3 + 1) % vocab  # the target's next token after each token
  target = np.full((1, vocab, vocab), -5.0, np.float32)
  target[0, np.arange(vocab), successor] = 5.0
  decoy = (successor + 1) % vocab
  draft = np.full((3, vocab, vocab), -30.0, np.float32)
  # Row 0: the right token first but barely (the decoy close behind), so the right path's nodes
  # rank deep in the tree; row 1: the right token never proposed; row 2: the right token surely.
  draft[0, np.arange(vocab), successor] = np.log(0.5)
  draft[0, np.arange(vocab), decoy] = np.log(0.45)
  draft[1, np.arange(vocab), decoy] = 0.0
  draft[1, np.arange(vocab), (successor + 2) % vocab] = 0.0
  draft[2, np.arange(vocab), successor] = 0.0
  ad = AdaptiveTree.parse('best:auto,depth:3,width:2', cost_ratio=0.05,
                          verify_ratio=(1.0, 1.0, 1.05, 1.1, 1.15))
  assert ad.nodes_max == 10 and ad.widths == (1, 2, 4, 8, 10)
  result = adaptive_tree.decode(
      TableDecoder(), TableDecoder().init(target, 3, cache_length(max_len, ad.call_tokens)),
      RowTableDraft(), jnp.asarray(draft), jax.random.PRNGKey(0), adaptive=ad,
      max_decode_len=max_len, eos_id=NO_EOS)
  expected = [0]
  for _ in range(max_len):
    expected.append(int(successor[expected[-1]]))
  np.testing.assert_array_equal(np.asarray(result.sequences)[:, :max_len + 1],
                                np.tile(expected, (3, 1)))  # greedy decoding's tokens
  s = speculative.summarize(result)
  _check_statistics(s, result, 10)
  good, bad, sure = s['tree_nodes_per_call_per_row']
  assert good[0] == bad[0] == sure[0] == 10
  assert set(good[1:]) == {8}  # the right path needs 7 or 8 nodes
  assert set(sure[1:]) == {4}  # the right path is the best 3 nodes
  # Always rejected: the optimistic prior fades call by call until no tree pays.
  assert bad[-1] == 0 and all(x >= y for x, y in zip(bad, bad[1:])), bad
  assert 0 < bad.index(0) < 12
  # Row 1 rides along in the calls the others asked for (free in the call): 8 nodes verified while
  # rows 0 and 2 run (4 tokens a call: 6 calls); its last calls are plain target steps.
  verified = s['tree_nodes_verified_per_call_per_row'][1]
  assert verified[1:6] == [8] * 5 and verified[-1] == 0
  assert s['acceptance_rate_per_row'][1] == 0.0


@pytest.mark.parametrize('spec, config', [
    ('best:auto:6,depth:3,width:2', SamplingConfig(temperature=1.0)),
    ('best:auto:6,depth:3,width:2,replace', SamplingConfig(temperature=0.8, top_p=0.9)),
])
def test_sampling_distribution_is_unchanged(spec, config):
  p, q = _tables()
  max_len = 3
  ad = AdaptiveTree.parse(spec, cost_ratio=0.15, verify_ratio=(1.0, 1.1, 1.3, 1.5), decay=0.5)
  draft = TreeModelDraft(TableDecoder())
  ts = TableDecoder().init(p, N, cache_length(max_len, ad.call_tokens))
  ds = draft.init_state(TableDecoder().init(q, N, draft.cache_slots(max_len, ad.shape)), ad.shape)
  result = adaptive_tree.decode(TableDecoder(), ts, draft, ds, jax.random.PRNGKey(0), adaptive=ad,
                                max_decode_len=max_len, config=config, eos_id=NO_EOS)
  assert (np.asarray(result.lengths) == max_len).all()
  histogram = np.asarray(result.tree_nodes_histogram).sum(axis=0)  # [N_max + 1]
  assert np.count_nonzero(histogram[:-1]) >= 2, histogram  # rows chose several sizes below N_max
  assert histogram[0] > 0  # some rows asked for no tree
  s = speculative.summarize(result)
  assert 0 < s['accept_histogram'][0] < s['target_calls']
  assert _chisquare(_empirical(np.asarray(result.sequences)),
                    _exact_first_three(p, config)) > P_VALUE_THRESHOLD


def test_a_prior_that_pays_for_no_tree_is_greedy_decoding_from_the_start():
  # c = 3 per draft call: not even the prior's alpha 0.9 pays for a tree (2.71 tokens for 7 steps),
  # so no row ever asks for one: greedy decoding itself, on a cache of one slot per token, with no
  # draft state; every call a plain step in the statistics.
  model, params = model_and_params(KV_HEADS['gqa'])
  target, enc = T5Decoder(model), jnp.asarray(INPUTS[:2])
  ad = AdaptiveTree.parse('best:auto:2,depth:2,width:2', cost_ratio=3.0)
  assert not ad.speculates and ad.first_nodes() == 0
  assert cache_length(MAX_LEN, ad.call_tokens) == MAX_LEN + 1
  result = adaptive_tree.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, ad.call_tokens)),
      TreeModelDraft.t5(model), None, jax.random.PRNGKey(0), adaptive=ad, max_decode_len=MAX_LEN)
  ref_seqs, _ = greedy_reference('gqa', 2)
  np.testing.assert_array_equal(np.asarray(result.sequences)[:, :MAX_LEN + 1], ref_seqs)
  s = speculative.summarize(result)
  _check_statistics(s, result, 2)
  assert s['proposed'] == 0 and s['draft_calls'] == 0
  for chosen, verified in zip(s['tree_nodes_per_call_per_row'], s['tree_nodes_verified_per_call_per_row']):
    assert set(chosen) == set(verified) == {0}
  # A cheaper draft: the prior pays, every row's first call verifies the largest tree.
  assert dataclasses.replace(ad, cost_ratio=0.1).first_nodes() == 2


def test_a_measured_prior_replaces_the_chain_of_alpha():
  # At alpha 0.95 the chain prices 4 nodes at 0.95 + 0.90 + 0.86 + 0.81 = 3.52 tokens a call, and
  # a tree pays at c 0.2 and v 3 (4.52 tokens for 3.8 steps). Measured at 0.3 and 0.2 tokens a call
  # (the best-first trees the loop verified), none does: no row ever asks for one.
  ad = AdaptiveTree.parse('best:auto:4,depth:4,width:2', cost_ratio=0.2, verify_ratio=3.0,
                          alpha_init=0.95)
  assert ad.widths == (1, 2, 4) and ad.speculates
  np.testing.assert_allclose(ad.prior(), [0.95, 0.95 + 0.95 ** 2, sum(0.95 ** i for i in range(1, 5))],
                             rtol=1e-6)
  measured = dataclasses.replace(ad, accepted_init=(0.3, 0.25, 0.2))
  np.testing.assert_allclose(measured.prior(), [0.3, 0.3, 0.3])  # non-decreasing in the width
  assert not measured.speculates and measured.first_nodes() == 0
  # Measured where trees pay: every row starts at the prior's own choice, 4 nodes (the chain, which
  # has not seen the widths, starts every row at N_max = 8 to observe them all in one call).
  eight = AdaptiveTree.parse('best:auto:8,depth:4,width:2', cost_ratio=0.2, verify_ratio=3.0,
                             alpha_init=0.95)
  assert eight.first_nodes() == 8
  paying = dataclasses.replace(eight, accepted_init=(0.9, 1.7, 2.9, 2.8))  # 8 nodes: no more
  np.testing.assert_array_equal(paying.choose(paying.prior()[None]), [4])
  assert paying.first_nodes() == 4 and paying.speculates
  calibration = Calibration(0.2, (3.0, 3.0, 3.0), 0.95, 1e-3, accepted=(0.9, 1.7, 9.0))
  assert ad.calibrated(calibration).accepted_init == (0.9, 1.7, 4.0)  # at most D tokens a call
  assert ad.calibrated(calibration._replace(accepted=())).accepted_init is None  # the chain
  for bad in ((0.5, 0.5), (0.5, -0.1, 1.0), (0.5, 1.0, 4.5)):
    with pytest.raises(UserError, match='accepted_init'):
      dataclasses.replace(ad, accepted_init=bad)


def _held_widths(ad, calls):
  """One row's node counts over `calls`, each `added` (tokens per band, `[K]`) observed for the
  bands the chosen width holds (`AdaptiveTree.observe`, `accepted`, `choose`, as the loop)."""
  K = len(ad.widths)
  gain = jnp.diff(ad.prior(), prepend=0.0)[None]  # [1, K]
  weight = jnp.full((1, K), 1.0 / (1.0 - ad.decay))  # [1, K]
  want, chosen = ad.first_nodes(), []
  for added in calls:
    chosen.append(want)
    observed = jnp.asarray(ad.widths)[None] <= want  # [1, K]
    gain, weight = ad.observe(gain, weight, jnp.asarray([added], jnp.float32), observed,
                              jnp.ones((1,), bool))
    want = int(ad.choose(ad.accepted(gain, weight))[0])
  return chosen


def test_a_wide_tree_not_held_comes_back_with_the_lasting_prior():
  # A measured prior (4 nodes best, 2 close behind), then two calls where the wide bands add
  # nothing, then calls that add what the prior says. Without a lasting prior the row drops to 2
  # nodes and never holds 4 again (its band of ranks 2-3 keeps the low draws, never observed);
  # with it that band's evidence fades back to the prior and the row returns to 4 nodes.
  ad = AdaptiveTree.parse('best:auto:8,depth:4,width:2', cost_ratio=0.05,
                          verify_ratio=(1.0, 1.1, 1.45, 2.0), accepted_init=(0.8, 1.2, 1.9, 2.1))
  assert ad.first_nodes() == 4
  calls = [(1.0, 0.0, 0.0, 0.0)] * 2 + [(0.8, 0.4, 0.7, 0.2)] * 16
  fading = _held_widths(ad, calls)
  assert fading[0] == 4 and set(fading[1:]) == {2}, fading
  lasting = dataclasses.replace(ad, prior_weight=adaptive_tree.CALIBRATED_PRIOR_CALLS)
  held = _held_widths(lasting, calls)
  assert 2 in held and held[-8:] == [4] * 8, held  # [4, 4, 2, 2, 4, ...]
  # Held at every call, the mean is the exponential moving average (the weight stays 1/(1-decay)).
  gain, weight = ad.observe(jnp.ones((1, 4)), jnp.full((1, 4), 1 / 0.3), jnp.zeros((1, 4)),
                            jnp.ones((1, 4), bool), jnp.ones((1,), bool))
  np.testing.assert_allclose(gain, 0.7, rtol=1e-6)
  np.testing.assert_allclose(weight, 1 / 0.3, rtol=1e-6)
  calibrated = ad.calibrated(Calibration(0.05, (1.0, 1.1, 1.45, 2.0), 0.8, 1e-3,
                                         accepted=(0.8, 1.2, 1.9, 2.1)))
  assert calibrated.prior_weight == adaptive_tree.CALIBRATED_PRIOR_CALLS
  assert ad.calibrated(Calibration(0.05, (1.0,) * 4, 0.8, 1e-3)).prior_weight == 0.0


def test_a_batch_is_priced_by_its_slowest_row():
  # The widened smoke pair's batch-8 calibration at T = 0 (results/benchmarks/
  # adaptive_tree_smoke_widened_lasting_b8): per row a 2-node tree pays (2.36 tokens for 2.18
  # steps), but a batch of 8 rows runs until its slowest row's 32 tokens are out: no tree pays
  # there, and the run is greedy decoding from the start.
  ad = AdaptiveTree.parse('best:auto:16,depth:4', cost_ratio=0.031,
                          verify_ratio=(1.67, 2.06, 2.99, 4.98, 7.93),
                          accepted_init=(0.79, 1.36, 2.15, 2.79, 3.57))
  assert ad.inflation() == (1.0,) * 5 and ad.first_nodes() == 2
  one = dataclasses.replace(ad, lengths=batch_lengths(1, 32.0))  # the last call's overshoot
  assert all(1.0 < x < 1.07 for x in one.inflation()) and one.first_nodes() == 2
  batch = dataclasses.replace(ad, lengths=batch_lengths(8, 32.0))
  assert all(1.1 < x < 1.5 for x in batch.inflation()), batch.inflation()
  assert batch.first_nodes() == 0 and not batch.speculates
  # A tree's tokens read as a chain of D tokens at the alpha that accepts as many: for a chain's
  # own count that is the chain's inflation (`theory.batch_inflation`).
  chain = sum(0.7 ** i for i in range(1, 5))
  eight = batch_lengths(8, 32.0)
  np.testing.assert_allclose(theory.tree_batch_inflation([chain, 4.0], 4, eight),
                             [theory.batch_inflation(np.array([0.7]), 4, eight)[0, 4],
                              theory.batch_inflation(np.array([1.0]), 4, eight)[0, 4]],
                             rtol=1e-6)
  cal = Calibration(0.031, (1.67, 2.06, 2.99, 4.98, 7.93), 0.79, 1e-3, lengths=eight,
                    accepted=(0.79, 1.36, 2.15, 2.79, 3.57))
  assert ad.calibrated(cal).inflation() == batch.inflation()


def test_measured_costs_and_starting_alpha():
  # With a clock whose every timed run reads 1 s (`conftest.FakeClock`) the 1- and 2-token
  # calls take alike, so v's lower bound is exactly 1. A tree draft that always proposes a token
  # greedy decoding never emits (alpha 0) pays for no tree even at that bound: the first stage
  # rules it out, every v the bound, no prior. A bigram tree fitted on the target's own outputs
  # passes it: the second stage times the policy's own loop held at every width, and measures
  # alpha at one node per call and the prior, tokens accepted per call at each width.
  model, params = model_and_params(KV_HEADS['gqa'])
  target, enc = T5Decoder(model), jnp.asarray(INPUTS[:2])
  ad = AdaptiveTree.parse('best:auto:4,depth:2,width:2')
  tstate = target.init(params, enc, cache_length(MAX_LEN, ad.call_tokens))
  all_out = autoregressive.decode(target, target.init(params, jnp.asarray(INPUTS), MAX_LEN + 1),
                                  jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
  outputs = autoregressive.strip(all_out.sequences, all_out.lengths)
  unseen = next(t for t in range(2, model.config.vocab_size)
                if all(t not in o for o in outputs))
  bigram = NgramTreeDraft(model.config.vocab_size)
  never = fit_ngram([[unseen] * 4], 2, model.config.vocab_size)
  other = cost_calibration.measure_costs(target, tstate, bigram, bigram.init(never, ad.shape),
                                         MAX_LEN, ad, clock=FakeClock())
  assert other.alpha == 0.0 and other.verify_ratio == (1.0,) * len(ad.widths) == (1.0,) * 3
  assert not other.accepted and not ad.calibrated(other).speculates
  assert ad.calibrated(other).accepted_init is None
  # Fewer than CALIBRATION_POSITIONS positions in this batch (2 rows of at most MAX_LEN): alpha
  # pools the loop's acceptance over the next batch too (rows 3 and 4), as generate passes them.
  table = fit_ngram(outputs, 2, model.config.vocab_size)
  tstate2 = target.init(params, jnp.asarray(INPUTS[2:]),
                        cache_length(MAX_LEN, ad.call_tokens))
  more = iter([(tstate2, bigram.init(table, ad.shape))])
  pooled = cost_calibration.measure_costs(target, tstate, bigram, bigram.init(table, ad.shape),
                                          MAX_LEN, ad, more=more, clock=FakeClock())
  assert len(pooled.verify_ratio) == 3 and all(v >= 1.0 for v in pooled.verify_ratio)
  at = lambda u, t: adaptive_tree.decode(target, t, bigram, bigram.init(table, ad.shape),
                                         jax.random.PRNGKey(0), max_decode_len=MAX_LEN,
                                         adaptive=dataclasses.replace(ad, fixed_nodes=u))
  runs = [at(1, t) for t in (tstate, tstate2)]
  assert pooled.alpha == pytest.approx(sum(float(np.sum(r.accepted)) for r in runs)
                                       / sum(float(np.sum(r.proposed)) for r in runs))
  assert pooled.alpha > 0.5  # the bigram agrees with most of the outputs it was fitted on
  for u, measured in zip(ad.widths, pooled.accepted):
    held_at_u = [at(u, t) for t in (tstate, tstate2)]
    assert measured == pytest.approx(sum(float(np.sum(r.accepted)) for r in held_at_u)
                                     / sum(float(np.sum(r.target_calls)) for r in held_at_u)), u
  assert pooled.accepted[0] == pytest.approx(pooled.alpha)  # one node: one token proposed a call
  cal = ad.calibrated(pooled)
  assert cal.accepted_init == tuple(pooled.accepted)
  assert (cal.cost_ratio, cal.verify_ratio, cal.alpha_init) == (
      pooled.cost_ratio, tuple(pooled.verify_ratio), pooled.alpha)
  # fixed_nodes: every call at that width; the policy's own loop held at 4 nodes (the
  # calibration's program) is the loop at 4 fixed nodes.
  draft = TreeModelDraft.t5(model)
  fixed = dataclasses.replace(ad, fixed_nodes=1)
  result = adaptive_tree.decode(target, tstate, draft, draft.init(params, enc, MAX_LEN, ad.shape),
                                jax.random.PRNGKey(0), adaptive=fixed, max_decode_len=MAX_LEN)
  widths = np.asarray(result.tree_width_trace)
  assert set(widths[:int(result.loop_iterations)]) == {1}
  np.testing.assert_array_equal(np.asarray(result.proposed), np.asarray(result.target_calls))
  wide = adaptive_tree._speculative(  # pylint: disable=protected-access
      target, tstate, draft, draft.init(params, enc, MAX_LEN, ad.shape), jax.random.PRNGKey(0),
      adaptive=fixed, max_decode_len=MAX_LEN, first_nodes=np.full((len(enc),), 4, np.int32))
  assert set(np.asarray(wide.tree_width_trace)[:int(wide.loop_iterations)]) == {4}
  np.testing.assert_array_equal(np.asarray(wide.lengths), np.asarray(result.lengths))
  kept = adaptive_tree._speculative(  # pylint: disable=protected-access
      target, tstate, draft, draft.init(params, enc, MAX_LEN, ad.shape), jax.random.PRNGKey(0),
      adaptive=cal, max_decode_len=MAX_LEN, first_nodes=np.full((len(enc),), 4, np.int32),
      held=np.ones((), bool))
  for field in ('sequences', 'lengths', 'target_calls', 'accepted', 'tree_width_trace'):
    np.testing.assert_array_equal(np.asarray(getattr(kept, field)),
                                  np.asarray(getattr(wide, field)), err_msg=field)


@pytest.mark.parametrize('spec, kwargs, message', [
    ('best:auto:99,depth:2,width:2', {}, 'budget'),
    ('best:auto:4,depth:2,width:2', dict(cost_ratio=-1.0), 'cost ratio'),
    ('best:auto:4,depth:2,width:2', dict(verify_ratio=(1.0, 1.0)), 'per-width verify'),
    ('best:auto:4,depth:2,width:2', dict(decay=1.0), 'decay'),
    ('best:auto,width:2', {}, 'adaptive tree must be'),
    ('best:auto:0,depth:2', {}, 'budget'),
    ('best:auto:4,depth:2,width:2', dict(fixed_nodes=3), 'fixed_nodes'),
    ('best:auto:4,depth:2,width:2', dict(prior_weight=-1.0), 'prior_weight'),
])
def test_bad_settings_are_user_errors(spec, kwargs, message):
  with pytest.raises(UserError, match=message):
    AdaptiveTree.parse(spec, **kwargs)
  with pytest.raises(UserError, match='best-first'):
    AdaptiveTree(TreeShape.topk(2, 2))


def test_chimera_tree_draft_reads_the_calls_hidden_states_and_is_greedy_exact():
  # A draft that reads the target's hidden states (`reads_target_hidden`): each width's branch
  # hands `observe` the hidden states of the root and the accepted path of that call.
  from tests.decoding.test_speculative_chimera import CFG, _setup  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.drafts.chimera import ChimeraTreeDraft  # pylint: disable=g-import-not-at-top
  model, params, draft_params = _setup(trained_like=True)
  target, enc = T5Decoder(model), jnp.asarray(INPUTS)
  ad = AdaptiveTree.parse('best:auto:4,depth:3,width:2', cost_ratio=0.05,
                          verify_ratio=(1.0, 1.1, 1.3))
  draft = ChimeraTreeDraft(CFG)
  result = adaptive_tree.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, ad.call_tokens)), draft,
      draft.init(draft_params, params['token_embedder']['embedding'], 4, MAX_LEN),
      jax.random.PRNGKey(0), adaptive=ad, max_decode_len=MAX_LEN)
  ref_seqs, ref_lengths = greedy_reference('gqa', len(INPUTS))
  np.testing.assert_array_equal(np.asarray(result.lengths), ref_lengths)
  np.testing.assert_array_equal(np.asarray(result.sequences)[:, :MAX_LEN + 1], ref_seqs)
  s = speculative.summarize(result)
  _check_statistics(s, result, 4)
  assert s['accepted'] > 0
  # Its calibration: alpha from the loop at one node per call (the teacher-forced pass makes no
  # hidden states), and the first stage does not stop it.
  dstate = draft.init(draft_params, params['token_embedder']['embedding'], 4, MAX_LEN)
  tstate = target.init(params, enc, cache_length(MAX_LEN, ad.call_tokens))
  cal = cost_calibration.measure_costs(target, tstate, draft, dstate, MAX_LEN, ad,
                                       clock=FakeClock())
  fixed = adaptive_tree.decode(target, tstate, draft, dstate, jax.random.PRNGKey(0),
                               adaptive=dataclasses.replace(ad, fixed_nodes=1),
                               max_decode_len=MAX_LEN)
  assert len(cal.verify_ratio) == len(ad.widths)
  assert 0 < cal.alpha == float(np.sum(fixed.accepted)) / float(np.sum(fixed.proposed))
