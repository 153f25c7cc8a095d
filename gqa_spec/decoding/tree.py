"""Token trees of static shape: their growth by a draft, attention mask, positions and verification.

A tree hangs under each row's last token (the root). Its N nodes are listed parents first, siblings
in draw order; each has a parent (-1 = the root), a depth, a token, a validity flag and q, the
distribution it was drawn from given its earlier siblings. Two jit-static shapes:

  topk:k_1,...,k_D           every node of depth d-1 gets its k_d most likely children (Medusa,
                             Sequoia); N = k_1 + k_1 k_2 + ...
  best:N,depth:D[,width:W]   best-first (EAGLE-2): each level expands the W frontier nodes of
                             highest cumulative draft probability, keeping the best N (W = 4).

`,replace` (SpecInfer) draws children i.i.d. from q under sampling; otherwise they are a Gumbel
top-k draw without replacement (the top-k tokens at temperature 0). The draft runs once per level
on the whole frontier (`grow`). Best-first ranks a node by its parent's sorted q at its rank, so a
node's existence never depends on its own draw, which the lossless rejection below needs.

`verify` walks each row down its tree with Sequoia's multi-candidate rule: children are tried in
order, child x accepted with probability min(1, p(x) / q_x(x)), on rejection p <- norm(max(0,
p - q_x)); when all are rejected (or a leaf is accepted) the next token is drawn from p. Each child
is an ordinary speculative sample of the current p, so the emitted token is distributed exactly
as p. At temperature 0 a child is accepted iff it is the target's argmax.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Optional, Tuple

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding import sampling
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.errors import UserError

PyTree = Any
_LOG_ZERO = -1e30  # log of a zero probability, finite so that sums of scores stay ordered


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """A static tree shape (hashable: a `jax.jit` static argument).

  Attributes:
    branching: `(k_1, ..., k_D)` children per expanded node at each depth.
    frontier: nodes expanded per level (best-first); None = all of them (top-k trees).
    budget: nodes kept (best-first); None = all candidates (top-k trees).
    replace: under sampling, draw children i.i.d. with replacement, each with its parent's q
      (SpecInfer); greedy and deterministic drafts are unaffected (top-k children either way).
  """

  branching: Tuple[int, ...]
  frontier: Optional[int] = None
  budget: Optional[int] = None
  replace: bool = False

  def __post_init__(self):
    if not self.branching or any(int(k) != k or k < 1 for k in self.branching):
      raise UserError(f'tree branching must be positive integers, got {self.branching}')
    if self.frontier is not None and self.frontier < 1:
      raise UserError(f'tree width must be >= 1, got {self.frontier}')
    if self.budget is not None and not 1 <= self.budget <= self.num_candidates:
      raise UserError(f'a tree of depth {self.depth} and width {self.frontier} has '
                      f'{self.num_candidates} candidates; budget {self.budget} must be in '
                      f'[1, {self.num_candidates}]')

  @classmethod
  def topk(cls, *branching: int, replace: bool = False) -> 'TreeShape':
    return cls(tuple(branching), replace=replace)

  @classmethod
  def best(cls, nodes: int, depth: int, width: int = 4, replace: bool = False) -> 'TreeShape':
    if depth < 1 or width < 1:
      raise UserError(f'best-first trees need depth >= 1 and width >= 1, got {depth}, {width}')
    return cls((width,) * depth, frontier=width, budget=nodes, replace=replace)

  @classmethod
  def parse(cls, spec: str) -> 'TreeShape':
    """`topk:4,2,2[,replace]` or `best:32,depth:6[,width:4][,replace]` (the CLI's `--tree`)."""
    m = re.fullmatch(r'topk:(\d+(?:,\d+)*)(,replace)?', spec)
    if m:
      return cls.topk(*(int(k) for k in m.group(1).split(',')), replace=bool(m.group(2)))
    m = re.fullmatch(r'best:(\d+),depth:(\d+)(?:,width:(\d+))?(,replace)?', spec)
    if m:
      return cls.best(int(m.group(1)), int(m.group(2)), int(m.group(3) or 4),
                      replace=bool(m.group(4)))
    auto = (' (best:auto trees size themselves: `generate --tree` and `adaptive_tree.decode` only)'
            if spec.startswith('best:auto') else '')
    raise UserError(f'tree must be topk:K1,K2,...[,replace] or best:N,depth:D[,width:W][,replace]; '
                    f'got {spec!r}{auto}')

  @property
  def depth(self) -> int:
    return len(self.branching)

  def level_sizes(self) -> Tuple[Tuple[int, int], ...]:
    """`((candidates C_d, expanded F_d), ...)` for d = 1..D (F_D: expanded if there were more)."""
    sizes, expanded = [], 1
    for k in self.branching:
      cand = expanded * k
      expanded = cand if self.frontier is None else min(self.frontier, cand)
      sizes.append((cand, expanded))
    return tuple(sizes)

  @property
  def num_candidates(self) -> int:
    return sum(c for c, _ in self.level_sizes())

  @property
  def num_nodes(self) -> int:
    """N, the tree's node budget."""
    return self.num_candidates if self.budget is None else self.budget

  @property
  def num_fed(self) -> int:
    """Nodes the draft is run on (expanded nodes of depths 1..D-1)."""
    return sum(f for _, f in self.level_sizes()[:-1])

  def describe(self) -> str:
    suffix = ',replace' if self.replace else ''
    if self.budget is None:
      return 'topk:' + ','.join(str(k) for k in self.branching) + suffix
    return f'best:{self.budget},depth:{self.depth},width:{self.frontier}{suffix}'


@flax.struct.dataclass
class Tree:
  """A batch of token trees (see the module docstring)."""

  tokens: jax.Array  # [b, N] int32
  parents: jax.Array  # [b, N] int32, -1 = the root
  depths: jax.Array  # [b, N] int32 in 1..D
  valid: jax.Array  # [b, N] bool: a real draw (False: q had no mass left, or an invalid ancestor)
  q: jax.Array  # [b, N, V] float32: each node's proposal distribution given its earlier siblings
  # (with replacement: its parent's q)
  rank: Optional[jax.Array] = None  # [b, N] int32: each node's place by path score (0 = best;
  # best-first trees; `by_rank`), None where unknown


def attention_mask(parents: jax.Array, depth: int) -> jax.Array:
  """`[b, N]` parents -> `[b, N + 1, N + 1]` bool: entry 0 the root; each sees its ancestors + self."""
  batch, n = parents.shape
  up = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), parents + 1], axis=1)  # [b, N + 1]
  mask = jnp.eye(n + 1, dtype=bool)[None] | (jnp.arange(n + 1) == 0)[None, None]  # [1, N+1, N+1]
  mask = jnp.broadcast_to(mask, (batch, n + 1, n + 1))
  cur = up
  for _ in range(depth - 1):  # the root is already visible to all
    mask |= jax.nn.one_hot(cur, n + 1, dtype=bool)
    cur = jnp.take_along_axis(up, cur, axis=1)  # [b, N + 1]
  return mask


def _children(rng: jax.Array, logits: jax.Array, dist: jax.Array, k: int,
              config: SamplingConfig, replace: bool = False) -> jax.Array:
  """`[b, F, V]` -> `[b, F, k]` children tokens: top-k (greedy), a Gumbel top-k draw from dist
  (without replacement) or, with `replace`, k i.i.d. draws from dist."""
  if config.greedy:
    return jax.lax.top_k(logits, k)[1].astype(jnp.int32)
  if replace:
    keys = jnp.log(dist)[..., None, :] + jax.random.gumbel(
        rng, dist.shape[:-1] + (k, dist.shape[-1]))  # [b, F, k, V]
    return jnp.argmax(keys, axis=-1).astype(jnp.int32)
  keys = jnp.log(dist) + jax.random.gumbel(rng, dist.shape)  # [b, F, V]; -inf off the support
  return jax.lax.top_k(keys, k)[1].astype(jnp.int32)


FeedFn = Callable[[PyTree, jax.Array, jax.Array, int], Tuple[jax.Array, PyTree]]


def grow(shape: TreeShape, rng: jax.Array, root_logits: jax.Array, feed: FeedFn, carry: PyTree,
         config: SamplingConfig, deterministic: bool = False) -> Tuple[Tree, jax.Array, PyTree]:
  """Grows a tree level by level, calling the draft once per level.

  Args:
    shape: the tree shape.
    rng: PRNG key (children draws).
    root_logits: `[b, V]` the draft's logits after the root.
    feed: `feed(carry, tokens [b, F], parent [b, F], d) -> (logits [b, F, V], carry)` runs the draft
      on the F expanded nodes of depth d (d < D); `parent` is each one's index among the nodes fed
      at depth d - 1 (-1: the root).
    carry: the draft's state, threaded through `feed`.
    config: the sampling method (temperature 0: top-k children).
    deterministic: a deterministic draft (n-gram top-k): children are always the top-k tokens and
      each node's q is one-hot on its token (given its earlier siblings, it is proposed surely), so
      rejecting it removes exactly that token from p.

  Returns:
    `(tree, fed [b, N], carry)`: fed is each node's index in the order nodes were fed (-1: never).
  """
  batch = root_logits.shape[0]
  rows = jnp.arange(batch)[:, None]  # [b, 1]
  logits = root_logits[:, None]  # [b, 1, V] logits at the expanded nodes (depth 0: the root)
  f_score = jnp.zeros((batch, 1), jnp.float32)  # [b, F] cumulative log score
  f_valid = jnp.ones((batch, 1), bool)
  f_global = jnp.full((batch, 1), -1, jnp.int32)  # candidate index of each expanded node
  cand = {key: [] for key in ('token', 'score', 'valid', 'parent', 'dist', 'rank', 'depth', 'fed')}
  dists, dist_offset, cand_offset, fed_offset = [], 0, 0, 0
  for d, ((num_cand, num_exp), k) in enumerate(zip(shape.level_sizes(), shape.branching), 1):
    rng, draw_rng = jax.random.split(rng)
    # The ranking distribution: the adjusted q, or (greedy) the draft's T=1 softmax.
    top = config.greedy or deterministic
    dist = (jax.nn.softmax(logits.astype(jnp.float32), axis=-1) if top
            else sampling.adjust_logits(logits, config))  # [b, F, V]
    num_parents = dist.shape[1]
    dists.append(dist)
    token = _children(draw_rng, logits, dist, k, sampling.GREEDY if top else config,
                      shape.replace)  # [b, F, k]
    rank_prob = jax.lax.top_k(dist, k)[0]  # [b, F, k] sorted q: the ranking (module docstring)
    drawn = jnp.take_along_axis(dist, token, axis=-1)  # [b, F, k]
    valid = f_valid[..., None] & (top | (drawn > 0))  # [b, F, k]
    score = f_score[..., None] + jnp.log(jnp.maximum(rank_prob, 1e-30))  # [b, F, k]
    score = jnp.where(rank_prob > 0, score, _LOG_ZERO)
    flat = lambda x: x.reshape(batch, num_cand)  # [b, F, k] -> [b, C]
    cand['token'].append(flat(token))
    cand['score'].append(flat(score))
    cand['valid'].append(flat(valid))
    cand['parent'].append(flat(jnp.broadcast_to(f_global[..., None], token.shape)))
    cand['dist'].append(flat(jnp.broadcast_to(
        dist_offset + jnp.arange(num_parents, dtype=jnp.int32)[:, None], token.shape)))
    cand['rank'].append(flat(jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), token.shape)))
    cand['depth'].append(jnp.full((batch, num_cand), d, jnp.int32))
    fed = jnp.full((batch, num_cand), -1, jnp.int32)
    if d < shape.depth:
      if shape.frontier is None:
        sel = jnp.broadcast_to(jnp.arange(num_cand, dtype=jnp.int32), (batch, num_cand))
      else:  # lax.top_k puts the lower index first among equal scores: parents before children
        sel = jnp.sort(jax.lax.top_k(flat(score), num_exp)[1], axis=1).astype(jnp.int32)
      take = lambda x: jnp.take_along_axis(x, sel, axis=1)  # [b, C] -> [b, F']
      f_score, f_valid = take(flat(score)), take(flat(valid))
      f_global = cand_offset + sel
      fed = fed.at[rows, sel].set(fed_offset + jnp.arange(num_exp, dtype=jnp.int32))
      parent_fed = sel // k if d > 1 else jnp.full_like(sel, -1)  # [b, F']
      logits, carry = feed(carry, take(flat(token)), parent_fed, d)  # [b, F', V]
      fed_offset += num_exp
    cand['fed'].append(fed)
    dist_offset += num_parents
    cand_offset += num_cand

  c = {key: jnp.concatenate(val, axis=1) for key, val in cand.items()}  # each [b, C]
  if shape.budget is None:
    sel = jnp.broadcast_to(jnp.arange(cand_offset, dtype=jnp.int32), (batch, cand_offset))
    score_rank = sel
  else:
    best = jax.lax.top_k(c['score'], shape.budget)[1]  # [b, N] candidates, best first
    sel = jnp.sort(best, axis=1).astype(jnp.int32)  # [b, N]
    score_rank = jnp.argsort(best, axis=1).astype(jnp.int32)  # [b, N] node -> its place in best
  n = sel.shape[1]
  pick = lambda x: jnp.take_along_axis(x, sel, axis=1)  # [b, C] -> [b, N]
  node_of = jnp.full((batch, cand_offset), -1, jnp.int32).at[rows, sel].set(
      jnp.arange(n, dtype=jnp.int32))  # [b, C] candidate -> node
  parent_cand = pick(c['parent'])  # [b, N]
  parents = jnp.where(parent_cand >= 0,
                      jnp.take_along_axis(node_of, jnp.maximum(parent_cand, 0), axis=1), -1)
  tokens, rank = pick(c['token']), pick(c['rank'])  # [b, N]
  all_dists = jnp.concatenate(dists, axis=1)  # [b, sum F, V]
  q = jnp.take_along_axis(all_dists, pick(c['dist'])[..., None], axis=1)  # [b, N, V]
  vocab = jnp.arange(q.shape[-1], dtype=jnp.int32)
  for j in range(0 if shape.replace else max(shape.branching) - 1):  # without replacement:
    # drop earlier siblings (with replacement, a child's q is its parent's)
    sibling = jnp.take_along_axis(c['token'], jnp.maximum(sel - rank + j, 0), axis=1)  # [b, N]
    q = jnp.where((j < rank)[..., None] & (vocab == sibling[..., None]), 0.0, q)
  mass = jnp.sum(q, axis=-1, keepdims=True)  # [b, N, 1]
  q = q / jnp.where(mass > 0, mass, 1.0)
  if deterministic:
    q = jax.nn.one_hot(tokens, q.shape[-1], dtype=jnp.float32)  # [b, N, V]
  tree = Tree(tokens=tokens, parents=parents, depths=pick(c['depth']), valid=pick(c['valid']),
              q=q, rank=score_rank)
  return tree, pick(c['fed']), carry


def by_rank(tree: Tree) -> Tuple[Tree, jax.Array]:
  """A best-first tree's nodes reordered by path score (`Tree.rank`), and `order [b, N]`, each
  new node's index in `tree` (to map an accepted path back for `commit_tree`). Parents come before
  their children and siblings keep their drawing order (a child scores at most its parent, ties go
  to the lower candidate index), so the first n nodes are the tree `grow` keeps with budget n.
  """
  if tree.rank is None:
    raise ValueError('by_rank needs a tree with ranks (a best-first tree from `grow`)')
  order = jnp.argsort(tree.rank, axis=1).astype(jnp.int32)  # [b, N] rank -> old index
  take = lambda x: jnp.take_along_axis(x, order, axis=1)  # [b, N] -> [b, N]
  parents = take(tree.parents)  # [b, N] old indices
  parents = jnp.where(parents >= 0, jnp.take_along_axis(tree.rank, jnp.maximum(parents, 0), axis=1),
                      -1)  # [b, N] new indices
  ranked = Tree(tokens=take(tree.tokens), parents=parents, depths=take(tree.depths),
                valid=take(tree.valid), q=jnp.take_along_axis(tree.q, order[..., None], axis=1),
                rank=jnp.broadcast_to(jnp.arange(order.shape[1], dtype=jnp.int32), order.shape))
  return ranked, order


def first_nodes(tree: Tree, n: int) -> Tree:
  """The first n nodes (of a tree in rank order: the best-first tree of budget n)."""
  return jax.tree_util.tree_map(lambda x: x[:, :n], tree)


def verify(rng: jax.Array, tree: Tree, target_logits: jax.Array, depth: int,
           config: SamplingConfig) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Multi-candidate verification of a tree (module docstring).

  Args:
    rng: PRNG key.
    tree: the draft's tree (`[b, N]` nodes).
    target_logits: `[b, N + 1, V]` the target's logits after the root (entry 0) and every node.
    depth: D, the tree's depth (static).
    config: sampling method (lenience must be 1).

  Returns:
    `(path [b, D]` accepted nodes by depth, -1 past the accepted length; `[b]` accepted length a;
    `[b]` the next token t, drawn from the residual p at the last accepted node (or its argmax)).
  """
  if config.lenience != 1.0:
    raise UserError('lenience < 1 is not supported with token trees')
  batch, n = tree.tokens.shape
  rows = jnp.arange(batch)
  r_rng, t_rng = jax.random.split(rng)
  if config.greedy:
    argmax = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [b, N + 1]
    p = None
  else:
    p = sampling.adjust_logits(target_logits, config)  # [b, N + 1, V]
  r = jax.random.uniform(r_rng, (n, batch))  # [N, b]

  def step(carry, xs):
    cur, p_cur, count, path = carry  # [b] (0 = root, i + 1 = node i), [b, V], [b], [b, D + 1]
    i, token, parent, valid, q_i, r_i, p_i = xs
    child = (parent + 1 == cur) & valid  # [b]
    if config.greedy:
      accept = child & (token == argmax[rows, cur])
    else:
      p_x = jnp.take_along_axis(p_cur, token[:, None], axis=1)[:, 0]  # [b]
      q_x = jnp.take_along_axis(q_i, token[:, None], axis=1)[:, 0]  # [b]
      accept = child & (r_i * q_x < p_x)  # r < p / q without dividing by q
      residual = jnp.maximum(p_cur - q_i, 0.0)  # [b, V]
      mass = jnp.sum(residual, axis=-1, keepdims=True)
      # mass == 0 only if p_cur == q_i, when rejection cannot happen (up to rounding): keep p_cur.
      residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_cur)
      reject = child & ~accept
      p_cur = jnp.where(accept[:, None], p_i, jnp.where(reject[:, None], residual, p_cur))
    path = path.at[rows, count].set(jnp.where(accept, i, path[rows, count]))
    return (jnp.where(accept, i + 1, cur), p_cur, count + accept, path), None

  p_root = jnp.zeros((batch, 1), jnp.float32) if p is None else p[:, 0]
  swap = lambda x: jnp.swapaxes(x, 0, 1)
  dummy = jnp.zeros((n, batch, 1), jnp.float32)
  xs = (jnp.arange(n, dtype=jnp.int32), swap(tree.tokens), swap(tree.parents), swap(tree.valid),
        dummy if p is None else swap(tree.q), r, dummy if p is None else swap(p[:, 1:]))
  init = (jnp.zeros((batch,), jnp.int32), p_root, jnp.zeros((batch,), jnp.int32),
          jnp.full((batch, depth + 1), -1, jnp.int32))  # slot D: an unused spare
  (cur, p_cur, count, path), _ = jax.lax.scan(step, init, xs)
  if config.greedy:
    token = argmax[rows, cur]
  else:
    token = sampling.sample(t_rng, p_cur)
  return path[:, :depth], count, token
