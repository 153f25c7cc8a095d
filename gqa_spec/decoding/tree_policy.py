"""How each row of `--tree best:auto` chooses its tree size (`adaptive_tree.py`'s loop asks
`AdaptiveTree.choose` every iteration).

With verification in rank order, whether node j is accepted depends only on nodes ranked before
it, so one call at width w shows, for every compiled width u <= w, how many tokens a top-u tree
would have accepted: the accepted path's nodes ranked below u. Each row keeps `gain [b, K]`, a
discounted mean per compiled width u_j of the tokens the nodes ranked in [u_{j-1}, u_j) added over
the calls that held u_j, and `weight [b, K]`, its discounted count of calls: each call multiplies
every weight by `decay`, held or not, and adds 1 where it held the width. Gains, not counts: a
width the call did not hold stays in step with the smaller ones. The gains start from a prior
counted as 1 / (1 - decay) calls that fade: where the calibration's second stage ran
(`cost_calibration.measure_costs`, `calibrated`), the tokens this loop accepted per call at each
width there (`accepted_init`), which then also counts as `prior_weight` calls that never fade
(`CALIBRATED_PRIOR_CALLS`), a band's estimate (W0 prior_j + weight_j gain_j) / (W0 + weight_j);
otherwise the counts of a chain of min(u, D) tokens each accepted with probability `alpha_init`
(sum_i alpha^i). Where the prior itself pays for no tree, no row ever asks for one and `decode`
is greedy decoding from the start. A row asks for

    N_r = argmax over n in {0} + widths of  (1 + accepted_r(n)) / (I(n) cost(n)),
    accepted_r(u_j) = est_r(u_1) + ... + est_r(u_j),  est_r the bands' estimates above,
    cost(0) = 1 (a plain step),  cost(n) = D c + v(n),

tokens per greedy-step equivalent: D draft calls of c each and v(n) the rest of an iteration at
width n, both over a greedy step, and I(n) the batch's iterations over a row's
(`theory.tree_batch_inflation` at the prior's accepted tokens and the calibration batches' output
lengths; 1 at I(0) and without them): a batch runs until its slowest row ends. Ties go to the
smaller tree. With the chain prior, unless no row speculates, the first iteration verifies N_max
for every row, so every width is observed at once; with a measured prior every row starts at the
prior's own choice.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import theory
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.errors import UserError

# Calls the calibration's measured prior counts for in every row's estimate, never discounted
# (`AdaptiveTree.prior_weight`): about as much as the running evidence, 1 / (1 - decay) calls.
CALIBRATED_PRIOR_CALLS = 4.0
DEFAULT_MAX_NODES = 64  # `best:auto` without :N: every candidate, at most this many
SPEC = 'best:auto[:N],depth:D[,width:W][,replace]'


def node_widths(nodes_max: int) -> Tuple[int, ...]:
  """The node counts the loop compiles a verification call for: 1, 2, 4, ... below N_max, N_max."""
  out, n = [], 1
  while n < nodes_max:
    out.append(n)
    n *= 2
  return tuple(out) + (nodes_max,)


@dataclasses.dataclass(frozen=True)
class AdaptiveTree:
  """Per-row adaptive best-first trees; hashable (a static `jax.jit` argument).

  Attributes:
    shape: the largest tree, a best-first `TreeShape` (its budget is N_max).
    cost_ratio: c, one draft call of growing the tree over one one-token target call (the tree
      takes D of them).
    verify_ratio: v, the verification call over a one-token target call: one number for every width,
      or one per compiled width (`node_widths(N_max)`), as `cost_calibration.measure_costs` gives.
    alpha_init: the prior's per-token acceptance (module docstring): by default an optimistic 0.9,
      so that a row keeps trying trees for a few calls before its own statistics decide;
      `calibrated` sets the draft's top-node acceptance the calibration measured.
    accepted_init: the prior itself, draft tokens accepted per call at each compiled width (one
      number per `widths`, in [0, D]), in place of the chain from `alpha_init`: `calibrated` sets
      the ones `cost_calibration.measure_costs` measured in this loop (`Calibration.accepted`)
      where its second stage ran; None: the chain.
    decay: what each call multiplies the evidence behind a width's estimate by (module
      docstring).
    prior_weight: calls the prior counts for in every row's estimate for the whole run, never
      discounted (0: the prior fades with the evidence). `calibrated` sets
      `CALIBRATED_PRIOR_CALLS` where the calibration measured the prior (`accepted_init`).
    lengths: the tokens each row of a few batches needs (`theory.Lengths`), which price the
      batch's iterations (`inflation`; (): not priced); `calibrated` sets the calibration's, the
      greedy output lengths of the batches it read.
    fixed_nodes: every row asks for this many nodes at every call, whatever its statistics (None:
      the choice above); 0: no row asks for a tree, `adaptive_tree.decode` is greedy decoding (the
      plain calls of `guard`).
  """

  shape: TreeShape
  cost_ratio: float = 0.0
  verify_ratio: Union[float, Tuple[float, ...]] = 1.0
  alpha_init: float = 0.9
  decay: float = 0.7
  fixed_nodes: Optional[int] = None
  accepted_init: Optional[Tuple[float, ...]] = None
  prior_weight: float = 0.0
  lengths: theory.Lengths = ()

  def __post_init__(self):
    if self.shape.budget is None:
      raise UserError(f'adaptive trees need a best-first tree ({SPEC}); got '
                      f'{self.shape.describe()}')
    if not self.cost_ratio >= 0:
      raise UserError(f'cost ratio must be >= 0, got {self.cost_ratio}')
    v = self.verify_ratio
    if isinstance(v, (tuple, list)):
      if len(v) != len(self.widths) or not all(x > 0 for x in v):
        raise UserError(f'per-width verify ratios must be {len(self.widths)} numbers > 0 (widths '
                        f'{self.widths}), got {v}')
      object.__setattr__(self, 'verify_ratio', tuple(float(x) for x in v))  # hashable
    elif not v > 0:
      raise UserError(f'verify ratio must be > 0, got {v}')
    if not 0.0 <= self.alpha_init <= 1.0 or not 0.0 <= self.decay < 1.0:
      raise UserError(f'alpha_init must be in [0, 1] and decay in [0, 1), got {self.alpha_init}, '
                      f'{self.decay}')
    if not self.prior_weight >= 0:
      raise UserError(f'prior_weight must be >= 0, got {self.prior_weight}')
    if self.accepted_init is not None:
      a = tuple(float(x) for x in self.accepted_init)
      if len(a) != len(self.widths) or not all(0.0 <= x <= self.shape.depth for x in a):
        raise UserError(f'accepted_init must be {len(self.widths)} numbers in [0, '
                        f'{self.shape.depth}] (widths {self.widths}), got {self.accepted_init}')
      object.__setattr__(self, 'accepted_init', a)  # hashable
    object.__setattr__(self, 'lengths', theory.checked_lengths(self.lengths))  # hashable
    if self.fixed_nodes is not None and self.fixed_nodes not in (0,) + self.widths:
      raise UserError(f'fixed_nodes must be 0 or one of the compiled widths {self.widths}, got '
                      f'{self.fixed_nodes}')

  @classmethod
  def parse(cls, spec: str, **kwargs) -> 'AdaptiveTree':
    """`best:auto[:N],depth:D[,width:W][,replace]` (the CLI's `--tree`): N_max = N, or every
    candidate of the shape up to `DEFAULT_MAX_NODES`."""
    m = re.fullmatch(r'best:auto(?::(\d+))?,depth:(\d+)(?:,width:(\d+))?(,replace)?', spec)
    if not m:
      raise UserError(f'an adaptive tree must be {SPEC}; got {spec!r}')
    depth, width, replace = int(m.group(2)), int(m.group(3) or 4), bool(m.group(4))
    nodes = m.group(1)
    if nodes is None:
      full = TreeShape.best(1, depth, width)
      nodes = min(full.num_candidates, DEFAULT_MAX_NODES)
    return cls(TreeShape.best(int(nodes), depth, width, replace=replace), **kwargs)

  @staticmethod
  def is_spec(spec: str) -> bool:
    return spec.startswith('best:auto')

  @property
  def nodes_max(self) -> int:
    return self.shape.num_nodes

  @property
  def widths(self) -> Tuple[int, ...]:
    return node_widths(self.nodes_max)

  def prior(self) -> jax.Array:
    """`[K]` the starting accepted-length estimate per compiled width: `accepted_init`, made
    non-decreasing (a wider tree holds the narrower one's nodes; each width was measured on its
    own run), else sum_{i <= min(u, D)} alpha_init^i."""
    return jnp.asarray(_prior_tokens(self), jnp.float32)

  def choose(self, accepted: jax.Array) -> jax.Array:
    """`[b, K]` accepted-length estimates per compiled width -> `[b]` int32 node counts (module
    docstring), 0 where no tree pays."""
    if self.fixed_nodes is not None:
      return jnp.full(accepted.shape[:1], self.fixed_nodes, jnp.int32)
    widths = self.widths
    tokens = jnp.concatenate([jnp.ones_like(accepted[:, :1]),
                              (1.0 + accepted) / jnp.asarray(self.inflation(), jnp.float32)],
                             axis=1)  # [b, K + 1]
    v = jnp.broadcast_to(jnp.asarray(self.verify_ratio, jnp.float32), (len(widths),))  # [K]
    cost = jnp.concatenate([jnp.ones((1,), jnp.float32),
                            self.shape.depth * self.cost_ratio + v])  # [K + 1]
    best = jnp.argmax(tokens / cost[None], axis=1)  # [b]; the first (smaller) on ties
    return jnp.asarray((0,) + widths, jnp.int32)[best]

  def inflation(self) -> Tuple[float, ...]:
    """The batch's iterations over a row's at each compiled width, from the prior's accepted
    tokens (`theory.tree_batch_inflation`; all 1 without lengths)."""
    return _inflation(self)

  def accepted(self, gain: jax.Array, weight: jax.Array) -> jax.Array:
    """`[b, K]` each row's accepted-length estimate per compiled width, from its bands' running
    means `gain [b, K]` over `weight [b, K]` discounted calls and the lasting prior (module
    docstring)."""
    w0 = self.prior_weight
    if w0:
      bands = jnp.diff(self.prior(), prepend=0.0)  # [K]
      gain = (w0 * bands[None] + weight * gain) / (w0 + weight)  # [b, K]
    return jnp.cumsum(gain, axis=1)

  def observe(self, gain: jax.Array, weight: jax.Array, added: jax.Array, observed: jax.Array,
              active: jax.Array) -> Tuple[jax.Array, jax.Array]:
    """One call's update of the bands' running means `gain [b, K]` over `weight [b, K]`
    discounted calls (module docstring): `added [b, K]` the tokens each band added where the
    call held it (`observed [b, K]` bool), rows not `active [b]` unchanged."""
    kept = self.decay * weight  # [b, K] every band's evidence fades, held or not
    new_weight = jnp.where(active[:, None], kept + observed.astype(jnp.float32), weight)
    new_gain = jnp.where(observed, (kept * gain + added) / jnp.maximum(new_weight, 1e-6), gain)
    return new_gain, new_weight

  def first_nodes(self) -> int:
    """Every row's first node count, a Python int: `fixed_nodes`; with a measured prior
    (`accepted_init`) the prior's own choice (every width is measured already); with the chain
    from `alpha_init`, N_max where the prior's own choice is a tree (the first call then observes
    every width). 0: the prior pays for no tree, no row ever asks for one, and `decode` is
    greedy decoding from the start."""
    return _first_nodes(self)

  @property
  def speculates(self) -> bool:
    return self.first_nodes() > 0

  @property
  def call_tokens(self) -> int:
    """Tokens of `adaptive_tree.decode`'s widest target call (`targets.cache_length`): an
    N_max-node verification, or 1 when no row will ask for a tree."""
    return self.nodes_max + 1 if self.speculates else 1

  def calibrated(self, calibration) -> 'AdaptiveTree':
    """These settings with a `cost_calibration.Calibration`'s c, v, starting alpha, output lengths
    and, where measured, accepted tokens per width (the prior, kept as `CALIBRATED_PRIOR_CALLS`
    calls that never fade)."""
    depth = self.shape.depth
    accepted = getattr(calibration, 'accepted', ())
    return dataclasses.replace(
        self, cost_ratio=calibration.cost_ratio, verify_ratio=calibration.verify_ratio,
        alpha_init=min(max(calibration.alpha, 0.0), 1.0),
        accepted_init=tuple(min(max(a, 0.0), depth) for a in accepted) if accepted else None,
        prior_weight=CALIBRATED_PRIOR_CALLS if accepted else 0.0,
        lengths=calibration.lengths)

  def describe(self) -> str:
    v = self.verify_ratio
    v = f'{v[0]:.3g}..{v[-1]:.3g}' if isinstance(v, tuple) else f'{v:.3g}'
    replace = ',replace' if self.shape.replace else ''
    return (f'best:auto:{self.nodes_max},depth:{self.shape.depth},width:{self.shape.frontier}'
            f'{replace} (c={self.cost_ratio:.3g},v={v})')


def _prior_tokens(adaptive: AdaptiveTree) -> np.ndarray:
  """`AdaptiveTree.prior` on the host, `[K]` float64."""
  if adaptive.accepted_init is not None:
    return np.maximum.accumulate(np.asarray(adaptive.accepted_init, np.float64))
  return np.asarray([sum(adaptive.alpha_init ** i for i in range(1, min(u, adaptive.shape.depth)
                                                                 + 1)) for u in adaptive.widths])


@functools.lru_cache(maxsize=256)
def _inflation(adaptive: AdaptiveTree) -> Tuple[float, ...]:
  return tuple(float(x) for x in theory.tree_batch_inflation(
      _prior_tokens(adaptive), adaptive.shape.depth, adaptive.lengths))


@functools.lru_cache(maxsize=256)
def _first_nodes(adaptive: AdaptiveTree) -> int:
  """`AdaptiveTree.first_nodes`, computed once per setting (a few eager device ops; callers ask
  per batch)."""
  if adaptive.fixed_nodes is not None:
    return adaptive.fixed_nodes
  with jax.ensure_compile_time_eval():  # a Python int, also while tracing
    choice = int(adaptive.choose(adaptive.prior()[None])[0])
  if adaptive.accepted_init is not None:  # measured at every width: nothing to observe first
    return choice
  return adaptive.nodes_max if choice > 0 else 0
