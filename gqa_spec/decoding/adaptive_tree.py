"""Token trees that size themselves per row (`generate --tree best:auto[:N],depth:D[,width:W]`).

The tree loop of `tree_speculative.py` with best-first trees (EAGLE-2's) whose node count follows
each row's running acceptance, inside the jitted loop, shapes static:

  1. the draft grows the largest tree, N_max nodes (`tree.grow`, D draft calls, as always);
  2. its nodes are put in rank order, best path score first (`tree.by_rank`). A child scores at
     most its parent and ties go to the lower candidate index, so the first n nodes are a tree of
     their own, exactly the best-first tree of budget n (same candidates, q and draws): for every
     n the top-n tree is "the first n nodes";
  3. each active row r asks for N_r nodes (`AdaptiveTree.choose`, below; 0 = no tree). The target
     verifies the first w nodes of every row in ONE call, w the narrowest compiled width
     (`node_widths`: 1, 2, 4, 8, ..., N_max) that holds max_r N_r: `lax.switch` over the widths,
     each branch the target call and `tree.verify` at its own width, so a batch asking for small
     trees pays for a small call (and a small verification scan);
  4. acceptance, cache compaction and the draft's commit as in `tree_speculative.py` (the path
     mapped back to the draft's node order for `commit_tree`).

Every row verifies all w nodes of the call, not only its own N_r: the extra nodes cost nothing in
that call (the draft grew them anyway, the target scores w tokens for every row), and they can
only add accepted tokens. Once no active row asks for a tree, the rest runs as plain one-token
target steps without the draft (`plain_steps.plain_loop`), as `--gamma auto` does at gamma 0.

Exactness: w depends only on the batch's past, never on the current iteration's draws, so it is a
stopping rule, and the top-w tree is a best-first tree of budget w, verified by the lossless
multi-candidate rule (`tree.py`): greedy output is token-identical to greedy decoding and sampled
output has the target's distribution whatever sizes were used.

The choice (policy 'optimal'). With verification in rank order, whether node j is accepted depends
only on nodes ranked before it, so one call at width w shows, for every compiled width u <= w,
how many tokens a top-u tree would have accepted: the accepted path's nodes ranked below u (the
path is ancestor-closed in rank, so these are a prefix of it). Each row keeps `gain [b, K]`, a
discounted mean per compiled width u_j of the tokens the nodes ranked in [u_{j-1}, u_j) added
over the calls that held u_j, and `weight [b, K]`, its discounted count of calls: each call
multiplies every weight by `decay`, held or not, and adds 1 where it held the width (held at every
call, gain <- decay gain + (1 - decay) added). Gains, not counts: a width the call did not hold
stays in step with the smaller ones, so a stale, larger count cannot make a failing row ask for
ever larger trees. The gains start from a prior counted as 1 / (1 - decay) calls that fade:
where the calibration's second stage ran (`measure_costs`, `calibrated`), the tokens this loop
accepted per call at each width there (`accepted_init`), which then also counts as `prior_weight`
calls that never fade (`CALIBRATED_PRIOR_CALLS`), a band's estimate (W0 prior_j + weight_j gain_j)
/ (W0 + weight_j). Without it one low draw of a wide band (0, 1 or 2 tokens a call at T = 1) kept
a row below that width for good, the width never held again: on the widened smoke pair at batch
1, T = 1, rows asked for 1 or 2 nodes in 64 of 98 calls where the prior and the best fixed tree
had 4, at 0.915x that tree (results/benchmarks/adaptive_tree_smoke_widened_confirmed). With it a
width not held drifts back to the prior as its evidence fades (on that pair remade, 4 keys per
input: 1.01x the best fixed tree, 0.946x without; results/benchmarks/
adaptive_tree_smoke_widened_{lasting,fading}_t1_seeds4). Otherwise the counts of a chain of min(u,
D) tokens each accepted with probability `alpha_init` (sum_i alpha^i; no gain past depth D), the top
node's acceptance measured on the first batch, or an optimistic 0.9, so that one bad first call
(e.g. a Chimera draft's, before it has any hidden state) does not end speculation (no lasting
prior). The chain reads a top-u tree as a path of min(u, D) nodes, which a best-first tree of a few
nodes seldom is (on the cpu study's widened pair it priced 4 nodes at 3.5 tokens a call:
docs/decoding.md). Where the prior itself pays for no tree, no row ever asks for one and `decode` is
greedy decoding from the start. A row asks for

    N_r = argmax over n in {0} + widths of  (1 + accepted_r(n)) / cost(n),
    accepted_r(u_j) = est_r(u_1) + ... + est_r(u_j),  est_r the bands' estimates above,
    cost(0) = 1 (a plain step),  cost(n) = D c + v(n),

tokens per greedy-step equivalent: D draft calls of c each (c: one draft call of the tree over one
step of greedy decoding) and v(n) the iteration's verification call at width n and the loop's own
work over a greedy step (both measured, `measure_costs`, or c given and v = 1 as in Theorem 8).
Ties go to the smaller tree. With the chain prior, unless no row speculates, the first iteration
verifies N_max for every row, so every width is observed at once; with a measured prior every row
starts at the prior's own choice. A width larger than the call's is not observed that iteration:
its running mean stays, the evidence behind it fades.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Iterable, NamedTuple, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import sampling, tree as tree_lib, tree_speculative, xla_options
from gqa_spec.decoding.adaptive import Calibration, width_index
from gqa_spec.decoding.calibration import first_stage, time_widths
from gqa_spec.decoding.autoregressive import EOS
from gqa_spec.decoding.plain_steps import plain_decode, plain_loop
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import (LoopState, SpeculativeResult, init_loop,
                                           with_draft_calls)
from gqa_spec.decoding.targets import Decoder
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.errors import UserError
from gqa_spec.partitioning import to_host

PyTree = Any
# Calls the calibration's measured prior (tokens accepted per call at each width) counts for in
# every row's estimate, never discounted (`AdaptiveTree.prior_weight`): about as much as the
# running evidence, which settles at 1 / (1 - decay) = 3.3 calls (`--gamma auto`'s calibrated
# alpha counts 16 positions, ~2x its running evidence).
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
    verify_ratio: v, the verification call over a one-token target call: one number for every
      width, or one per compiled width (`node_widths(N_max)`), as `measure_costs` gives.
    alpha_init: the prior's per-token acceptance (module docstring): by default an optimistic
      0.9, so that a row keeps trying trees for a few calls before its own statistics decide;
      `calibrated` sets the draft's top-node acceptance `measure_costs` found on the first batch
      (what `generate --tree best:auto...` does).
    accepted_init: the prior itself, draft tokens accepted per call at each compiled width (one
      number per `widths`, in [0, D]), in place of the chain from `alpha_init`: `calibrated`
      sets the ones `measure_costs` measured in this loop (`TreeCalibration.accepted`) where its
      second stage ran; None: the chain.
    decay: what each call multiplies the evidence behind a width's estimate by (module
      docstring).
    prior_weight: calls the prior counts for in every row's estimate for the whole run, never
      discounted (0: the prior fades with the evidence). `calibrated` sets
      `CALIBRATED_PRIOR_CALLS` where the calibration measured the prior (`accepted_init`).
    fixed_nodes: every row asks for this many nodes at every call, whatever its statistics (None:
      the choice above), or for the first count `_speculative` is given (traced), at every call
      (tests; `measure_costs` times the policy's own loop `held` instead); 0: no row asks for a
      tree, `decode` is greedy decoding (the plain calls of `guard`).
  """

  shape: TreeShape
  cost_ratio: float = 0.0
  verify_ratio: Union[float, Tuple[float, ...]] = 1.0
  alpha_init: float = 0.9
  decay: float = 0.7
  fixed_nodes: Optional[int] = None
  accepted_init: Optional[Tuple[float, ...]] = None
  prior_weight: float = 0.0

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
    if self.accepted_init is not None:
      return jnp.asarray(np.maximum.accumulate(self.accepted_init), jnp.float32)
    return jnp.asarray([sum(self.alpha_init ** i for i in range(1, min(u, self.shape.depth) + 1))
                        for u in self.widths], jnp.float32)

  def choose(self, accepted: jax.Array) -> jax.Array:
    """`[b, K]` accepted-length estimates per compiled width -> `[b]` int32 node counts (module
    docstring), 0 where no tree pays."""
    if self.fixed_nodes is not None:
      return jnp.full(accepted.shape[:1], self.fixed_nodes, jnp.int32)
    widths = self.widths
    tokens = jnp.concatenate([jnp.ones_like(accepted[:, :1]), 1.0 + accepted], axis=1)  # [b, K+1]
    v = jnp.broadcast_to(jnp.asarray(self.verify_ratio, jnp.float32), (len(widths),))  # [K]
    cost = jnp.concatenate([jnp.ones((1,), jnp.float32),
                            self.shape.depth * self.cost_ratio + v])  # [K + 1]
    best = jnp.argmax(tokens / cost[None], axis=1)  # [b]; the first (smaller) on ties
    return jnp.asarray((0,) + widths, jnp.int32)[best]

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

  def calibrated(self, calibration: Union['TreeCalibration', Calibration]) -> 'AdaptiveTree':
    """These settings with `measure_costs`' c, v, starting alpha and, where its second stage
    ran, the accepted tokens per width it measured (the prior, kept as `CALIBRATED_PRIOR_CALLS`
    calls that never fade; a chain's `Calibration` has none)."""
    depth = self.shape.depth
    accepted = getattr(calibration, 'accepted', ())
    return dataclasses.replace(
        self, cost_ratio=calibration.cost_ratio, verify_ratio=calibration.verify_ratio,
        alpha_init=min(max(calibration.alpha, 0.0), 1.0),
        accepted_init=tuple(min(max(a, 0.0), depth) for a in accepted) if accepted else None,
        prior_weight=CALIBRATED_PRIOR_CALLS if accepted else 0.0)

  def describe(self) -> str:
    v = self.verify_ratio
    v = f'{v[0]:.3g}..{v[-1]:.3g}' if isinstance(v, tuple) else f'{v:.3g}'
    replace = ',replace' if self.shape.replace else ''
    return (f'best:auto:{self.nodes_max},depth:{self.shape.depth},width:{self.shape.frontier}'
            f'{replace} (c={self.cost_ratio:.3g},v={v})')


class TreeCalibration(NamedTuple):
  """What `measure_costs` measured: `Calibration`'s fields (c, v per compiled width, the
  starting alpha, seconds per greedy step) and `accepted`, the draft tokens this loop accepted per
  call at each compiled width where its second stage ran (the prior, `AdaptiveTree.accepted_init`;
  () where it did not)."""
  cost_ratio: float
  verify_ratio: Tuple[float, ...]
  alpha: float
  step_seconds: float = 0.0
  accepted: Tuple[float, ...] = ()


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


@flax.struct.dataclass
class TreeLoopState:
  loop: LoopState
  want: jax.Array  # [b] int32 the node count each row asks for next
  gain: jax.Array  # [b, K] float32 running tokens added by the nodes ranked in [u_{j-1}, u_j)
  weight: jax.Array  # [b, K] float32 the discounted calls behind each gain


def target_cache_length(max_decode_len: int, adaptive: AdaptiveTree) -> int:
  """The target cache `decode` needs: room for an N_max-node verification call, or one slot per
  token when no row will ask for a tree."""
  return max_decode_len + (adaptive.nodes_max + 1 if adaptive.speculates else 1)


def measure_costs(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
                  max_decode_len: int, adaptive: AdaptiveTree,
                  more: Iterable[Tuple[PyTree, PyTree]] = (),
                  config: SamplingConfig = sampling.GREEDY) -> TreeCalibration:
  """(c, v, alpha) on this machine and batch, for decoding at `config`, in units of one step of
  autoregressive decoding at `config`, as `calibration.measure_costs` gives them for chains, in
  the same two stages (seconds, compiles included; each time the fastest of a few runs):

    c = one of the D draft calls that grow an N_max tree (`propose_tree` and a `commit_tree` of
        nothing accepted);
    v = (v(u) for each compiled width u): an iteration of this loop with every row verifying u
        nodes, timed whole at `config` (the policy's own loop `held` at u: its choice made every
        iteration, not taken; the first node counts a traced argument of `_speculative`: one
        compiled loop for every width), per iteration (at least that of every
        narrower width), less its tree's D draft calls; the widths and the unit again timed in
        interleaved rounds (`timing.interleaved_per_iteration`), v over that unit. It holds the
        target call at width u (the tree mask), ranking, verification at `config`, the path's
        append and compaction, statistics and the width's `lax.switch`
        (`calibration.time_widths`; at T = 1 sampling makes wide verifications dearer);
    alpha = the top-ranked node's acceptance, every row's starting per-token estimate
        (`calibrated`): in the first stage at temperature 0, its token against greedy decoding's
        at every position of greedy decoding's output on this batch, the draft fed the true prefix
        (`timing.teacher_forced`, the same pass that times c); where the second stage runs, the
        acceptance in its 1-node run of this loop at `config` (as for `--gamma auto`); both over
        at least `calibration.CALIBRATION_POSITIONS` positions, reading batches of `more` where
        this one holds fewer (as `calibration.measure_costs`);
    accepted = where the second stage runs, the draft tokens this loop accepted per call with
        every row verifying u nodes, for each width, on the same batches as that alpha
        (`TreeCalibration.accepted`: the prior of `calibrated`, `AdaptiveTree.accepted_init`).

  First the unit (autoregressive decoding per step at `config`), c, alpha and the target's calls
  of 1 and 2 tokens. If the prior at that alpha pays for no tree even with v(u) = 1 + (the 2-token
  call - the 1-token call) in steps for every width (a lower bound: an iteration does all that a
  greedy step does besides its call, with a call at least 2 tokens wide), v is that bound and
  nothing else is compiled or timed: `decode` is greedy decoding from the start (what the optimistic
  0.9 cost before: docs/decoding.md). Otherwise the loop at every width, as above. A draft that
  reads the target's hidden states (Chimera) grows its trees from those of the loop's own calls,
  which the teacher-forced pass does not make: the first stage does not stop it.
  """
  shape = adaptive.shape
  rng = jax.random.PRNGKey(0)
  batch = target.index(target_state).shape[0]
  nothing = jnp.full((batch, shape.depth), -1, jnp.int32)  # no path

  def top_token(dstate, seqs, at):
    tree, dstate = draft.propose_tree(dstate, seqs, at, rng, shape, sampling.GREEDY)
    return tree_lib.first_nodes(tree_lib.by_rank(tree)[0], 1).tokens[:, 0], dstate  # [b]

  first = first_stage(target, target_state, max_decode_len, top_token,
                      lambda dstate, seqs, at: draft.commit_tree(dstate, seqs, at, nothing),
                      draft_state, shape.depth + 1, more, config)
  t_step, t_tree, alpha = first.t_step, first.t_draft, first.alpha
  c = t_tree / shape.depth / t_step
  floor = (first.v_floor,) * len(adaptive.widths)
  reads_hidden = getattr(draft, 'reads_target_hidden', False)
  if not reads_hidden and not adaptive.calibrated(Calibration(c, floor, alpha)).speculates:
    return TreeCalibration(c, floor, alpha, t_step)
  # The policy's own loop (its choice made every iteration, not taken), at the first stage's
  # numbers: the constants differ from the run's, the program does not.
  policy, held = adaptive.calibrated(Calibration(c, floor, alpha)), np.ones((), bool)
  run = lambda u, ts=target_state, ds=draft_state: _speculative(  # one loop for every width
      target, ts, draft, ds, rng, adaptive=policy, max_decode_len=max_decode_len, config=config,
      first_nodes=np.full((batch,), u, np.int32), held=held)
  # seconds per greedy step and per iteration of this loop with every row verifying u nodes
  t_step, t_iter = time_widths(target, target_state, max_decode_len, config, run, adaptive.widths)
  # this loop's own acceptance at each width, on the first stage's batches (multi-process too):
  # the starting alpha at one node, and the prior, draft tokens accepted per call at each width
  results = {u: to_host([run(u)] + [run(u, ts, ds) for ts, ds in first.more])
             for u in adaptive.widths}
  total = lambda u, field: sum(float(np.sum(getattr(r, field))) for r in results[u])
  alpha = total(1, 'accepted') / max(total(1, 'proposed'), 1.0)
  accepted = tuple(total(u, 'accepted') / max(total(u, 'target_calls'), 1.0)
                   for u in adaptive.widths)
  return TreeCalibration(c, tuple(max(t_iter[u] / t_step - shape.depth * c, first.v_floor)
                              for u in adaptive.widths), alpha, t_step, accepted)


def decode(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
           rng: jax.Array, *, adaptive: AdaptiveTree, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None) -> SpeculativeResult:
  """Tree speculative decoding with per-row adaptive node counts (arguments as
  `tree_speculative.decode`, with `adaptive` in place of `shape`; the draft is a tree draft grown
  for `adaptive.shape`, and the target's cache has `target_cache_length(...)` slots).

  `draft_state` may be None where `adaptive.speculates` is False: the call is then greedy decoding
  of the target alone (`plain_steps.plain_decode`, as `--gamma auto` where no row speculates), with
  `sequences` `[b, 1 + max_decode_len]`.

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
  r, histogram, trace, widths = plain_decode(
      target, target_state, rng, gamma_max=adaptive.nodes_max, max_decode_len=max_decode_len,
      config=config, eos_id=eos_id, skip=skip, iteration_trace=True)
  depth, batch = adaptive.shape.depth, r.lengths.shape[0]
  zeros_b = np.zeros((batch,), np.int32)
  return SpeculativeResult(
      sequences=r.sequences, lengths=r.lengths, target_calls=r.target_calls, proposed=zeros_b,
      accepted=zeros_b, accepted_per_position=np.zeros((depth,), np.int32),
      accept_histogram=np.zeros((depth + 1,), np.int32), beta_sum=np.zeros((), np.float32),
      beta_count=np.zeros((), np.float32), loop_iterations=r.loop_iterations,
      draft_calls=np.zeros((), np.int32), tree_nodes_histogram=histogram,
      tree_nodes_trace=trace, tree_width_trace=widths)


@functools.partial(xla_options.jit, static_argnames=('target', 'draft', 'adaptive',
                                                     'max_decode_len', 'config', 'eos_id'))
def _speculative(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
                 rng: jax.Array, *, adaptive: AdaptiveTree, max_decode_len: int,
                 config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
                 skip: Optional[jax.Array] = None,
                 first_nodes: Optional[jax.Array] = None,
                 held: Optional[jax.Array] = None) -> SpeculativeResult:
  """`decode` where some row asks for a tree: the loop of the module docstring. `first_nodes`
  `[b]` int32 (optional, traced): each row's first node count in place of the policy's; with
  `fixed_nodes` a row keeps it. `held` `[]` bool (optional, traced): where True a row keeps it
  too, the policy's choice made every iteration and not taken, so that the program is the one a
  run compiles (`measure_costs` times every width so, through one compiled loop; as
  `adaptive.decode`'s `held`)."""
  shape = adaptive.shape
  depth, nmax, widths = shape.depth, adaptive.nodes_max, adaptive.widths
  reads_hidden = getattr(draft, 'reads_target_hidden', False)
  # Branches that score without writing return the cache's new entries, written once after the
  # switch (`adaptive.decode`'s verify_call: a branch that writes made XLA copy the whole cache
  # into every branch, every call).
  scores = len(widths) > 1 and hasattr(target, 'score_and_hidden' if reads_hidden else 'score')
  loop = init_loop(target, target_state, draft_state, rng, max_decode_len, depth, skip)
  batch = loop.done.shape[0]
  loop = loop.replace(result=loop.result.replace(
      tree_nodes_histogram=jnp.zeros((batch, nmax + 1), jnp.int32),
      tree_nodes_trace=jnp.full((batch, max_decode_len), -1, jnp.int32),
      tree_width_trace=jnp.full((max_decode_len,), -1, jnp.int32)))
  want = (jnp.full((batch,), adaptive.first_nodes(), jnp.int32) if first_nodes is None
          else jnp.asarray(first_nodes, jnp.int32))  # [b]
  init = TreeLoopState(loop=loop, want=want,
                       gain=jnp.broadcast_to(jnp.diff(adaptive.prior(), prepend=0.0),
                                             (batch, len(widths))),
                       weight=jnp.full((batch, len(widths)), 1.0 / (1.0 - adaptive.decay)))
  positions = jnp.arange(depth + 1)  # [D + 1]
  width_array = jnp.asarray(widths, jnp.int32)  # [K]

  def branch(w):
    def call(tstate, ranked, last, lengths, verify_rng):
      """The first w nodes verified in one target call: `(path [b, D], k [b], t [b], tstate,
      hidden [b, D + 1, E] of the root and the path, or a placeholder)`; with `scores` the new
      cache entries (`N_max + 1` wide) in place of tstate."""
      sub = tree_lib.first_nodes(ranked, w)  # [b, w] nodes
      tokens = jnp.concatenate([last, sub.tokens], axis=1)  # [b, w + 1]
      tree_positions = lengths[:, None] + jnp.concatenate(
          [jnp.zeros((batch, 1), jnp.int32), sub.depths], axis=1)  # [b, w + 1]
      mask = tree_lib.attention_mask(sub.parents, depth)  # [b, w + 1, w + 1]
      if reads_hidden and scores:  # Chimera: the hidden states of this same call
        logits, hidden, entries = target.score_and_hidden(
            tstate, tokens, tree_positions, mask)  # [b, w + 1, V], [b, w + 1, E]
        tstate = target.pad_entries(entries, nmax + 1)
      elif reads_hidden:
        logits, hidden, tstate = target.tokens_to_logits_and_hidden(
            tstate, tokens, tree_positions, mask)  # [b, w + 1, V], [b, w + 1, E]
      elif scores:
        logits, entries = target.score(tstate, tokens, tree_positions, mask)  # [b, w + 1, V]
        tstate = target.pad_entries(entries, nmax + 1)
      else:
        logits, tstate = target.tokens_to_logits(tstate, tokens, tree_positions,
                                                 mask)  # [b, w + 1, V]
      path, k, t = tree_lib.verify(verify_rng, sub, logits, depth, config)  # [b, D], [b], [b]
      if reads_hidden:  # the root's and the path's, at positions n, n + 1, ... (junk past it)
        rows = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), path + 1], axis=1)  # [b, D + 1]
        hidden = jnp.take_along_axis(hidden, rows[..., None], axis=1)  # [b, D + 1, E]
      else:
        hidden = jnp.zeros((), jnp.float32)
      return path, k, t, tstate, hidden
    return call

  def body(a: TreeLoopState) -> TreeLoopState:
    s, r = a.loop, a.loop.result
    rng, draft_rng, verify_rng = jax.random.split(s.rng, 3)
    active = ~s.done  # [b]
    want = jnp.where(active, a.want, 0)  # [b]
    tree, dstate = draft.propose_tree(s.draft_state, r.sequences, r.lengths, draft_rng, shape,
                                      config)  # [b, N_max] nodes
    ranked, order = tree_lib.by_rank(tree)  # [b, N_max] best first; order: rank -> tree index
    last = jnp.take_along_axis(r.sequences, r.lengths[:, None], axis=1)  # [b, 1]
    index = width_index(widths, jnp.max(want))  # the narrowest width holding every ask
    width = width_array[index]  # []
    args = (s.target_state, ranked, last, r.lengths, verify_rng)
    if len(widths) == 1:
      path, k, t, tstate, hidden = branch(nmax)(*args)
    else:
      path, k, t, tstate, hidden = jax.lax.switch(index, [branch(w) for w in widths], *args)
      if scores:
        tstate = target.append(s.target_state, tstate)  # tstate: the branch's entries
    if reads_hidden:
      dstate = draft.observe(dstate, hidden, r.lengths)

    sequences, lengths, ended, tstate = tree_speculative.accept_path(
        target, tstate, r, ranked.tokens, path, k, t, active, max_decode_len, eos_id)
    draft_path = jnp.where(path >= 0, jnp.take_along_axis(order, jnp.maximum(path, 0), axis=1),
                           -1)  # [b, D] in the draft's node order
    dstate = draft.commit_tree(dstate, sequences, lengths, draft_path)
    done = s.done | ended | (lengths >= max_decode_len)

    # What a top-u tree would have accepted, for every compiled u <= this call's width.
    below = (path[:, None, :] >= 0) & (path[:, None, :] < width_array[None, :, None])  # [b, K, D]
    count = jnp.sum(below, axis=2).astype(jnp.float32)  # [b, K]
    observed = active[:, None] & (width_array[None] <= width)  # [b, K]
    added = jnp.diff(count, axis=1, prepend=0.0)  # [b, K] tokens each band of ranks added
    gain, weight = adaptive.observe(a.gain, a.weight, added, observed, active)  # [b, K] each

    act = active.astype(jnp.int32)  # [b]
    rows = jnp.arange(batch)
    verified = jnp.sum(ranked.valid & (jnp.arange(nmax)[None] < width), axis=1,
                       dtype=jnp.int32)  # [b]
    acc = (positions[None, :depth] < k[:, None]) & active[:, None]  # [b, D]
    result = r.replace(
        sequences=sequences, lengths=lengths, target_calls=r.target_calls + act,
        proposed=r.proposed + verified * act, accepted=r.accepted + k * act,
        accepted_per_position=r.accepted_per_position + jnp.sum(acc, axis=0, dtype=jnp.int32),
        accept_histogram=r.accept_histogram + jnp.sum(
            jax.nn.one_hot(k, depth + 1, dtype=jnp.int32) * act[:, None], axis=0),
        loop_iterations=r.loop_iterations + 1,
        tree_nodes_histogram=r.tree_nodes_histogram.at[rows, want].add(act),
        tree_nodes_trace=r.tree_nodes_trace.at[
            rows, jnp.where(active, r.target_calls, max_decode_len)].set(want, mode='drop'),
        tree_width_trace=r.tree_width_trace.at[r.loop_iterations].set(width, mode='drop'))
    loop = LoopState(target_state=tstate, draft_state=dstate, done=done, result=result, rng=rng)
    if adaptive.fixed_nodes is None:
      want = jnp.where(active, adaptive.choose(adaptive.accepted(gain, weight)), a.want)  # [b]
    else:  # every row keeps its first count
      want = a.want
    if held is not None:  # the choice made, then not taken (the calibration's timing)
      want = jnp.where(held, a.want, want)
    return TreeLoopState(loop=loop, want=want, gain=gain, weight=weight)

  def plain_statistics(s: LoopState, before: SpeculativeResult) -> LoopState:
    """The plain steps' node count 0 in the traces and the histogram."""
    r = s.result
    calls = jnp.arange(max_decode_len)  # [max_len]
    plain = ((calls[None] >= before.target_calls[:, None])
             & (calls[None] < r.target_calls[:, None]))  # [b, max_len]
    plain_iteration = (calls >= before.loop_iterations) & (calls < r.loop_iterations)  # [max_len]
    return s.replace(result=r.replace(
        tree_nodes_trace=jnp.where(plain, 0, r.tree_nodes_trace),
        tree_nodes_histogram=r.tree_nodes_histogram.at[:, 0].add(
            r.target_calls - before.target_calls),
        tree_width_trace=jnp.where(plain_iteration, 0, r.tree_width_trace)))

  # Tree iterations while some active row asks for a tree; then plain target steps to the end.
  final = jax.lax.while_loop(
      lambda a: ~jnp.all(a.loop.done) & jnp.any(~a.loop.done & (a.want > 0)), body, init)
  loop = plain_loop(target, final.loop, max_decode_len, config, eos_id)
  return with_draft_calls(plain_statistics(loop, final.loop.result))
