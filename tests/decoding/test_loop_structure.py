"""The adaptive loops' structure: a loop per verification width, and nothing else nested.

`adaptive.decode` and `adaptive_tree.decode` verify at one of a few compiled widths. They chose it
every iteration with `jnp.searchsorted`, whose default method is a `fori_loop` of log2(widths)
steps: a loop nested in the decoding loop, each of its steps its own kernel launches on a GPU,
where the adaptive loop at a fixed gamma cost 40-90 us an iteration more than `speculative.decode`
(results/gpu/guard_2026-11-28); `adaptive.width_index` is a comparison and a sum. Then the
width's `lax.switch` in the loop went too: each width now has its own while loop inside an outer
one. Here, in each policy's traced program (the jaxpr, before XLA, so that the compiler's flags do
not matter): two loops at the top (the outer speculative one and the plain steps' after it), one
loop per width inside the first, inside each of those the loops the fixed-length loop with the
same draft has (`speculative.decode`, `tree_speculative.decode`), no more, and no `cond` over the
widths; and `width_index` is `searchsorted`'s answer at every value.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import (adaptive, adaptive_tree, autoregressive, speculative,
                               tree_speculative)
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.adaptive_tree import AdaptiveTree
from gqa_spec.decoding.drafts import NgramDraft
from gqa_spec.decoding.drafts.ngram import fit_ngram
from gqa_spec.decoding.drafts.ngram_tree import NgramTreeDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length
from tests.decoding.conftest import INPUTS, MAX_LEN, model_and_params

LOOPS = ('while', 'scan')  # a fori_loop with static bounds is a scan


def _loops(fun, *args):
  """`[(depth, primitive)]` of the loops one run of `fun(*args)`'s jaxpr can enter (depth 0: not
  inside a loop); of a `cond`'s / `switch`'s branches, the one with the most loops."""

  def walk(jaxpr, depth):
    out = []
    for eqn in jaxpr.eqns:
      inner = depth + (eqn.primitive.name in LOOPS)
      if eqn.primitive.name in LOOPS:
        out.append((depth, eqn.primitive.name))
      subs = [walk(sub.jaxpr if hasattr(sub, 'consts') else sub, inner)
              for value in eqn.params.values()
              for sub in (value if isinstance(value, (list, tuple)) else [value])
              if hasattr(sub, 'eqns') or hasattr(sub, 'consts')]
      if eqn.primitive.name == 'cond':  # alternatives: one branch runs
        out += max(subs, key=len, default=[])
      else:
        out += [x for sub in subs for x in sub]
    return out

  return sorted(walk(jax.make_jaxpr(fun)(*args).jaxpr, 0))


def _switches(jaxpr, branches):
  """The `cond`s of a jaxpr (at any depth) with `branches` branches."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name == 'cond' and len(eqn.params['branches']) == branches
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        if hasattr(sub, 'consts'):
          count += _switches(sub.jaxpr, branches)
        elif hasattr(sub, 'eqns'):
          count += _switches(sub, branches)
  return count


def _nested(loops):
  return [x for x in loops if x[0] > 0]


@pytest.fixture(scope='module')
def pair():
  model, params = model_and_params(2)
  target, enc = T5Decoder(model), jnp.asarray(INPUTS[:2])
  out = autoregressive.decode(target, target.init(params, enc, MAX_LEN + 1), jax.random.PRNGKey(0),
                              max_decode_len=MAX_LEN)
  table = fit_ngram(autoregressive.strip(out.sequences, out.lengths), 2, model.config.vocab_size)
  return model, params, target, enc, table


@pytest.mark.parametrize('policy', [
    AdaptiveGamma(gamma_max=8, policy='fixed', gamma_init=8),
    AdaptiveGamma(gamma_max=8, cost_ratio=0.1),
    AdaptiveGamma(gamma_max=8, policy='heuristic')], ids=lambda p: p.policy)
def test_chain_loop_is_a_loop_per_width(pair, policy):
  model, params, target, enc, table = pair
  draft = NgramDraft(model.config.vocab_size)
  tstate = target.init(params, enc, cache_length(MAX_LEN, policy.call_tokens))
  args = (tstate, draft.init(table), jax.random.PRNGKey(0))
  ours = _loops(lambda ts, ds, rng: adaptive.decode(
      target, ts, draft, ds, rng, adaptive=policy, max_decode_len=MAX_LEN), *args)
  fixed = _loops(lambda ts, ds, rng: speculative.decode(
      target, ts, draft, ds, rng, gamma=8, max_decode_len=MAX_LEN), *args)
  _assert_a_loop_per_width(ours, fixed, len(policy.verify_widths))


def _assert_a_loop_per_width(ours, fixed, widths: int):
  """`ours`: two loops at the top, `widths` loops in the first, and in each of those the nested
  loops of the fixed-length loop `fixed` (one level deeper), no more."""
  assert [x for x in ours if x[0] == 0] == [(0, 'while')] * 2
  assert [x for x in ours if x[0] == 1] == [(1, 'while')] * widths
  assert [x for x in ours if x[0] > 1] == sorted([(d + 1, p) for d, p in _nested(fixed)] * widths)


def test_one_width_is_one_loop_and_no_loop_switches_widths(pair):
  """`AdaptiveGamma.one_width`: one loop, for its one width; without it, one per width (6 at
  gamma_max 8); and in neither a `cond` over the widths."""
  model, params, target, enc, table = pair
  draft = NgramDraft(model.config.vocab_size)
  for one_width in (False, True):
    policy = AdaptiveGamma(gamma_max=8, policy='fixed', gamma_init=8, one_width=one_width)
    tstate = target.init(params, enc, cache_length(MAX_LEN, policy.call_tokens))
    fun = lambda ts, ds, rng, p=policy: adaptive.decode(target, ts, draft, ds, rng, adaptive=p,
                                                        max_decode_len=MAX_LEN)
    args = (tstate, draft.init(table), jax.random.PRNGKey(0))
    widths = len(policy.verify_widths)
    assert widths == (1 if one_width else 6)  # 1, 2, 3, 4, 6, 8
    assert [x for x in _loops(fun, *args) if x[0] == 1] == [(1, 'while')] * widths
    assert _switches(jax.make_jaxpr(fun)(*args).jaxpr, 6) == 0


def test_tree_loop_is_a_loop_per_width(pair):
  model, params, target, enc, table = pair
  ad = AdaptiveTree.parse('best:auto:8,depth:3,width:2', cost_ratio=0.1,
                          verify_ratio=(1.0, 1.05, 1.2, 1.6))
  draft = NgramTreeDraft(model.config.vocab_size)
  tstate = target.init(params, enc, cache_length(MAX_LEN, ad.call_tokens))
  args = (tstate, draft.init(table, ad.shape), jax.random.PRNGKey(0))
  ours = _loops(lambda ts, ds, rng: adaptive_tree.decode(
      target, ts, draft, ds, rng, adaptive=ad, max_decode_len=MAX_LEN), *args)
  fixed = _loops(lambda ts, ds, rng: tree_speculative.decode(
      target, ts, draft, ds, rng, shape=ad.shape, max_decode_len=MAX_LEN), *args)
  _assert_a_loop_per_width(ours, fixed, len(ad.widths))


@pytest.mark.parametrize('widths', [(8,), (1, 2, 3, 4, 6, 8), (1, 2, 4, 8, 16)])
def test_width_index_is_searchsorted(widths):
  longest = jnp.arange(-1, max(widths) + 3)
  got = jax.vmap(lambda x: adaptive.width_index(widths, x))(longest)
  np.testing.assert_array_equal(got, np.searchsorted(np.asarray(widths), np.asarray(longest)))
  assert got.dtype == jnp.int32
