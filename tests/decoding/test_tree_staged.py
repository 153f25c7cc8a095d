"""Staged trees: a bigram second stage inside `TreeModelDraft` changes which draft calls run, never
the proposals.

Table stubs (as `test_tree_stub.py`): whole tree-loop runs with and without the second stage are
identical for the same rng (greedy and temperature 1, several shapes, ragged batches), a bigram that
always names the draft's argmax skips levels (exact call counts) and one that never does skips
none, and the output of the loop with a staged tree draft follows the target's exact distribution
(chi-square, fixed seeds, p > 1e-3). Tiny T5 (as `test_tree_t5.py`): greedy token identity with
autoregressive decoding for MHA/GQA/MQA with the real cache bookkeeping (chain slots, path moves).

XLA compiles are most of the time (each decoding loop is one compile per static draft, tree shape,
config and array shapes), so the cases share what they can: the table tests use one batch, length
and table size, tree drafts' methods run jitted (eagerly, each of their ops is a compile of its
own: ~400 in the T5 commit test alone), and the T5 drafts' bigrams come from one batch of 4 per
model: 771 compiles -> 147, 90 -> 76 s of CPU on 2 cores (both versions run side by side,
2026-11-25; 237 -> 146 s of wall time under a heavier load). The rest is mostly the 10 T5 tree
loops (a plain and a staged one per case) and the 3 models' inits, which the cases need.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import autoregressive, sampling, speculative, tree_speculative
from gqa_spec.decoding.drafts import fit_ngram
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.errors import UserError
from tests.decoding.conftest import INPUTS, MAX_LEN, model_and_params, TableDecoder, VOCAB
from tests.decoding.test_speculative_stub import (N, NO_EOS, P_VALUE_THRESHOLD, V, _chisquare,
                                                  _empirical, _exact_first_three, _tables)
from tests.decoding.test_speculative_t5 import KV_HEADS, greedy_reference, perturbed_params

TARGET = TableDecoder()
# One batch, length and table size for the table-stub loops: a loop compiles once per static draft,
# shape and config AND array shapes, so the two tests that run the greedy `topk:3,1,1,1` tree
# without a second stage share that compile.
BATCH, MAX_DECODE, POSITIONS = 8, 11, 12
FIELDS = ('sequences', 'lengths', 'target_calls', 'proposed', 'accepted', 'accepted_per_position',
          'accept_histogram', 'loop_iterations')


def _run(p, q, config, shape, g2, successor, max_len, batch, seed=0):
  draft = TreeModelDraft(TableDecoder(), g2)
  ds = draft.init_state(TableDecoder().init(q, batch, draft.cache_slots(max_len, shape)), shape,
                        None if g2 == 0 else successor)
  ts = TARGET.init(p, batch, cache_length(max_len, shape.num_nodes + 1))
  return tree_speculative.decode(TARGET, ts, draft, ds, jax.random.PRNGKey(seed), shape=shape,
                                 max_decode_len=max_len, config=config, eos_id=NO_EOS)


@functools.partial(jax.jit, static_argnames=('draft', 'shape', 'config'))
def _propose(draft, state, sequences, lengths, rng, *, shape, config):
  """`draft.propose_tree`, jitted as inside the loop (eagerly, every op is an XLA compile)."""
  return draft.propose_tree(state, sequences, lengths, rng, shape, config)


@functools.partial(jax.jit, static_argnames=('draft',))
def _commit(draft, state, sequences, lengths, path):
  """`draft.commit_tree`, jitted (as `_propose`)."""
  return draft.commit_tree(state, sequences, lengths, path)


def _position_tables(seed=3, positions=POSITIONS, noise=0.15):
  """Target and draft tables over 12 positions; the draft is a position-free table plus noise,
  so the bigram `argmax(base)` names the draft's argmax often but not always."""
  rng = np.random.RandomState(seed)
  base = rng.normal(size=(V, V)) * 2.0
  q = base[None] + rng.normal(size=(positions, V, V)) * noise
  p = q + rng.normal(size=q.shape) * 1.5
  return p.astype(np.float32), q.astype(np.float32), np.argmax(base, axis=-1).astype(np.int32)


@pytest.mark.parametrize('spec', ['topk:3,1,1,1', 'topk:2,2,1', 'best:6,depth:3,width:2'])
@pytest.mark.parametrize('config', [sampling.GREEDY, SamplingConfig(temperature=1.0)],
                         ids=['greedy', 't1'])
def test_the_second_stage_leaves_every_proposal_unchanged(spec, config):
  p, q, succ = _position_tables()
  shape = TreeShape.parse(spec)
  plain = _run(p, q, config, shape, 0, None, MAX_DECODE, BATCH)
  staged = _run(p, q, config, shape, 2, succ, MAX_DECODE, BATCH)
  for field in FIELDS:  # same trees => same acceptances => the same run, statistics included
    np.testing.assert_array_equal(getattr(staged, field), getattr(plain, field), err_msg=field)
  s = speculative.summarize(plain)
  assert 0 < s['accepted'] < s['proposed']
  if not config.greedy:  # (greedy table rows are all alike; the T5 test below is ragged)
    assert len(set(s['acceptance_rate_per_row'])) > 1  # ragged: rows accept different lengths
  assert int(staged.draft_calls) <= int(plain.draft_calls)
  assert int(plain.draft_calls) == shape.depth * int(plain.loop_iterations)  # root + D - 1 levels
  if spec == 'topk:3,1,1,1' and config.greedy:  # a single child per node: levels can be covered
    assert int(staged.draft_calls) < int(plain.draft_calls)


def test_one_proposal_has_the_same_tree_and_q():
  p, q, succ = _position_tables()
  shape, batch, config = TreeShape.parse('topk:2,1,1'), 6, SamplingConfig(temperature=0.8, top_k=4)
  seqs = jnp.asarray(np.random.RandomState(0).randint(0, V, size=(batch, 12)), jnp.int32)
  lengths = jnp.arange(batch, dtype=jnp.int32) % 3  # ragged prefixes
  trees = []
  for g2, s in ((0, None), (3, succ)):
    draft = TreeModelDraft(TableDecoder(), g2)
    state = draft.init_state(TableDecoder().init(q, batch, 40), shape, s)
    state = state.replace(decoder_state=TableDecoder().rollback(state.decoder_state, lengths))
    tree, _ = _propose(draft, state, seqs, lengths, jax.random.PRNGKey(1), shape=shape,
                       config=config)
    trees.append(jax.device_get(tree))
  for field in ('tokens', 'parents', 'depths', 'valid', 'q'):
    np.testing.assert_array_equal(getattr(trees[1], field), getattr(trees[0], field), field)


@pytest.mark.parametrize('spec, g2, calls_per_tree', [
    ('topk:1,1,1,1', 2, 2),  # the root, then level 1 with its chain; levels 2, 3 cached
    ('topk:3,1,1,1', 3, 2),
    ('topk:3,1,1,1', 1, 3),  # a chain of 1 covers level 2 only
])
def test_a_bigram_that_names_the_argmax_skips_levels_and_one_that_never_does_skips_none(
    spec, g2, calls_per_tree):
  _, q = _tables()
  # Position-free (the argmax successor is a bigram); as many positions as `_position_tables`, so
  # the plain greedy topk:3,1,1,1 loop is the compile of the test above.
  q = np.tile(q[-1:], (POSITIONS, 1, 1))
  p = q + np.random.RandomState(1).normal(size=q.shape).astype(np.float32)
  shape = TreeShape.parse(spec)
  plain = _run(p, q, sampling.GREEDY, shape, 0, None, MAX_DECODE, BATCH)
  always = _run(p, q, sampling.GREEDY, shape, g2, np.argmax(q[0], axis=-1), MAX_DECODE, BATCH)
  never = _run(p, q, sampling.GREEDY, shape, g2, np.argmin(q[0], axis=-1), MAX_DECODE, BATCH)
  iters = int(plain.loop_iterations)
  assert int(plain.draft_calls) == 4 * iters
  assert int(always.draft_calls) == calls_per_tree * iters
  assert int(never.draft_calls) == 4 * iters
  for run in (always, never):
    np.testing.assert_array_equal(run.sequences, plain.sequences)


def test_loop_with_a_staged_tree_draft_is_lossless():
  p, _ = _tables()
  rng = np.random.RandomState(5)
  succ = rng.randint(0, V, size=V)
  # A position-free draft whose argmax after x is succ[x] by a wide margin: level 2 is cached in
  # (almost) every call, so the outputs are verified against cached draft logits.
  q = rng.normal(size=(V, V)) + 20.0 * np.eye(V)[succ]
  q = np.tile(q[None], (3, 1, 1)).astype(np.float32)
  config, shape = SamplingConfig(temperature=1.0), TreeShape.parse('topk:2,1,1')
  result = _run(p, q, config, shape, 2, succ, 3, N)
  assert int(result.draft_calls) < shape.depth * int(result.loop_iterations)
  s = speculative.summarize(result)
  assert 0 < s['accept_histogram'][0] < s['target_calls']
  assert _chisquare(_empirical(np.asarray(result.sequences)),
                    _exact_first_three(p, config)) > P_VALUE_THRESHOLD


def test_successor_table_is_required_exactly_with_a_second_stage():
  shape = TreeShape.topk(2)
  state = TableDecoder().init(np.zeros((1, V, V), np.float32), 1, 8)
  with pytest.raises(UserError, match='needs a bigram'):
    TreeModelDraft(TableDecoder(), 2).init_state(state, shape)
  with pytest.raises(UserError, match='needs no bigram'):
    TreeModelDraft(TableDecoder()).init_state(state, shape, np.zeros(V, np.int32))
  with pytest.raises(UserError, match='inner_gamma'):
    TreeModelDraft(TableDecoder(), -1)


def _t5_run(kind, shape, g2, successor, rows):
  model, params = model_and_params(KV_HEADS[kind])
  target, enc = T5Decoder(model), jnp.asarray(INPUTS[rows])
  draft = TreeModelDraft.t5(model, g2)
  return tree_speculative.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, shape.num_nodes + 1)),
      draft, draft.init(perturbed_params(kind), enc, MAX_LEN, shape, successor),
      jax.random.PRNGKey(0), shape=shape, max_decode_len=MAX_LEN)


@functools.lru_cache(maxsize=None)
def _draft_outputs(kind):
  """The draft's own greedy outputs for all of INPUTS: rows decode independently, so one batch of
  4 serves every case's rows (checked: the same bigrams as decoding each case's rows alone), and
  its compile is `greedy_reference`'s (the same model and shapes), not one per batch of one."""
  model, _ = model_and_params(KV_HEADS[kind])
  dec, enc = T5Decoder(model), jnp.asarray(INPUTS)
  own = autoregressive.decode(dec, dec.init(perturbed_params(kind), enc, MAX_LEN + 1),
                              jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
  return np.asarray(own.sequences), np.asarray(own.lengths)


def _draft_bigram(kind, rows):
  """The bigram the paper would fit: on the draft's own greedy outputs (for these inputs)."""
  seqs, lengths = _draft_outputs(kind)
  return fit_ngram(autoregressive.strip(seqs[rows], lengths[rows]), 2, VOCAB).successor()


ALL_ROWS = list(range(len(INPUTS)))


# Batches of 4 are ragged, but a level is skipped only if all 4 rows' nodes are covered, which
# these untrained pairs never reach; batches of one (inputs chosen so) skip levels, so the chain slots'
# cache entries, masks and path moves are exercised for real there.
@pytest.mark.parametrize('kind, spec, rows', [
    ('mha', 'topk:2,1,1', ALL_ROWS), ('mqa', 'best:6,depth:3,width:2', ALL_ROWS),
    ('mha', 'topk:2,1,1', [3]), ('gqa', 'topk:2,1,1', [2]), ('mqa', 'topk:1,1,1', [3])])
def test_t5_staged_tree_is_exact_and_proposes_what_the_tree_draft_proposes(kind, spec, rows):
  shape = TreeShape.parse(spec)
  staged = _t5_run(kind, shape, 2, _draft_bigram(kind, rows), rows)
  plain = _t5_run(kind, shape, 0, None, rows)
  ref_seqs, ref_lengths = greedy_reference(kind, len(INPUTS))
  np.testing.assert_array_equal(np.asarray(staged.lengths), ref_lengths[rows])
  np.testing.assert_array_equal(np.asarray(staged.sequences)[:, :MAX_LEN + 1], ref_seqs[rows])
  for field in ('target_calls', 'accepted', 'accept_histogram'):
    np.testing.assert_array_equal(getattr(staged, field), getattr(plain, field), err_msg=field)
  if len(rows) > 1:
    assert 0 < int(plain.accepted.sum()) < int(plain.target_calls.sum()) * shape.depth  # partial
    assert len(set(plain.accepted.tolist())) > 1  # ragged
    assert int(staged.draft_calls) <= int(plain.draft_calls)
  else:
    assert int(staged.draft_calls) < int(plain.draft_calls)


def test_t5_commit_leaves_the_draft_cache_of_the_plain_tree_draft():
  """Covered nodes live in their parent's chain slots: committing a path through one must leave
  the same K/V, positions and index as the plain draft (which fed the node itself)."""
  kind, shape, rows = 'mha', TreeShape.parse('topk:2,1,1'), [3]
  model, _ = model_and_params(KV_HEADS[kind])
  enc, dparams = jnp.asarray(INPUTS[rows]), perturbed_params(kind)
  seqs = jnp.zeros((1, MAX_LEN + 8), jnp.int32)
  zero = jnp.zeros((1,), jnp.int32)
  plain = TreeModelDraft.t5(model)
  pstate = plain.init(dparams, enc, MAX_LEN, shape)
  ptree, pstate = _propose(plain, pstate, seqs, zero, jax.random.PRNGKey(0), shape=shape,
                           config=sampling.GREEDY)
  # An oracle bigram for this tree: each level-1 node's successor is its child, and so on, so
  # level 2 is covered and its call skipped.
  tokens, parents = np.asarray(ptree.tokens)[0], np.asarray(ptree.parents)[0]
  succ = np.zeros(VOCAB, np.int32)
  for i in range(len(tokens)):
    if parents[i] >= 0:
      succ[tokens[parents[i]]] = tokens[i]
  staged = TreeModelDraft.t5(model, 2)
  sstate = staged.init(dparams, enc, MAX_LEN, shape, succ)
  stree, sstate = _propose(staged, sstate, seqs, zero, jax.random.PRNGKey(0), shape=shape,
                           config=sampling.GREEDY)
  np.testing.assert_array_equal(stree.tokens, ptree.tokens)
  assert (int(pstate.draft_calls), int(sstate.draft_calls)) == (3, 2)  # root, level 1, (level 2)
  # Accept node 1 (depth 1), its child (depth 2, covered: a chain slot) and its grandchild.
  child = int(np.flatnonzero(parents == 1)[0])
  grandchild = int(np.flatnonzero(parents == child)[0])
  path = jnp.asarray([[1, child, grandchild]], jnp.int32)
  new_seqs = seqs.at[0, 1:5].set(jnp.asarray([tokens[1], tokens[child], tokens[grandchild], 7]))
  lengths = jnp.asarray([4], jnp.int32)
  pstate = _commit(plain, pstate, new_seqs, lengths, path)
  sstate = _commit(staged, sstate, new_seqs, lengths, path)
  pdec, sdec = pstate.decoder_state.cache['decoder'], sstate.decoder_state.cache['decoder']
  index = int(pdec['cache_index'][0])
  assert index == int(sdec['cache_index'][0]) == 3  # s_0, node 1, its child (the leaf: pending)
  np.testing.assert_array_equal(sdec['positions'][:, :index], pdec['positions'][:, :index])
  attn = lambda dec: dec['layers_0']['self_attention']
  np.testing.assert_allclose(attn(sdec)['cached_value'][:, :, :index],
                             attn(pdec)['cached_value'][:, :, :index], atol=1e-5)
  np.testing.assert_allclose(attn(sdec)['cached_key'][..., :index],
                             attn(pdec)['cached_key'][..., :index], atol=1e-5)
  # And the next trees agree too.
  ptree, _ = _propose(plain, pstate, new_seqs, lengths, jax.random.PRNGKey(1), shape=shape,
                       config=sampling.GREEDY)
  stree, _ = _propose(staged, sstate, new_seqs, lengths, jax.random.PRNGKey(1), shape=shape,
                      config=sampling.GREEDY)
  np.testing.assert_array_equal(stree.tokens, ptree.tokens)
