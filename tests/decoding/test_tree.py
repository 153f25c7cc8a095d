"""Token trees: shapes, growth (top-k and best-first), attention mask, and verification alone.

Growth is driven by a table "draft" whose logits depend on the fed token only, so every tree can be
enumerated by hand; verification's losslessness is tested on the first emitted token against the
target's exact distribution (chi-square, fixed seeds, p > 1e-3).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from gqa_spec.decoding import sampling, tree as tree_lib
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.errors import UserError

V = 7
P_VALUE_THRESHOLD = 1e-3


def test_shapes_parse_and_count_nodes():
  s = TreeShape.parse('topk:4,2,2')
  assert (s.num_nodes, s.depth, s.num_fed) == (4 + 8 + 16, 3, 4 + 8)
  b = TreeShape.parse('best:32,depth:6')
  assert (b.num_nodes, b.depth, b.frontier, b.num_fed) == (32, 6, 4, 4 * 5)
  assert b.num_candidates == 4 + 5 * 16
  assert TreeShape.parse('best:5,depth:2,width:3').describe() == 'best:5,depth:2,width:3'
  for spec in ('topk:4,2,2,replace', 'best:5,depth:2,width:3,replace'):
    shape = TreeShape.parse(spec)
    assert shape.replace and shape.describe() == spec
    assert shape.num_nodes == TreeShape.parse(spec[:-len(',replace')]).num_nodes
  assert not TreeShape.parse('topk:4,2').replace
  for bad in ['topk:', 'topk:2,0', 'best:32', 'best:100,depth:2,width:2', 'chain:3',
              'topk:2,replace,2', 'best:5,replace,depth:2', 'topk:2,replaced']:
    with pytest.raises(UserError):
      TreeShape.parse(bad)


def _table(seed=0):
  return np.random.RandomState(seed).normal(size=(V, V)).astype(np.float32) * 2  # [token, V]


def _grow(shape, root_logits, table, config=sampling.GREEDY, seed=0):
  fed_log = []

  def feed(carry, tokens, parent, d):
    fed_log.append((tokens.shape[1], d))  # static: traced once
    return jnp.asarray(table)[tokens], parent  # [b, F, V]; carry: the last level's parents

  run = jax.jit(lambda root: tree_lib.grow(shape, jax.random.PRNGKey(seed), root, feed,
                                           jnp.zeros((1, 1), jnp.int32), config))
  tree, fed, last_parent = run(jnp.asarray(root_logits))
  return jax.device_get(tree), np.asarray(fed), (fed_log, np.asarray(last_parent))


def test_topk_tree_is_the_top_k_expansion_with_static_parents():
  table = _table()
  root = table[0][None]  # [1, V]
  tree, fed, (log, last_parent) = _grow(TreeShape.topk(3, 2), root, table)
  top = lambda logits, k: list(np.argsort(-logits)[:k])
  level1 = top(root[0], 3)
  assert tree.tokens[0, :3].tolist() == level1
  assert tree.tokens[0, 3:].tolist() == sum((top(table[t], 2) for t in level1), [])
  assert tree.parents[0].tolist() == [-1, -1, -1, 0, 0, 1, 1, 2, 2]
  assert tree.depths[0].tolist() == [1, 1, 1, 2, 2, 2, 2, 2, 2]
  assert fed[0].tolist() == [0, 1, 2] + [-1] * 6  # the last level is never fed
  assert log == [(3, 1)] and last_parent.tolist() == [[-1, -1, -1]]  # one call: depth 1
  assert tree.valid.all()


def test_best_first_tree_matches_brute_force_enumeration():
  table = _table(1)
  root = table[3][None]
  width, depth, budget = 2, 3, 6
  tree, _, (log, last_parent) = _grow(TreeShape.best(budget, depth, width), root, table)
  logp = lambda logits: jax.nn.log_softmax(jnp.asarray(logits)).tolist()
  # EAGLE-2 by hand: expand the `width` best of each level, keep the `budget` best of all.
  frontier, candidates = [((), 0.0)], []
  for d in range(depth):
    level = []
    for path, score in frontier:
      logits = root[0] if not path else table[path[-1]]
      lp = logp(logits)
      for tok in np.argsort(-np.asarray(lp))[:width]:
        level.append((path + (int(tok),), score + lp[tok]))
    candidates += level
    frontier = sorted(level, key=lambda c: -c[1])[:width]
  best = {path for path, _ in sorted(candidates, key=lambda c: -c[1])[:budget]}
  got = set()
  for i in range(budget):
    path, j = [], i
    while j >= 0:
      path.append(int(tree.tokens[0, j]))
      assert tree.parents[0, j] < j  # parents first
      j = tree.parents[0, j]
    got.add(tuple(reversed(path)))
    assert len(path) == tree.depths[0, i]
  assert got == best
  assert log == [(width, 1), (width, 2)]  # one draft call per expanded level
  assert ((last_parent >= 0) & (last_parent < width)).all()  # indices into the previous level


def test_attention_mask_is_ancestors_and_self():
  parents = np.array([[-1, -1, 0, 0, 1, 2, 5]])
  mask = np.asarray(tree_lib.attention_mask(jnp.asarray(parents), depth=4))[0]
  for i in range(8):
    anc, j = {0, i}, i - 1
    while j >= 0:
      anc.add(j + 1)
      j = parents[0, j]
    assert set(np.flatnonzero(mask[i])) == anc, i


def test_greedy_verification_follows_the_target_argmax():
  # Tree: 0:a=2, 1:b=3 (siblings), 2:c=4 under b, 3:d=5 under b.
  tokens = jnp.array([[2, 3, 4, 5]])
  tree = tree_lib.Tree(tokens=tokens, parents=jnp.array([[-1, -1, 1, 1]]),
                       depths=jnp.array([[1, 1, 2, 2]]), valid=jnp.ones((1, 4), bool),
                       q=jnp.zeros((1, 4, V)))
  argmax = [3, 0, 5, 0, 0]  # after root: 3 (b); after b: 5 (d); after d: 0
  logits = jax.nn.one_hot(jnp.array([argmax]), V) * 5.0  # [1, 5, V]
  path, count, token = tree_lib.verify(jax.random.PRNGKey(0), tree, logits, 2, sampling.GREEDY)
  assert path.tolist() == [[1, 3]] and count.tolist() == [2] and token.tolist() == [0]


def _first_token_counts(shape, config, n=30_000, seed=0):
  """Grows n trees from the draft table, verifies against the target table, first tokens."""
  p_table, q_table = _table(2), _table(2) + _table(3)
  root_q = np.broadcast_to(q_table[0], (n, V))
  tree, _, _ = _grow(shape, root_q, q_table, config, seed)
  target = np.concatenate([p_table[0][None].repeat(n, 0)[:, None],
                           p_table[np.asarray(tree.tokens)]], axis=1)  # [n, N + 1, V]
  path, count, token = tree_lib.verify(jax.random.PRNGKey(seed + 1), tree, jnp.asarray(target),
                                       shape.depth, config)
  path, count, token = map(np.asarray, (path, count, token))
  first = np.where(count > 0, np.asarray(tree.tokens)[np.arange(n), np.maximum(path[:, 0], 0)],
                   token)
  exact = np.asarray(sampling.adjust_logits(jnp.asarray(p_table[0]), config), np.float64)
  return np.bincount(first, minlength=V), exact, count


@pytest.mark.parametrize('spec, config', [
    ('topk:3,2', SamplingConfig(temperature=1.0)),
    ('topk:4', SamplingConfig(temperature=0.8, top_k=3)),  # more children than q's support
    ('best:5,depth:2,width:3', SamplingConfig(temperature=1.0, top_p=0.9)),
    ('topk:4,2,replace', SamplingConfig(temperature=1.0)),  # SpecInfer: i.i.d. siblings
    ('best:5,depth:2,width:3,replace', SamplingConfig(temperature=0.8, top_k=3)),
])
def test_multi_candidate_rejection_emits_the_target_distribution(spec, config):
  counts, exact, count = _first_token_counts(TreeShape.parse(spec), config)
  assert counts[exact == 0].sum() == 0
  big = exact > 0
  pvalue = stats.chisquare(counts[big], exact[big] / exact[big].sum() * counts.sum()).pvalue
  assert pvalue > P_VALUE_THRESHOLD, (counts, exact * counts.sum())
  assert 0.05 < np.mean(count > 0) < 0.95  # acceptance and full rejection both exercised


def test_tree_children_are_distinct_draws_without_replacement():
  config = SamplingConfig(temperature=1.0)
  tree, _, _ = _grow(TreeShape.topk(4, 2), np.broadcast_to(_table()[0], (500, V)), _table(), config)
  tokens, parents = np.asarray(tree.tokens), np.asarray(tree.parents)
  same_parent = parents[:, :, None] == parents[:, None, :]  # [b, N, N]
  same_token = tokens[:, :, None] == tokens[:, None, :]
  assert not (same_parent & same_token & ~np.eye(tokens.shape[1], dtype=bool)).any()
  # q of a later sibling excludes the earlier ones and is normalised.
  q = np.asarray(tree.q)
  assert np.allclose(q.sum(-1), 1.0, atol=1e-5)
  for i, j in itertools.combinations(range(4), 2):
    assert (q[np.arange(500), j, tokens[:, i]] == 0).all()


def test_with_replacement_siblings_repeat_share_the_parent_q_and_greedy_is_unchanged():
  config, n = SamplingConfig(temperature=1.0), 500
  root = np.broadcast_to(_table()[0], (n, V))
  tree, _, _ = _grow(TreeShape.parse('topk:4,2,replace'), root, _table(), config)
  tokens, parents, q = np.asarray(tree.tokens), np.asarray(tree.parents), np.asarray(tree.q)
  first = tokens[:, :4]  # the root's 4 children
  assert (np.array([len(set(row)) for row in first]) < 4).mean() > 0.2  # repeats happen
  np.testing.assert_allclose(q[:, :4], np.broadcast_to(q[:, :1], q[:, :4].shape))  # parent's q
  exact = np.asarray(sampling.adjust_logits(jnp.asarray(_table()[0]), config))
  np.testing.assert_allclose(q[0, 0], exact, atol=1e-6)
  assert (parents[:, 4:] >= 0).all() and np.asarray(tree.valid).all()
  for spec in ('topk:3,2', 'best:5,depth:2,width:3'):  # temperature 0: the top-k either way
    plain = _grow(TreeShape.parse(spec), _table()[0][None], _table())[0]
    replaced = _grow(TreeShape.parse(spec + ',replace'), _table()[0][None], _table())[0]
    for field in ('tokens', 'parents', 'depths', 'valid'):
      np.testing.assert_array_equal(getattr(replaced, field), getattr(plain, field))
