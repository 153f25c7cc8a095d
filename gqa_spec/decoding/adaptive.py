"""Speculative decoding that tunes its own draft length (`generate --gamma auto`).

The loop of `speculative.py` with one change: the draft length is chosen inside the jitted loop, at
every iteration, from what the rows have seen: by the batch's slowest row (policy 'optimal'), or per
row (HF's heuristic schedule, the confidence stop), in [0, gamma_max]. Shapes stay static: an
iteration runs at one of a few compiled widths w (`verify_gammas`: 1, 2, 3, 4, 6, 8, 12, ... up to
gamma_max), the narrowest that holds the longest proposal an active row asked for; the draft
proposes into `[b, w]` buffers (a model draft stops calling its decoder once every row has its
gamma_r tokens, `ModelDraft.propose_upto`; other drafts propose w), the target scores w + 1
positions, and `sampling.verify(limit=gamma_r)` verifies only each row's own prefix: positions
past gamma_r are rejected and, when the prefix is accepted whole, the bonus token comes from
p_{gamma_r + 1}. The causal mask keeps the positions past gamma_r from changing p at the ones
before. So a batch whose rows all ask for gamma 1 pays for a two-token call, not a gamma_max + 1
one (a draft that reads the target's hidden states, Chimera, keeps the gamma_max + 1 width). Each
width has its own while loop, which runs while the batch's longest proposal needs that width; an
outer loop runs them in turn until no row speculates (`loops_per_width`). Until 2026-11-29 one loop
chose the width per iteration in a `lax.switch` (its branches scored without writing, the
entries written after it): at batch 8 on the widened smoke pair, gamma 2, it cost 0.1-5.4% an
iteration over `speculative.decode` in three runs, the loops per width 0.0-1.2%; at gamma 1 both
3-8% (results/benchmarks/adaptive_loop_cost_smoke_widened_b8_loops.md, docs/adaptive.md). Once no
active row speculates (every one at gamma_r = 0, which is final), the rest runs as plain one-token
target steps in a second loop, without the draft (`plain_steps.plain_loop`). When the costs say
that not even the starting `alpha_init` would pay for a proposal (`AdaptiveGamma.speculates` is
False: a draft that costs what the target costs, or one whose acceptance
`calibration.measure_costs` found too low for its cost), `decode` is `autoregressive.decode`'s
loop on a cache of one slot per token (`call_tokens`), compiled with two length
statistics in one program (`plain_steps.plain_decode`).

Exactness: gamma_r depends only on the past (the batch's rows' earlier iterations, and with a
confidence stop the draft's distributions at the positions already proposed), never on this
iteration's draws, so it is a stopping rule; the correctness argument (Leviathan et al. App. A.1;
Chen et al. Theorem 1) holds for each iteration whatever gamma it used, and greedy output is
token-identical to greedy decoding.

Policies (`AdaptiveGamma.policy`):
  'optimal'   (default) every row keeps alpha_r, its acceptance (Corollary 6: alpha = E(beta)) as
              a discounted ratio, the betas of the positions it tried over their number, the
              weight before a call multiplied by `decay` per position it tries, starting from
              `alpha_init` counted as gamma_max positions; the calibration's alpha also counts
              as `prior_weight` positions that never fade (`AdaptiveGamma.calibrated`).
              The batch's next draft length is argmax_gamma of Theorem 8 over
              [0, gamma_max] at the lowest alpha_r of its active rows, each shrunk toward the
              rows' pooled alpha by how much of their spread is noise (`batch_alpha`;
              `batch_gamma`, `theory.optimal_gammas`; with the measured costs, a gamma >= 1
              costs gamma c + v(gamma) plain steps, `calibration.measure_costs`), and every
              active row proposes that many (a confidence stop may end a row's proposal
              sooner): an iteration costs what its longest proposal costs, and the batch takes
              as many iterations as its slowest row (priced: `theory.batch_inflation`, at the
              calibration batches' output lengths, `AdaptiveGamma.lengths`).
              At batch 1 this is the row's own Theorem 8 gamma; above it, a length per row cost
              the widened pair's batch-8 cells up to 44% of their speed (`batch_gamma`). Gamma 0
              is final: the draft is no longer kept up to date and the batch stays on plain
              target steps; so it is taken only when it also wins at alpha + one standard
              error.
  'heuristic' HF's `num_assistant_tokens_schedule="heuristic"`: +2 after a proposal accepted whole,
              else -1, within [1, gamma_max].
  'fixed'     every row keeps `gamma_init` (not a CLI choice: the loop at one length, for tests
              and `benchmarks/adaptive_overhead.py`; `calibration.measure_costs` times the
              'optimal' policy's own program instead, `held` at each width).
`confidence` > 0 (`--draft-confidence`, model drafts only) also ends a row's proposal after the
first token whose draft top probability is below it (HF's `assistant_confidence_threshold`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding import sampling, theory, xla_options
from gqa_spec.decoding.autoregressive import EOS
from gqa_spec.decoding.drafts.base import Draft
from gqa_spec.decoding.plain_steps import as_adaptive_result, plain_decode, plain_loop
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import (LoopState, SpeculativeResult, append_accepted,
                                           init_loop, record_call, with_draft_calls)
from gqa_spec.decoding.targets import Decoder
from gqa_spec.errors import UserError

PyTree = Any
POLICIES = ('optimal', 'heuristic', 'fixed')
# Positions the calibration's alpha counts for in every row's estimate (`prior_weight`).
# Simulated at batch 1 on the widened smoke pair's costs (`benchmarks/alpha_memory.py`), 16 with a
# decay of 0.85 ran at 0.987x-1.000x the best fixed gamma at constant acceptances 0.55-0.85 (0.942x
# at worst with the calibration 0.06 off), where the per-call discount with no lasting prior ran at
# 0.925x-0.986x, and kept up with acceptances that switch between 0.9 and 0.4.
CALIBRATED_PRIOR_WEIGHT = 16.0


@dataclasses.dataclass(frozen=True)
class AdaptiveGamma:
  """How each row chooses its draft length; hashable (a static `jax.jit` argument).

  Attributes:
    gamma_max: the longest proposal (the compiled width is gamma_max + 1).
    policy: 'optimal' (Theorem 8 from a running alpha and `cost_ratio`) or 'heuristic' (HF's).
    cost_ratio: c, one draft call's time over one target call's (policy 'optimal').
    verify_ratio: v, the verification call over a one-token target call (policy 'optimal'): one
      number for every gamma (1 = Theorem 8 as printed, which assumes verification costs one
      step) or gamma_max numbers v(1)..v(gamma_max), as `calibration.measure_costs` gives.
    confidence: stop a row's proposal after a token whose draft top probability is below this
      (0 = off).
    gamma_init: every row's first draft length (None: the policy's choice at `alpha_init`, or
      gamma_max // 2 for 'heuristic'); 0 under 'optimal': no row speculates, `decode` is greedy
      decoding (the plain calls of `guard`).
    alpha_init: the running alpha's starting value (policy 'optimal'): by default an optimistic
      0.9, so that a row tries speculating (at the gamma this alpha would pay for) before its own
      alpha decides; `calibrated` sets the draft's acceptance `calibration.measure_costs` found
      on the first batch instead (what `generate --gamma auto` does).
    decay: the factor the running alpha's weight is multiplied by for each position a call tries
      (policy 'optimal', `running_alpha`): 0.85, a memory of ~7-11 positions. The ratio counts
      every tried position alike, which is the acceptance's maximum-likelihood estimate whatever
      the rule that stopped each proposal; a mean of each call's mean (an earlier estimator)
      weights a call that a first-token rejection ended (one position, beta 0) as much as a run
      of gamma_max accepted ones and reads alpha low: on the widened pair of
      `benchmarks/widened.py` (translation, the 0.1-noise draft) it took 2 of 8 rows to gamma 0,
      final, after three calls each, one of them having accepted 0.75 of the positions it tried.
      Discounted per call (0.7, the form before this one), a row at gamma 1 rested on ~5
      positions (a standard error of ~0.2), and a short run of accepted tokens sent it to gamma 8
      where gamma 1 was best: 42 of 116 calls, 0.80x of the best fixed gamma on the widened smoke
      pair (`benchmarks/alpha_memory.py` simulates the forms).
    prior_weight: how many positions `alpha_init` counts for in every row's estimate for the whole
      run, never discounted (policy 'optimal'; 0: the starting value fades with the data).
      `calibrated` sets `CALIBRATED_PRIOR_WEIGHT`: the calibration's alpha is measured on this
      task and draft over at least `calibration.CALIBRATION_POSITIONS` positions, and a row's
      estimate is then (prior_weight alpha_init + w alpha_r) / (prior_weight + w), its own
      evidence w moving it from there (`with_prior`).
    one_width: verify every proposal at gamma_max + 1 tokens: one compiled width, one loop
      (`verify_widths`). On a GPU the adaptive loop at a fixed gamma cost 40-90 us an iteration
      more than `speculative.decode` (results/gpu/guard_2026-11-28, when the widths were a
      `lax.switch` in one loop whose branches still copied the cache), while a verification's
      cost there hardly depends on its width at these sizes; whether one width closes that gap is
      what `benchmarks/adaptive_overhead.py`'s 'one width' row measures. The calibration times
      the loop this setting gives (`calibration.measure_costs(one_width=...)`).
    lengths: the tokens each row of a few batches needs (policy 'optimal'; `theory.Lengths`:
      `calibrated` sets the greedy output lengths of the batches the calibration read;
      `theory.batch_lengths(rows, length)` for rows of one length). With lengths a gamma's
      expected tokens are priced over the iterations such a batch takes, which waits for its
      slowest row (`theory.batch_inflation`), not one row's Eq. 1; (): Theorem 8 as printed. At
      batch 8 on the widened smoke pair, where every row's own Theorem 8 said gamma 1 paid 1.04x,
      the batch took 10% more iterations than the rows' mean tokens a call implied and ran at
      0.90x greedy decoding.
  """

  gamma_max: int = 8
  policy: str = 'optimal'
  cost_ratio: float = 0.0
  verify_ratio: Union[float, Tuple[float, ...]] = 1.0
  confidence: float = 0.0
  gamma_init: Optional[int] = None
  alpha_init: float = 0.9
  decay: float = 0.85
  prior_weight: float = 0.0
  one_width: bool = False
  lengths: theory.Lengths = ()

  def __post_init__(self):
    if int(self.gamma_max) != self.gamma_max or self.gamma_max < 1:
      raise UserError(f'gamma_max must be a positive integer, got {self.gamma_max}')
    if self.policy not in POLICIES:
      raise UserError(f'gamma policy must be one of {", ".join(POLICIES)}, got {self.policy!r}')
    if not self.cost_ratio >= 0:
      raise UserError(f'cost ratio must be >= 0, got {self.cost_ratio}')
    v = self.verify_ratio
    if isinstance(v, (tuple, list)):
      if len(v) != self.gamma_max or not all(x > 0 for x in v):
        raise UserError(f'per-gamma verify ratios must be {self.gamma_max} numbers > 0, got {v}')
      object.__setattr__(self, 'verify_ratio', tuple(float(x) for x in v))  # hashable
    elif not v > 0:
      raise UserError(f'verify ratio must be > 0, got {v}')
    if not 0.0 <= self.confidence < 1.0:
      raise UserError(f'draft confidence must be in [0, 1), got {self.confidence}')
    if self.gamma_init is not None and not 0 <= self.gamma_init <= self.gamma_max:
      raise UserError(f'gamma_init must be in [0, {self.gamma_max}], got {self.gamma_init}')
    if not 0.0 <= self.alpha_init <= 1.0 or not 0.0 <= self.decay < 1.0:
      raise UserError('alpha_init must be in [0, 1] and decay in [0, 1)')
    if not self.prior_weight >= 0:
      raise UserError(f'prior_weight must be >= 0, got {self.prior_weight}')
    object.__setattr__(self, 'lengths', theory.checked_lengths(self.lengths))  # hashable

  def first_gamma(self) -> int:
    """Every row's first draft length, a Python int."""
    if self.gamma_init is not None:
      return self.gamma_init
    if self.policy == 'heuristic':
      return max(1, self.gamma_max // 2)
    if self.policy == 'fixed':
      raise UserError('the fixed gamma policy needs gamma_init')
    return _optimal_first_gamma(self.alpha_init, self.cost_ratio, self.gamma_max,
                                self.verify_ratio, self.lengths)

  def calibrated(self, calibration: 'Calibration') -> 'AdaptiveGamma':
    """These settings with `calibration.measure_costs`' c, v and alpha, the alpha kept as every
    row's prior (`CALIBRATED_PRIOR_WEIGHT` positions), and the output lengths of the batches it
    read."""
    return dataclasses.replace(self, cost_ratio=calibration.cost_ratio,
                               verify_ratio=calibration.verify_ratio,
                               alpha_init=min(max(calibration.alpha, 0.0), 1.0),
                               prior_weight=CALIBRATED_PRIOR_WEIGHT,
                               lengths=calibration.lengths)

  @property
  def verify_widths(self) -> Tuple[int, ...]:
    """The proposal lengths the loop compiles a verification call for: `verify_gammas`, or
    gamma_max alone with `one_width`."""
    return (self.gamma_max,) if self.one_width else verify_gammas(self.gamma_max)

  @property
  def speculates(self) -> bool:
    """Whether any row ever proposes: False when the costs say that not even `alpha_init` would
    pay for gamma >= 1 (policy 'optimal', first gamma 0, final for every row); `decode` is then
    autoregressive decoding itself, on a cache of `max_decode_len + 1` slots
    (`call_tokens`)."""
    return self.first_gamma() > 0

  @property
  def call_tokens(self) -> int:
    """Tokens of `decode`'s widest target call (`targets.cache_length`): a gamma_max + 1 token
    verification, or 1 when no row will speculate."""
    return self.gamma_max + 1 if self.speculates else 1

  def first(self, batch: int) -> jax.Array:
    """`[b]` the first iteration's draft lengths."""
    return jnp.full((batch,), self.first_gamma(), jnp.int32)

  def describe(self) -> str:
    v = self.verify_ratio
    v = f'{v[0]:.3g}..{v[-1]:.3g}' if isinstance(v, tuple) else f'{v:.3g}'
    extra = f',c={self.cost_ratio:.3g},v={v}' if self.policy == 'optimal' else ''
    if self.policy == 'optimal' and self.lengths:
      extra += f',lengths={theory.describe_lengths(self.lengths)}'
    conf = f',confidence={self.confidence:g}' if self.confidence else ''
    one = ',one_width' if self.one_width else ''
    return f'auto({self.policy},max={self.gamma_max}{extra}{conf}{one})'


@functools.lru_cache(maxsize=256)
def _optimal_first_gamma(alpha: float, c: float, gamma_max: int,
                         v: Union[float, Tuple[float, ...]], lengths: theory.Lengths) -> int:
  """Theorem 8's gamma at `alpha`, a Python int (`theory.step_gamma`, on the host; cached:
  `decode` asks once per call)."""
  return theory.step_gamma(alpha, c, gamma_max, v, lengths)


@flax.struct.dataclass
class AdaptiveState:
  loop: LoopState
  want: jax.Array  # [b] the draft length each row asks for next
  alpha: jax.Array  # [b] running acceptance estimate
  weight: jax.Array  # [b] the (discounted) positions behind it


def verify_gammas(gamma_max: int) -> Tuple[int, ...]:
  """The proposal lengths the loop compiles a verification call for (each + 1 tokens): 1, 2, 3,
  4, 6, 8, 12, 16, ... below gamma_max, and gamma_max."""
  out, g = [1, 2, 3], 4
  while g < gamma_max:
    out += [g, g * 3 // 2]
    g *= 2
  return tuple(sorted({x for x in out if x < gamma_max} | {gamma_max}))


def width_index(widths: Tuple[int, ...], longest: jax.Array) -> jax.Array:
  """`[]` int32: the index of the first of the sorted `widths` >= `longest` (len(widths) if none),
  as `jnp.searchsorted` (side 'left') gives it, but as one comparison and a sum: the loops call it
  every iteration, and `jnp.searchsorted`'s default method is a `fori_loop` of log2(len) steps, a
  while loop nested in the decoding loop (on a GPU each of its steps is its own kernel launches).
  """
  return jnp.sum(jnp.asarray(widths, jnp.int32) < longest, dtype=jnp.int32)


def loops_per_width(widths: Tuple[int, ...], going, longest, body, init):
  """`lax.while_loop(going, ...)` over `body(state, w)` at the narrowest of the sorted `widths`
  holding `longest(state)` (`[]`, the batch's largest ask), w static: each width's while loop in
  turn, each running while `going` and the ask needs its width (most run no iteration), inside an
  outer loop while `going`. No `lax.switch` over the widths in the loop: a branch that wrote the
  cache made XLA copy all of it on every entry (`tests/decoding/test_adaptive_hlo.py`); each
  width's body is compiled once."""
  index = lambda a: width_index(widths, longest(a))  # []

  def each_width(a):
    for i, w in enumerate(widths):
      a = jax.lax.while_loop(lambda a, i=i: going(a) & (index(a) == i),
                             lambda a, w=w: body(a, w), a)
    return a

  return jax.lax.while_loop(going, each_width, init)


def verify_width(gamma: int, widths: Tuple[int, ...]) -> int:
  """The narrowest compiled proposal length of `widths` (`AdaptiveGamma.verify_widths`) that
  holds `gamma`."""
  return min(w for w in widths if w >= gamma)


class Calibration(NamedTuple):
  """What `calibration.measure_costs` measured: `AdaptiveGamma`'s cost_ratio, verify_ratio and
  alpha_init, the unit they are in, seconds per greedy decoding step (`guard`; 0: not
  measured), and its lengths: the greedy output length of every row of the batches it read, in
  tokens (`theory.Lengths`; (): not measured)."""
  cost_ratio: float
  verify_ratio: Tuple[float, ...]
  alpha: float
  step_seconds: float = 0.0
  lengths: theory.Lengths = ()


def decode(target: Decoder, target_state: PyTree, draft: Draft, draft_state: PyTree,
           rng: jax.Array, *, adaptive: AdaptiveGamma, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None,
           first_gammas: Optional[jax.Array] = None,
           held: Optional[jax.Array] = None) -> SpeculativeResult:
  """Speculative decoding with adaptive draft lengths (arguments as `speculative.decode`).

  `first_gammas` `[b]` int32 (optional): each row's first draft length in place of the policy's,
  a traced argument, so one compiled loop serves any values (the loop runs with them even where
  the policy's own first length would be 0). Under 'optimal' a row at 0 stays at 0, as any row
  does.
  `held` `[]` bool (optional, traced): where True every row keeps its first draft length; the
  policy still makes its choice every iteration, unused, so the compiled loop is the one a run of
  this policy compiles (constants aside). `calibration.measure_costs` times the loop so, at every
  width, with one compile: the iteration it prices is the policy's own. On an H200 the policies
  that choose per iteration ran the loop at 2.6 greedy steps an iteration where the fixed policy's
  program, timed in its place until then, took 1.8 (results/gpu/adaptive_smoke_2026-11-27).

  `draft_state` may be None where `adaptive.speculates` is False: the call is then greedy
  decoding's loop on the target alone, one jitted program with the length statistics
  (`plain_steps.plain_decode`), its result in this function's form (`sequences` then
  `[b, 1 + max_decode_len]`, without the draft's slack), so that its dispatch costs about what
  greedy decoding's does (the draft and the settings are not even hashed).

  Returns:
    `SpeculativeResult` with depth gamma_max, plus `gamma_histogram` `[b, gamma_max + 1]` (how
    often each row verified a proposal of each length), `gamma_trace` `[b, max_decode_len]` (the
    length of each of the row's target calls, -1 after its last) and `draft_steps` `[]` (draft
    decode calls made, all rows together; the iteration's compiled width for drafts that cannot
    stop early).
  """
  if adaptive.confidence and getattr(draft, 'propose_upto', None) is None:
    raise UserError(f'--draft-confidence needs a model draft (one with draft probabilities); '
                    f'{type(draft).__name__} has none')
  if not adaptive.speculates and first_gammas is None:
    r, histogram, trace = plain_decode(target, target_state, rng, gamma_max=adaptive.gamma_max,
                                 max_decode_len=max_decode_len, config=config, eos_id=eos_id,
                                 skip=skip)
    return as_adaptive_result(r, histogram, trace, adaptive.gamma_max)
  return _speculative(target, target_state, draft, draft_state, rng, adaptive=adaptive,
                      max_decode_len=max_decode_len, config=config, eos_id=eos_id, skip=skip,
                      first_gammas=first_gammas, held=held)


@functools.partial(xla_options.jit, static_argnames=('target', 'draft', 'adaptive',
                                                     'max_decode_len', 'config', 'eos_id'))
def _speculative(target: Decoder, target_state: PyTree, draft: Draft, draft_state: PyTree,
                 rng: jax.Array, *, adaptive: AdaptiveGamma, max_decode_len: int,
                 config: SamplingConfig, eos_id: int,
                 skip: Optional[jax.Array],
                 first_gammas: Optional[jax.Array] = None,
                 held: Optional[jax.Array] = None) -> SpeculativeResult:
  """`decode` where rows speculate (its docstring)."""
  gmax = adaptive.gamma_max
  upto = getattr(draft, 'propose_upto', None)
  loop = init_loop(target, target_state, draft_state, rng, max_decode_len, gmax, skip)
  batch = loop.done.shape[0]
  loop = loop.replace(result=loop.result.replace(
      gamma_histogram=jnp.zeros((batch, gmax + 1), jnp.int32),
      gamma_trace=jnp.full((batch, max_decode_len), -1, jnp.int32),
      draft_steps=jnp.zeros((), jnp.int32)))
  want = adaptive.first(batch) if first_gammas is None else first_gammas.astype(jnp.int32)
  init = AdaptiveState(loop=loop, want=want,
                       alpha=jnp.full((batch,), adaptive.alpha_init, jnp.float32),
                       weight=jnp.full((batch,), float(gmax), jnp.float32))
  positions = jnp.arange(gmax + 1)  # [gmax + 1]
  widths = adaptive.verify_widths

  def speculate(s: LoopState, want, draft_rng, verify_rng, w: int):
    """One iteration's proposal of up to `w` tokens a row (`want [b]` <= w, static: each width
    has its loop, `loops_per_width`) and its verification, `w + 1` tokens wide; the results padded
    to gmax (`new [b, gmax + 1]`, `beta [b, gmax]`) for the loop's statistics."""
    r = s.result
    if upto is not None:
      tokens, q, limit, steps, dstate = upto(s.draft_state, r.sequences, r.lengths, draft_rng, w,
                                             config, want, adaptive.confidence)  # [b, w], ...
    else:
      tokens, q, dstate = draft.propose(s.draft_state, r.sequences, r.lengths, draft_rng, w,
                                        config)  # [b, w], [b, w, V]
      limit, steps = want, jnp.asarray(w, jnp.int32)
    last = jnp.take_along_axis(r.sequences, r.lengths[:, None], axis=1)  # [b, 1]
    inputs = jnp.concatenate([last, tokens], axis=1)  # [b, w + 1]
    if getattr(draft, 'reads_target_hidden', False):  # one width, gmax (`verify_widths`)
      logits, hidden, tstate = target.tokens_to_logits_and_hidden(s.target_state, inputs)
      dstate = draft.observe(dstate, hidden, r.lengths)
    else:
      logits, tstate = target.tokens_to_logits(s.target_state, inputs)  # [b, w + 1, V]
    k, t, beta = sampling.verify(verify_rng, tokens, q, logits, config, limit)  # [b], [b], [b, w]
    new = jnp.concatenate([tokens, jnp.zeros_like(tokens[:, :1])], axis=1)  # [b, w + 1]
    new = jnp.where(positions[None, :w + 1] == k[:, None], t[:, None], new)  # x_1..x_k, t, junk
    new = jnp.pad(new, ((0, 0), (0, gmax - w)))  # [b, gmax + 1]
    return new, k, limit, jnp.pad(beta, ((0, 0), (0, gmax - w))), steps, tstate, dstate

  def speculating(a: AdaptiveState):  # some active row wants a proposal
    return jnp.any(~a.loop.done & (a.want > 0))

  def body(a: AdaptiveState, w: int) -> AdaptiveState:
    s, r = a.loop, a.loop.result
    rng, draft_rng, verify_rng = jax.random.split(s.rng, 3)
    active = ~s.done  # [b]
    want = jnp.where(active, a.want, 0)  # [b]
    new, k, limit, beta, steps, tstate, dstate = speculate(s, want, draft_rng, verify_rng, w)
    sequences, lengths, ended = append_accepted(r, new, k, active, max_decode_len, eos_id)
    tstate = target.rollback(tstate, lengths)
    dstate = draft.commit(dstate, sequences, lengths)
    done = s.done | ended | (lengths >= max_decode_len)

    tried = (positions[None, :gmax] <= k[:, None]) & (positions[None, :gmax] < limit[:, None])
    tried &= active[:, None]  # [b, gmax]
    acc = (positions[None, :gmax] < k[:, None]) & active[:, None]  # [b, gmax]
    alpha, weight = running_alpha(a.alpha, a.weight, beta, tried, adaptive.decay)  # [b], [b]
    if adaptive.policy == 'heuristic':
      nxt = jnp.clip(jnp.where(k == a.want, a.want + 2, a.want - 1), 1, gmax)  # HF's schedule
    elif adaptive.policy == 'fixed':
      nxt = a.want
    else:  # one length for the batch, Theorem 8 at its slowest row's alpha (`batch_gamma`)
      nxt = jnp.where(a.want > 0, batch_gamma(alpha, weight, ~done, adaptive), 0)
    if held is not None:  # the choice made, then not taken (`decode`: the calibration's timing)
      nxt = jnp.where(held, a.want, nxt)
    rows = jnp.arange(batch)
    result = record_call(r, sequences, lengths, active, limit, k, acc, tried, beta, gmax).replace(
        gamma_histogram=r.gamma_histogram.at[rows, limit].add(active.astype(jnp.int32)),
        gamma_trace=r.gamma_trace.at[rows, jnp.where(active, r.target_calls, max_decode_len)].set(
            limit, mode='drop'),
        draft_steps=r.draft_steps + steps)
    loop = LoopState(target_state=tstate, draft_state=dstate, done=done, result=result, rng=rng)
    return AdaptiveState(loop=loop, want=jnp.where(active, nxt, a.want), alpha=alpha,
                         weight=weight)

  def plain_statistics(s: LoopState, calls_before: jax.Array) -> LoopState:
    """The plain steps' draft length 0 in `gamma_trace` and `gamma_histogram`."""
    r = s.result
    calls = jnp.arange(max_decode_len)[None]  # [1, max_decode_len]
    plain = (calls >= calls_before[:, None]) & (calls < r.target_calls[:, None])  # [b, max_len]
    return s.replace(result=r.replace(
        gamma_trace=jnp.where(plain, 0, r.gamma_trace),
        gamma_histogram=r.gamma_histogram.at[:, 0].add(r.target_calls - calls_before)))

  # Speculative iterations while some active row wants a proposal; then, every active row at 0
  # (final for it), plain target steps in a loop of their own, with no draft and no branch.
  final = loops_per_width(widths, lambda a: ~jnp.all(a.loop.done) & speculating(a),
                          lambda a: jnp.max(jnp.where(a.loop.done, 0, a.want)), body, init)
  loop = plain_loop(target, final.loop, max_decode_len, config, eos_id)
  return with_draft_calls(plain_statistics(loop, final.loop.result.target_calls))


def batch_gamma(alpha: jax.Array, weight: jax.Array, active: jax.Array,
                adaptive: AdaptiveGamma) -> jax.Array:
  """`[]` int32: the draft length of the batch's next iteration (policy 'optimal'), Theorem 8's
  gamma (`theory.optimal_gammas`, over [0, gamma_max]) at the batch's acceptance
  (`batch_alpha`: the lowest of the `active [b]` rows' running alphas `alpha [b]`, each over
  `weight [b]` positions, with the calibration's lasting prior (`with_prior`), shrunk toward the
  batch's pooled alpha).

  One length for the batch, not one per row: an iteration costs what its longest proposal costs (the
  draft runs until the longest row has its tokens, the verification call is the narrowest width that
  holds it), so a row proposing less saves nothing and accepts less; and the batch takes as many
  iterations as its slowest row needs, so the length that pays is the one that pays for the row
  accepting least, its expected tokens over the iterations such a batch takes
  (`AdaptiveGamma.lengths`, `theory.batch_inflation`). With a length per row (Theorem 8 at
  each row's alpha), the batch-8 cells of the widened pair ran 0.56x-1.02x greedy decoding (4 of 6
  below 0.9x) where a fixed gamma of 1-2 reached up to 1.13x (results/benchmarks/
  adaptive_gamma_cpu_widened): the batch paid for the longest row's 4 tokens every iteration, and
  a row at 0 (plain steps, one token a call) among speculating rows became the batch's straggler.
  At batch 1 the two are the same.

  Gamma 0 is final (the loop leaves the draft behind), so the batch leaves speculation only when
  gamma 0 also wins at its acceptance plus one standard error (`batch_alpha`); where only the
  estimate itself says 0, it proposes Theorem 8's gamma at that upper value."""
  estimate, se = batch_alpha(*with_prior(alpha, weight, adaptive), active)  # [], []
  both = jnp.stack([estimate, jnp.minimum(estimate + se, 1.0)])  # [2]
  gamma, upper = theory.optimal_gammas(both, adaptive.cost_ratio, adaptive.gamma_max,
                                       adaptive.verify_ratio, adaptive.lengths)
  return jnp.where(gamma > 0, gamma, upper)


def batch_alpha(alpha: jax.Array, weight: jax.Array, active: jax.Array
                ) -> Tuple[jax.Array, jax.Array]:
  """The acceptance the batch's draft length is chosen for, `[]`, and its standard error `[]`:
  the lowest of the `active [b]` rows' running alphas `alpha [b]` (each the ratio over `weight
  [b]` discounted positions, `running_alpha`), after shrinking each toward the active rows' pooled
  alpha (an empirical-Bayes posterior mean).

  The plain minimum of 8 noisy ratios reads the slowest row low: a row's running alpha rests on a
  few calls' positions (its weight, ~7 at gamma 2), a standard error of ~0.17 at alpha 0.75, and
  the lowest of 8 such lies ~1.4 standard errors below the rows' true acceptance. On the widened
  smoke pair at batch 8 that took the batch to gamma 1 where gamma 2 was 1.17x faster, and to
  plain steps after one call where gamma 1 paid 1.08x; with this estimate its 4 batch-8 cells ran
  at 1.08x-1.23x greedy decoding, against 0.95x-1.15x (results/benchmarks/
  adaptive_gamma_smoke_widened and the run before it, docs/adaptive.md). The shrinkage: a row's estimate is the
  pooled p plus k_r (alpha_r - p), k_r = tau^2 / (tau^2 + p (1 - p) / weight_r), tau^2 the rows'
  spread beyond their sampling noise (the active rows' variance about p less the mean of
  p (1 - p) / weight_r, at least 0; a Bernoulli bound of each position's variance); rows that
  truly differ (a large spread) keep their own estimates, rows whose differences are what noise
  gives fall to p. At batch 1 it is the row's own alpha. The standard error is that of the
  lowest row's posterior, sqrt(k_r p (1 - p) / weight_r + (1 - k_r)^2 p (1 - p) / sum(weight))
  (the second term: p's own, over all active rows' positions)."""
  on = active.astype(jnp.float32)  # [b]
  n = jnp.maximum(jnp.sum(on), 1.0)  # []
  w = weight * on  # [b]
  pooled = jnp.sum(w * alpha) / jnp.maximum(jnp.sum(w), 1e-6)  # []
  noise = pooled * (1.0 - pooled) / jnp.maximum(weight, 1e-6)  # [b] each row's sampling variance
  spread = jnp.sum(on * (alpha - pooled) ** 2) / jnp.maximum(n - 1.0, 1.0)  # []
  tau2 = jnp.maximum(spread - jnp.sum(on * noise) / n, 0.0)  # []
  k = jnp.where(n > 1, tau2 / jnp.maximum(tau2 + noise, 1e-12), 1.0)  # [b]
  shrunk = jnp.where(active, pooled + k * (alpha - pooled), 2.0)  # [b]
  lowest = jnp.argmin(shrunk)  # the row accepting least
  pooled_var = pooled * (1.0 - pooled) / jnp.maximum(jnp.sum(w), 1e-6)  # []
  se = jnp.sqrt(k[lowest] * noise[lowest] + (1.0 - k[lowest]) ** 2 * pooled_var)  # []
  return jnp.minimum(shrunk[lowest], 1.0), se


def with_prior(alpha: jax.Array, weight: jax.Array, adaptive: AdaptiveGamma
               ) -> Tuple[jax.Array, jax.Array]:
  """Each row's estimate with `adaptive`'s lasting prior (W = `AdaptiveGamma.prior_weight`
  positions at `alpha_init`): `(alpha [b], weight [b])` -> (estimate [b], its weight [b]), the
  estimate (W alpha_init + weight alpha) / (W + weight). Its weight is what `batch_alpha` reads
  the estimate's sampling noise from (p (1 - p) / weight): the prior is the same for every row and
  does not vary, so the estimate varies as weight / (W + weight) times a ratio over `weight`
  positions, which is a plain ratio's noise over (W + weight)^2 / weight positions."""
  w0 = adaptive.prior_weight
  if not w0:
    return alpha, weight
  total = w0 + weight  # [b]
  return (w0 * adaptive.alpha_init + weight * alpha) / total, total ** 2 / jnp.maximum(weight, 1e-6)


def running_alpha(alpha: jax.Array, weight: jax.Array, beta: jax.Array, tried: jax.Array,
                  decay: float) -> Tuple[jax.Array, jax.Array]:
  """One call's update of each row's acceptance estimate (`AdaptiveGamma.decay`): `alpha [b]`
  over `weight [b]` discounted positions, `beta [b, g]` at the positions `tried [b, g]` (bool);
  the call's n tried positions count 1 each, and the weight before them is multiplied by
  decay^n, so the estimate's memory is ~7-11 positions at decay 0.85 whatever the draft length
  (the weight settles at n / (1 - decay^n)). Within a call the positions weigh alike: a proposal
  is tried up to its first rejection, so a weight that grew toward the call's last position would
  favour the rejection and read alpha low (0.43 for 0.5, 0.72 for 0.8 over 3000 calls of 8
  proposed tokens). Rows that tried none keep theirs. Returns the new `(alpha [b], weight [b])`."""
  n = jnp.sum(tried, axis=1).astype(jnp.float32)  # [b]
  kept = jnp.power(decay, n) * weight  # [b]
  new_weight = kept + n  # [b]
  beta_sum = jnp.sum(jnp.where(tried, beta, 0.0), axis=1)  # [b]
  new_alpha = (kept * alpha + beta_sum) / jnp.maximum(new_weight, 1e-6)  # [b]
  return new_alpha, new_weight
