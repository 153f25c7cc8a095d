"""Token trees that size themselves per row (`generate --tree best:auto[:N],depth:D[,width:W]`).

The tree loop (`tree_speculative.tree_step`) with best-first trees whose node count follows each
row's running acceptance (`AdaptiveTree.choose`; 0 = no tree). The draft grows the
largest tree every iteration, its nodes in rank order (`tree.by_rank`), so the first n nodes are
the best-first tree of budget n; the target verifies the first w nodes of every row, w the
narrowest compiled width holding the largest ask, each width its own while loop
(`adaptive.run_widths`). Once no active row asks for a tree the rest are plain target steps.

With verification in rank order, one call at width w shows how many tokens a top-u tree would
have accepted for every compiled width u <= w. Each row keeps per width band a discounted mean of
the tokens the band's nodes added (`gain [b, K]`) and its discounted count of calls
(`weight [b, K]`), starting from a prior: the calibration's measured tokens per width
(`accepted_init`, also counted as `prior_weight` calls that never fade), else a chain whose
tokens are each accepted with probability `alpha_init`. A row asks for

    N_r = argmax over n in {0} + widths of  (1 + accepted_r(n)) / (I(n) cost(n)),
    cost(0) = 1 (a plain step),  cost(n) = D c + v(n),

with I(n) the batch's iterations over a row's (`theory.tree_batch_inflation`); ties go to the
smaller tree. Where the prior pays for no tree, `decode` is greedy decoding from the start.

The output stays exact: w depends only on the batch's past, so it is a stopping rule, and the
top-w tree is verified by the lossless multi-candidate rule (`tree.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import sampling, theory, xla_options
from gqa_spec.decoding.adaptive import adaptive_fields, plain_decode, run_widths
from gqa_spec.decoding.autoregressive import EOS
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import LoopState, SpeculativeResult, init_loop
from gqa_spec.decoding.targets import Decoder
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.decoding.tree_speculative import tree_step
from gqa_spec.errors import UserError

PyTree = Any
FIELDS = ('tree_nodes_histogram', 'tree_nodes_trace', 'tree_width_trace')  # `adaptive_fields`
CALIBRATED_PRIOR_CALLS = 4.0  # `prior_weight` of a measured prior: about 1 / (1 - decay) calls
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
    alpha_init: the chain prior's per-token acceptance (optimistic by default).
    accepted_init: the measured prior, draft tokens accepted per call at each compiled width (in
      [0, D]); None: the chain from `alpha_init`.
    decay: what each call multiplies a width's evidence by.
    prior_weight: calls the prior counts for in every row's estimate, never discounted.
    lengths: the tokens each row of a few batches needs (`theory.Lengths`; (): not priced).
    fixed_nodes: every row asks for this many nodes at every call (None: the choice above); 0:
      `adaptive_tree.decode` is greedy decoding (`guard`'s plain calls).
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
    object.__setattr__(self, 'verify_ratio', theory.checked_costs(
        self.cost_ratio, self.verify_ratio, len(self.widths), 'width',
        self.alpha_init, self.decay, self.prior_weight))
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

  @property
  def nodes_max(self) -> int:
    return self.shape.num_nodes

  @property
  def widths(self) -> Tuple[int, ...]:
    return node_widths(self.nodes_max)

  def prior(self) -> jax.Array:
    """`[K]` the starting accepted-length estimate per compiled width: `accepted_init` made
    non-decreasing (a wider tree holds the narrower's nodes), else sum_{i <= min(u, D)} alpha^i."""
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

  @functools.lru_cache(maxsize=256)
  def inflation(self) -> Tuple[float, ...]:
    """The batch's iterations over a row's at each compiled width, from the prior's accepted
    tokens (`theory.tree_batch_inflation`; all 1 without lengths)."""
    return tuple(float(x) for x in theory.tree_batch_inflation(
        _prior_tokens(self), self.shape.depth, self.lengths))

  def accepted(self, gain: jax.Array, weight: jax.Array) -> jax.Array:
    """`[b, K]` each row's accepted-length estimate per compiled width, from its bands' running
    means `gain [b, K]` over `weight [b, K]` calls and the lasting prior."""
    w0 = self.prior_weight
    if w0:
      bands = jnp.diff(self.prior(), prepend=0.0)  # [K]
      gain = (w0 * bands[None] + weight * gain) / (w0 + weight)  # [b, K]
    return jnp.cumsum(gain, axis=1)

  def observe(self, gain: jax.Array, weight: jax.Array, added: jax.Array, observed: jax.Array,
              active: jax.Array) -> Tuple[jax.Array, jax.Array]:
    """One call's update of `gain [b, K]` and `weight [b, K]`: `added [b, K]` the tokens each band
    added where the call held it (`observed [b, K]`); rows not `active [b]` unchanged."""
    kept = self.decay * weight  # [b, K] every band's evidence fades, held or not
    new_weight = jnp.where(active[:, None], kept + observed.astype(jnp.float32), weight)
    new_gain = jnp.where(observed, (kept * gain + added) / jnp.maximum(new_weight, 1e-6), gain)
    return new_gain, new_weight

  @functools.lru_cache(maxsize=256)
  def first_nodes(self) -> int:
    """Every row's first node count, a Python int: `fixed_nodes`, else the measured prior's
    choice, else N_max where the chain prior's choice is a tree (observing every width at once);
    0: no row ever asks for a tree."""
    if self.fixed_nodes is not None:
      return self.fixed_nodes
    with jax.ensure_compile_time_eval():  # a Python int, also while tracing
      choice = int(self.choose(self.prior()[None])[0])
    if self.accepted_init is not None:  # measured at every width: nothing to observe first
      return choice
    return self.nodes_max if choice > 0 else 0

  @property
  def speculates(self) -> bool:
    return self.first_nodes() > 0

  @property
  def call_tokens(self) -> int:
    """Tokens of `adaptive_tree.decode`'s widest target call (`targets.cache_length`)."""
    return self.nodes_max + 1 if self.speculates else 1

  def calibrated(self, calibration) -> 'AdaptiveTree':
    """These settings with a `cost_calibration.Calibration`'s c, v, alpha, lengths and, where
    measured, accepted tokens per width (the prior, `CALIBRATED_PRIOR_CALLS` calls)."""
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




@flax.struct.dataclass
class TreeLoopState:
  loop: LoopState
  want: jax.Array  # [b] int32 the node count each row asks for next
  gain: jax.Array  # [b, K] float32 running tokens added by the nodes ranked in [u_{j-1}, u_j)
  weight: jax.Array  # [b, K] float32 the discounted calls behind each gain


def decode(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
           rng: jax.Array, *, adaptive: AdaptiveTree, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None) -> SpeculativeResult:
  """Tree speculative decoding with per-row adaptive node counts (arguments as
  `tree_speculative.decode`, `adaptive` in place of `shape`; the target's cache has
  `targets.cache_length(max_decode_len, adaptive.call_tokens)` slots; `draft_state` may be None
  where `adaptive.speculates` is False, the call then being greedy decoding).

  Returns:
    `SpeculativeResult` as `tree_speculative.decode`'s (`proposed` counts the valid nodes each
    call verified), plus `tree_nodes_histogram` `[b, N_max + 1]`, `tree_nodes_trace`
    `[b, max_decode_len]` and `tree_width_trace` `[max_decode_len]` (`speculative.py`).
  """
  if config.lenience != 1.0:
    raise UserError('lenience < 1 is not supported with token trees')
  if adaptive.speculates:
    return _speculative(target, target_state, draft, draft_state, rng, adaptive=adaptive,
                        max_decode_len=max_decode_len, config=config, eos_id=eos_id, skip=skip)
  return plain_decode(target, target_state, rng, depth=adaptive.shape.depth,
                      size=adaptive.nodes_max + 1, fields=FIELDS, max_decode_len=max_decode_len,
                      config=config, eos_id=eos_id, skip=skip).replace(
                          draft_calls=np.zeros((), np.int32))


@functools.partial(xla_options.jit, static_argnames=('target', 'draft', 'adaptive',
                                                     'max_decode_len', 'config', 'eos_id'))
def _speculative(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
                 rng: jax.Array, *, adaptive: AdaptiveTree, max_decode_len: int,
                 config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
                 skip: Optional[jax.Array] = None,
                 first_nodes: Optional[jax.Array] = None,
                 held: Optional[jax.Array] = None) -> SpeculativeResult:
  """`decode` where some row asks for a tree. For the calibration, as `adaptive._speculative`:
  `first_nodes [b]` (traced) replaces the first node counts, and where `held []` is True every
  row keeps it (the policy's choice made, not taken)."""
  shape = adaptive.shape
  depth, nmax, widths = shape.depth, adaptive.nodes_max, adaptive.widths
  loop = init_loop(target, target_state, draft_state, rng, max_decode_len, depth, skip)
  batch = loop.done.shape[0]
  loop = loop.replace(result=loop.result.replace(
      **adaptive_fields(batch, nmax + 1, max_decode_len, *FIELDS)))
  want = (jnp.full((batch,), adaptive.first_nodes(), jnp.int32) if first_nodes is None
          else jnp.asarray(first_nodes, jnp.int32))  # [b]
  init = TreeLoopState(loop=loop, want=want,
                       gain=jnp.broadcast_to(jnp.diff(adaptive.prior(), prepend=0.0),
                                             (batch, len(widths))),
                       weight=jnp.full((batch, len(widths)), 1.0 / (1.0 - adaptive.decay)))
  width_array = jnp.asarray(widths, jnp.int32)  # [K]

  def body(a: TreeLoopState, width: int) -> TreeLoopState:
    r = a.loop.result
    active = ~a.loop.done  # [b]
    want = jnp.where(active, a.want, 0)  # [b]
    s, path, _ = tree_step(target, draft, a.loop, shape, config, max_decode_len, eos_id, width)
    # What a top-u tree would have accepted, for every compiled u <= this call's width.
    below = (path[:, None, :] >= 0) & (path[:, None, :] < width_array[None, :, None])  # [b, K, D]
    count = jnp.sum(below, axis=2).astype(jnp.float32)  # [b, K]
    observed = active[:, None] & (width_array[None] <= width)  # [b, K]
    added = jnp.diff(count, axis=1, prepend=0.0)  # [b, K] tokens each band of ranks added
    gain, weight = adaptive.observe(a.gain, a.weight, added, observed, active)  # [b, K] each
    act, rows = active.astype(jnp.int32), jnp.arange(batch)
    s = s.replace(result=s.result.replace(
        tree_nodes_histogram=r.tree_nodes_histogram.at[rows, want].add(act),
        tree_nodes_trace=r.tree_nodes_trace.at[
            rows, jnp.where(active, r.target_calls, max_decode_len)].set(want, mode='drop'),
        tree_width_trace=r.tree_width_trace.at[r.loop_iterations].set(width, mode='drop')))
    if adaptive.fixed_nodes is None:
      want = jnp.where(active, adaptive.choose(adaptive.accepted(gain, weight)), a.want)  # [b]
    else:  # every row keeps its first count
      want = a.want
    if held is not None:  # the choice made, then not taken (the calibration's timing)
      want = jnp.where(held, a.want, want)
    return TreeLoopState(loop=s, want=want, gain=gain, weight=weight)

  return run_widths(target, init, widths, body, max_decode_len, config, eos_id, *FIELDS)
