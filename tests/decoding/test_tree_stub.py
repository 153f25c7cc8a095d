"""Tree speculative sampling on fixed probability tables: exact distributions of whole sequences.

As `test_speculative_stub.py`: target and draft are `TableDecoder`s (logits by position and current
token), so the exact distribution of the first three tokens is a product of three table rows. The
tree loop (growth, one-call verification, path compaction in both caches) must reproduce it for
every tree shape and sampling method (chi-square, fixed seeds, p > 1e-3).
"""

import jax
import numpy as np
import pytest

from gqa_spec.decoding import sampling, speculative, tree_speculative
from gqa_spec.decoding.drafts import NgramTreeDraft, fit_ngram
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import cache_length
from tests.decoding.conftest import TableDecoder
from gqa_spec.decoding.tree import TreeShape
from tests.decoding.test_speculative_stub import (N, NO_EOS, P_VALUE_THRESHOLD, _chain_table,
                                                  _chisquare, _empirical, _exact_first_three,
                                                  _tables)

TARGET = TableDecoder()
DRAFT = TreeModelDraft(TableDecoder())


def _run(p_table, q_table, config, shape, max_len=3, batch=N, seed=0):
  ts = TARGET.init(p_table, batch, cache_length(max_len, shape.num_nodes + 1))
  ds = DRAFT.init_state(TableDecoder().init(q_table, batch, DRAFT.cache_slots(max_len, shape)),
                        shape)
  return tree_speculative.decode(TARGET, ts, DRAFT, ds, jax.random.PRNGKey(seed), shape=shape,
                                 max_decode_len=max_len, config=config, eos_id=NO_EOS)


@pytest.mark.parametrize('spec, config', [
    ('topk:3,2', SamplingConfig(temperature=1.0)),
    ('topk:2,2,2', SamplingConfig(temperature=0.7, top_k=3)),
    ('best:6,depth:3,width:2', SamplingConfig(temperature=1.0, top_p=0.8)),
    # SpecInfer's with-replacement variant: siblings i.i.d. from the parent's q.
    ('topk:3,2,replace', SamplingConfig(temperature=1.0)),
    ('best:6,depth:3,width:2,replace', SamplingConfig(temperature=0.8, top_k=4, top_p=0.9)),
])
def test_first_three_tokens_follow_the_target_distribution(spec, config):
  p, q = _tables()
  result = _run(p, q, config, TreeShape.parse(spec))
  seqs = np.asarray(result.sequences)
  assert (np.asarray(result.lengths) == 3).all()
  s = speculative.summarize(result)
  assert 0 < s['accept_histogram'][0] < s['target_calls']  # full rejection and acceptance both
  assert _chisquare(_empirical(seqs), _exact_first_three(p, config)) > P_VALUE_THRESHOLD


def test_more_children_accept_more_than_the_chain():
  p, q = _tables()
  config = SamplingConfig(temperature=1.0)
  rates = [speculative.summarize(_run(p, q, config, TreeShape.parse(spec), batch=2000))
           ['mean_tokens_per_call'] for spec in ('topk:1,1', 'topk:3,3')]
  assert rates[1] > rates[0] + 0.1, rates


def test_statistics_match_a_hand_computed_greedy_case():
  # Target: start -> 2 -> 3 -> 4 -> EOS(1). Draft's first, second choices: start -> 2, 4;
  # 2 -> 3, 1; 3 -> 2, 1; 4 -> 2, 1; 1 -> 2, 3.
  target = _chain_table([(0, 2), (2, 3), (3, 4), (4, 1), (1, 1)])
  draft = _chain_table([(0, 2), (2, 3), (3, 2), (4, 2), (1, 2)])
  for a, b in [(0, 4), (2, 1), (3, 1), (4, 1), (1, 3)]:
    draft[0, a, b] = -1.0
  shape = TreeShape.topk(2, 2)
  ts = TARGET.init(target, 1, 32)
  ds = DRAFT.init_state(TableDecoder().init(draft, 1, 32), shape)
  result = tree_speculative.decode(TARGET, ts, DRAFT, ds, jax.random.PRNGKey(0), shape=shape,
                                   max_decode_len=10)
  # Call 1: tree {2: {3, 1}, 4: {2, 1}} accepts 2, 3 and adds 4. Call 2 (after 4): tree
  # {2: {3, 1}, 1: {2, 3}} rejects 2, accepts its sibling 1 (EOS), rejects 1's children: the row
  # ends after 4 tokens.
  assert np.asarray(result.sequences)[0, :6].tolist() == [0, 2, 3, 4, 1, 0]
  s = speculative.summarize(result)
  assert (s['tokens'], s['target_calls'], s['proposed'], s['accepted']) == (4, 2, 12, 3)
  assert s['accept_histogram'] == [0, 1, 1]
  assert s['accepted_per_position'] == [2, 1]  # per depth
  assert s['alpha'] is None


def test_deterministic_bigram_trees_are_lossless():
  p, _ = _tables()
  rng = np.random.RandomState(0)
  ngram = fit_ngram([rng.randint(0, 6, size=12) for _ in range(30)], 2, 6)
  shape, config = TreeShape.topk(2, 2), SamplingConfig(temperature=1.0, top_p=0.9)
  draft = NgramTreeDraft(6)
  ts = TARGET.init(p, N, cache_length(3, shape.num_nodes + 1))
  result = tree_speculative.decode(TARGET, ts, draft, draft.init(ngram, shape),
                                   jax.random.PRNGKey(0), shape=shape, max_decode_len=3,
                                   config=config, eos_id=NO_EOS)
  s = speculative.summarize(result)
  assert 0 < s['accept_histogram'][0] < s['target_calls']
  assert _chisquare(_empirical(np.asarray(result.sequences)),
                    _exact_first_three(p, config)) > P_VALUE_THRESHOLD
