"""Greedy tree speculative decoding of T5 targets is token-identical to greedy autoregressive.

Grid: MHA / GQA-2 / MQA targets x {a top-k tree, a best-first tree} with a perturbed copy of the
target as the tree draft (partial acceptance: rows accept different path lengths, so the batch of 4
is ragged and the accepted paths are scattered over the tree's slots); the target itself as draft
(the greedy path is always in a top-k tree: every call yields D + 1 tokens); batch of one; the
chain tree equals chain speculative decoding's acceptance.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import speculative, tree_speculative
from gqa_spec.decoding.drafts import ModelDraft, NgramTreeDraft, fit_ngram
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.decoding.tree import TreeShape
from tests.decoding.conftest import INPUTS, MAX_LEN, VOCAB, model_and_params
from tests.decoding.test_speculative_t5 import KV_HEADS, greedy_reference, perturbed_params

TOPK = TreeShape.topk(2, 2, 1)
BEST = TreeShape.best(6, depth=3, width=2)


def _run(kind, shape, draft_kind, batch):
  model, params = model_and_params(KV_HEADS[kind])
  target = T5Decoder(model)
  enc = jnp.asarray(INPUTS[:batch])
  draft = TreeModelDraft.t5(model)
  draft_params = params if draft_kind == 'self' else perturbed_params(kind)
  result = tree_speculative.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, shape.num_nodes + 1)),
      draft, draft.init(draft_params, enc, MAX_LEN, shape), jax.random.PRNGKey(0), shape=shape,
      max_decode_len=MAX_LEN)
  ref_seqs, ref_lengths = greedy_reference(kind, batch)
  np.testing.assert_array_equal(np.asarray(result.lengths), ref_lengths)
  np.testing.assert_array_equal(np.asarray(result.sequences)[:, :MAX_LEN + 1], ref_seqs)
  assert not np.asarray(result.sequences)[:, MAX_LEN + 1:].any()
  return speculative.summarize(result)


@pytest.mark.parametrize('kind', ['mha', 'gqa', 'mqa'])
@pytest.mark.parametrize('shape', [TOPK, BEST], ids=['topk', 'best'])
def test_tree_decoding_is_exact_on_ragged_batches(kind, shape):
  s = _run(kind, shape, 'perturbed', 4)
  assert 0.0 < s['accepted'] < s['target_calls'] * shape.depth
  assert len(set(s['acceptance_rate_per_row'])) > 1  # ragged
  assert sum(s['accept_histogram']) == s['target_calls']
  assert s['accepted_per_position'][0] >= s['accepted_per_position'][-1]


def test_self_draft_accepts_the_whole_depth_and_batch_of_one_is_exact():
  s = _run('gqa', TOPK, 'self', 4)
  assert s['accept_histogram'][:-1] == [0] * TOPK.depth  # every call accepts D nodes
  _run('mqa', BEST, 'perturbed', 1)


def test_chain_tree_accepts_what_chain_speculation_accepts():
  model, params = model_and_params(KV_HEADS['gqa'])
  target, enc, gamma = T5Decoder(model), jnp.asarray(INPUTS), 3
  chain = speculative.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, 8)),
      ModelDraft.t5(model), ModelDraft.t5(model).decoder.init(perturbed_params('gqa'), enc,
                                                              MAX_LEN + 7 + 2),
      jax.random.PRNGKey(0), gamma=gamma, max_decode_len=MAX_LEN)
  s = _run('gqa', TreeShape.topk(*(1,) * gamma), 'perturbed', 4)
  c = speculative.summarize(chain)
  for key in ('tokens', 'target_calls', 'accepted', 'accept_histogram', 'accepted_per_position'):
    assert s[key] == c[key], key


def test_bigram_tree_draft_is_exact():
  model, params = model_and_params(KV_HEADS['mha'])
  target, enc, shape = T5Decoder(model), jnp.asarray(INPUTS), TreeShape.topk(3, 2)
  seqs, lengths = greedy_reference('mha', len(INPUTS))
  ngram = fit_ngram([s[1:1 + n] for s, n in zip(seqs[:2], lengths[:2])], 2, VOCAB)  # 2 rows seen
  draft = NgramTreeDraft(VOCAB)
  result = tree_speculative.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, shape.num_nodes + 1)),
      draft, draft.init(ngram, shape), jax.random.PRNGKey(0), shape=shape, max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(np.asarray(result.sequences)[:, :MAX_LEN + 1], seqs)
  s = speculative.summarize(result)
  assert 0 < s['accepted'] and s['accept_histogram'][0] > 0
