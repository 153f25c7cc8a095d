"""Speculative decoding that tunes its own draft length (`generate --gamma auto`).

The chain loop (`speculative.chain_step`) with the draft length chosen inside the jitted loop
every iteration, in [0, gamma_max]. Shapes stay static: an iteration runs at the narrowest
compiled width (`verify_gammas`) holding the longest active proposal, each width its own while
loop (`loops_per_width`), and each row verifies only its own prefix (`sampling.verify`'s limit).
Once no active row speculates (gamma 0 is final) the rest are plain target steps (`plain_loop`,
counted at draft length 0 by `mark_plain`); where not even the first iteration would speculate,
`decode` is greedy decoding (`plain_decode`). Both serve the adaptive tree loop too.

The output stays exact: a row's gamma depends only on the past, never on this iteration's draws,
so it is a stopping rule (Leviathan et al. App. A.1; Chen et al. Theorem 1).

Policies (`AdaptiveGamma.policy`):
  'optimal'   (default) the batch's next length is Theorem 8's gamma at its lowest row's
              running acceptance (`batch_gamma`), priced with the measured costs c and v(gamma)
              (`cost_calibration.measure_costs`) and the batch's wait for its slowest row.
  'heuristic' HF's schedule: +2 after a proposal accepted whole, else -1, within [1, gamma_max].
`confidence` > 0 (model drafts) ends a row's proposal after a token whose draft top probability is
below it (HF's `assistant_confidence_threshold`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import autoregressive, sampling, theory, xla_options
from gqa_spec.decoding.autoregressive import EOS
from gqa_spec.decoding.drafts.base import Draft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import (LoopState, SpeculativeResult, chain_step, init_loop,
                                           with_draft_calls)
from gqa_spec.decoding.targets import Decoder
from gqa_spec.errors import UserError

PyTree = Any
POLICIES = ('optimal', 'heuristic')
CALIBRATED_PRIOR_WEIGHT = 16.0  # positions a calibrated alpha counts for (`prior_weight`)


@dataclasses.dataclass(frozen=True)
class AdaptiveGamma:
  """How each row chooses its draft length; hashable (a static `jax.jit` argument).

  Attributes:
    gamma_max: the longest proposal (the widest compiled call is gamma_max + 1 tokens).
    policy: 'optimal' (Theorem 8 from a running alpha and the costs) or 'heuristic' (HF's).
    cost_ratio: c, one draft token's time over one greedy step's (policy 'optimal').
    verify_ratio: v, the rest of an iteration over a greedy step (policy 'optimal'): one number
      (1 = Theorem 8 as printed) or v(1)..v(gamma_max).
    confidence: stop a row's proposal after a token whose draft top probability is below this
      (0 = off).
    gamma_init: every row's first draft length (None: the policy's choice at `alpha_init`, or
      gamma_max // 2 for 'heuristic'); 0: `decode` is greedy decoding (`guard`'s plain calls).
    alpha_init: the running alpha's starting value (optimistic by default).
    decay: what the running alpha's weight is multiplied by per position tried.
    prior_weight: positions `alpha_init` counts for in every row's estimate, never discounted.
    lengths: the tokens each row of a few batches needs (`theory.Lengths`), pricing the batch's
      wait for its slowest row; (): Theorem 8 as printed.
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
  lengths: theory.Lengths = ()

  def __post_init__(self):
    if int(self.gamma_max) != self.gamma_max or self.gamma_max < 1:
      raise UserError(f'gamma_max must be a positive integer, got {self.gamma_max}')
    if self.policy not in POLICIES:
      raise UserError(f'gamma policy must be one of {", ".join(POLICIES)}, got {self.policy!r}')
    object.__setattr__(self, 'verify_ratio', theory.checked_costs(
        self.cost_ratio, self.verify_ratio, self.gamma_max, 'gamma', self.alpha_init, self.decay,
        self.prior_weight))
    if not 0.0 <= self.confidence < 1.0:
      raise UserError(f'draft confidence must be in [0, 1), got {self.confidence}')
    if self.gamma_init is not None and not 0 <= self.gamma_init <= self.gamma_max:
      raise UserError(f'gamma_init must be in [0, {self.gamma_max}], got {self.gamma_init}')
    object.__setattr__(self, 'lengths', theory.checked_lengths(self.lengths))  # hashable

  def first_gamma(self) -> int:
    """Every row's first draft length, a Python int."""
    if self.gamma_init is not None:
      return self.gamma_init
    if self.policy == 'heuristic':
      return max(1, self.gamma_max // 2)
    return theory.step_gamma(self.alpha_init, self.cost_ratio, self.gamma_max, self.verify_ratio,
                             self.lengths)

  def calibrated(self, calibration) -> 'AdaptiveGamma':
    """These settings with a `cost_calibration.Calibration`'s c, v, alpha (every row's lasting
    prior) and output lengths."""
    return dataclasses.replace(self, cost_ratio=calibration.cost_ratio,
                               verify_ratio=calibration.verify_ratio,
                               alpha_init=min(max(calibration.alpha, 0.0), 1.0),
                               prior_weight=CALIBRATED_PRIOR_WEIGHT,
                               lengths=calibration.lengths)

  @property
  def verify_widths(self) -> Tuple[int, ...]:
    """The proposal lengths the loop compiles a verification call for (`verify_gammas`)."""
    return verify_gammas(self.gamma_max)

  @property
  def speculates(self) -> bool:
    """Whether any row ever proposes (the first gamma is not 0)."""
    return self.first_gamma() > 0

  @property
  def call_tokens(self) -> int:
    """Tokens of `decode`'s widest target call (`targets.cache_length`)."""
    return self.gamma_max + 1 if self.speculates else 1

  def describe(self) -> str:
    v = self.verify_ratio
    v = f'{v[0]:.3g}..{v[-1]:.3g}' if isinstance(v, tuple) else f'{v:.3g}'
    extra = f',c={self.cost_ratio:.3g},v={v}' if self.policy == 'optimal' else ''
    if self.policy == 'optimal' and self.lengths:  # e.g. '1x8 rows, longest 32' (rows' mean)
      longest = sum(max(b) for b in self.lengths) / len(self.lengths)
      extra += f',lengths={len(self.lengths)}x{len(self.lengths[0])} rows, longest {longest:.3g}'
    conf = f',confidence={self.confidence:g}' if self.confidence else ''
    return f'auto({self.policy},max={self.gamma_max}{extra}{conf})'


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
  as a comparison and a sum (no loop nested in the decoding loop)."""
  return jnp.sum(jnp.asarray(widths, jnp.int32) < longest, dtype=jnp.int32)


def loops_per_width(widths: Tuple[int, ...], going, longest, body, init):
  """`lax.while_loop(going, ...)` over `body(state, w)` at the narrowest of the sorted `widths`
  holding `longest(state)`, w static: one while loop per width inside an outer loop, so each
  width's body writes the cache in place (a `lax.switch` over widths would copy it)."""
  index = lambda a: width_index(widths, longest(a))  # []

  def each_width(a):
    for i, w in enumerate(widths):
      a = jax.lax.while_loop(lambda a, i=i: going(a) & (index(a) == i),
                             lambda a, w=w: body(a, w), a)
    return a

  return jax.lax.while_loop(going, each_width, init)


def verify_width(gamma: int, widths: Tuple[int, ...]) -> int:
  """The narrowest compiled proposal length of `widths` that holds `gamma`."""
  return min(w for w in widths if w >= gamma)


def decode(target: Decoder, target_state: PyTree, draft: Draft, draft_state: PyTree,
           rng: jax.Array, *, adaptive: AdaptiveGamma, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None) -> SpeculativeResult:
  """Speculative decoding with adaptive draft lengths (arguments as `speculative.decode`; the
  target's cache has `targets.cache_length(max_decode_len, adaptive.call_tokens)` slots;
  `draft_state` may be None where `adaptive.speculates` is False).

  Returns:
    `SpeculativeResult` of depth gamma_max with `gamma_histogram` `[b, gamma_max + 1]`,
    `gamma_trace` `[b, max_decode_len]` (-1 after the row's last call) and `draft_steps` `[]`.
  """
  if adaptive.confidence and getattr(draft, 'propose_upto', None) is None:
    raise UserError(f'--draft-confidence needs a model draft (one with draft probabilities); '
                    f'{type(draft).__name__} has none')
  if not adaptive.speculates:
    return plain_decode(target, target_state, rng, depth=adaptive.gamma_max,
                        size=adaptive.gamma_max + 1, fields=('gamma_histogram', 'gamma_trace'),
                        max_decode_len=max_decode_len, config=config, eos_id=eos_id,
                        skip=skip).replace(draft_steps=np.zeros((), np.int32))
  return _speculative(target, target_state, draft, draft_state, rng, adaptive=adaptive,
                      max_decode_len=max_decode_len, config=config, eos_id=eos_id, skip=skip)


@functools.partial(xla_options.jit, static_argnames=('target', 'draft', 'adaptive',
                                                     'max_decode_len', 'config', 'eos_id'))
def _speculative(target: Decoder, target_state: PyTree, draft: Draft, draft_state: PyTree,
                 rng: jax.Array, *, adaptive: AdaptiveGamma, max_decode_len: int,
                 config: SamplingConfig, eos_id: int, skip: Optional[jax.Array],
                 first_gammas: Optional[jax.Array] = None,
                 held: Optional[jax.Array] = None) -> SpeculativeResult:
  """`decode` where rows speculate. For the calibration, which times this program at every
  width with one compile: `first_gammas [b]` (traced) replaces the first draft lengths, and where
  `held []` (traced bool) is True every row keeps it (the policy's choice made, not taken)."""
  gmax = adaptive.gamma_max
  loop = init_loop(target, target_state, draft_state, rng, max_decode_len, gmax, skip)
  batch = loop.done.shape[0]
  loop = loop.replace(result=loop.result.replace(
      draft_steps=jnp.zeros((), jnp.int32),
      **adaptive_fields(batch, gmax + 1, max_decode_len, 'gamma_histogram', 'gamma_trace')))
  want = (jnp.full((batch,), adaptive.first_gamma(), jnp.int32) if first_gammas is None
          else first_gammas.astype(jnp.int32))
  init = AdaptiveState(loop=loop, want=want,
                       alpha=jnp.full((batch,), adaptive.alpha_init, jnp.float32),
                       weight=jnp.full((batch,), float(gmax), jnp.float32))
  widths = adaptive.verify_widths

  def body(a: AdaptiveState, w: int) -> AdaptiveState:
    r = a.loop.result
    active = ~a.loop.done  # [b]
    s, step = chain_step(target, draft, a.loop, w, config, max_decode_len, eos_id, depth=gmax,
                         want=jnp.where(active, a.want, 0), confidence=adaptive.confidence)
    alpha, weight = running_alpha(a.alpha, a.weight, step.beta, step.tried, adaptive.decay)
    if adaptive.policy == 'heuristic':  # HF's schedule
      nxt = jnp.clip(jnp.where(step.k == a.want, a.want + 2, a.want - 1), 1, gmax)
    else:  # one length for the batch, Theorem 8 at its slowest row's alpha (`batch_gamma`)
      nxt = jnp.where(a.want > 0, batch_gamma(alpha, weight, ~s.done, adaptive), 0)
    if held is not None:  # the choice made, then not taken (the calibration's timing)
      nxt = jnp.where(held, a.want, nxt)
    rows = jnp.arange(batch)
    s = s.replace(result=s.result.replace(
        gamma_histogram=r.gamma_histogram.at[rows, step.limit].add(active.astype(jnp.int32)),
        gamma_trace=r.gamma_trace.at[rows, jnp.where(active, r.target_calls, max_decode_len)].set(
            step.limit, mode='drop'),
        draft_steps=r.draft_steps + step.steps))
    return AdaptiveState(loop=s, want=jnp.where(active, nxt, a.want), alpha=alpha, weight=weight)

  return run_widths(target, init, widths, body, max_decode_len, config, eos_id,
                    'gamma_histogram', 'gamma_trace')


def run_widths(target: Decoder, init: Any, widths: Tuple[int, ...], body, max_decode_len: int,
               config: SamplingConfig, eos_id: int, *fields: str) -> SpeculativeResult:
  """An adaptive loop's call: `body(state, w)` at the narrowest width holding the largest ask
  (`state.want` of the active rows) while some row asks for more than 0 (`loops_per_width`),
  then plain target steps, counted at size 0 in the result's `fields` (`mark_plain`)."""
  asks = lambda a: jnp.where(a.loop.done, 0, a.want)  # [b]
  final = loops_per_width(widths, lambda a: jnp.any(asks(a) > 0), lambda a: jnp.max(asks(a)),
                          body, init)
  loop = plain_loop(target, final.loop, max_decode_len, config, eos_id)
  return with_draft_calls(loop.replace(result=mark_plain(loop.result, final.loop.result, *fields)))


def batch_gamma(alpha: jax.Array, weight: jax.Array, active: jax.Array,
                adaptive: AdaptiveGamma) -> jax.Array:
  """`[]` int32: the batch's next draft length (policy 'optimal'): Theorem 8's gamma
  (`theory.optimal_gammas`) at `batch_alpha` of the `active [b]` rows' running `alpha [b]` over
  `weight [b]` positions (with the lasting prior). One length for the batch: an iteration costs
  what its longest proposal costs, and the batch waits for its slowest row. Gamma 0 is final, so
  it is taken only when it also wins at the estimate plus one standard error."""
  estimate, se = batch_alpha(*with_prior(alpha, weight, adaptive), active)  # [], []
  both = jnp.stack([estimate, jnp.minimum(estimate + se, 1.0)])  # [2]
  gamma, upper = theory.optimal_gammas(both, adaptive.cost_ratio, adaptive.gamma_max,
                                       adaptive.verify_ratio, adaptive.lengths)
  return jnp.where(gamma > 0, gamma, upper)


def batch_alpha(alpha: jax.Array, weight: jax.Array, active: jax.Array
                ) -> Tuple[jax.Array, jax.Array]:
  """The acceptance the batch's draft length is chosen for, `[]`, and its standard error `[]`:
  the lowest of the `active [b]` rows' `alpha [b]` (ratios over `weight [b]` positions), each
  first shrunk toward the pooled p (empirical Bayes, so that noise does not read the slowest row
  low): p + k_r (alpha_r - p), k_r = tau^2 / (tau^2 + p (1 - p) / weight_r), tau^2 the rows'
  spread beyond their sampling noise. The standard error is the lowest row's posterior's."""
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
  """Each row's estimate with the lasting prior (W = `prior_weight` positions at `alpha_init`):
  `(alpha [b], weight [b])` -> ((W alpha_init + weight alpha) / (W + weight), (W + weight)^2 /
  weight), the second the positions of a plain ratio with the estimate's sampling noise."""
  w0 = adaptive.prior_weight
  if not w0:
    return alpha, weight
  total = w0 + weight  # [b]
  return (w0 * adaptive.alpha_init + weight * alpha) / total, total ** 2 / jnp.maximum(weight, 1e-6)


def running_alpha(alpha: jax.Array, weight: jax.Array, beta: jax.Array, tried: jax.Array,
                  decay: float) -> Tuple[jax.Array, jax.Array]:
  """One call's update of each row's acceptance estimate: `alpha [b]` over `weight [b]`
  discounted positions, `beta [b, g]` at the positions `tried [b, g]`. The call's n tried
  positions count 1 each (alike: a weight growing toward the rejection would read alpha low) and
  the weight before them decays by decay^n. Returns the new `(alpha [b], weight [b])`."""
  n = jnp.sum(tried, axis=1).astype(jnp.float32)  # [b]
  kept = jnp.power(decay, n) * weight  # [b]
  new_weight = kept + n  # [b]
  beta_sum = jnp.sum(jnp.where(tried, beta, 0.0), axis=1)  # [b]
  new_alpha = (kept * alpha + beta_sum) / jnp.maximum(new_weight, 1e-6)  # [b]
  return new_alpha, new_weight


# ---- plain target steps, where no row speculates ------------------------------------------


def adaptive_fields(batch: int, size: int, max_decode_len: int, histogram: str, trace: str,
                    width_trace: Optional[str] = None) -> Dict[str, jax.Array]:
  """An adaptive result's statistics before its first call, by name: `histogram [b, size]` zeros,
  `trace [b, max_decode_len]` (per row call) and `width_trace [max_decode_len]` (per iteration)
  -1."""
  fields = {histogram: jnp.zeros((batch, size), jnp.int32),
            trace: jnp.full((batch, max_decode_len), -1, jnp.int32)}
  if width_trace is not None:
    fields[width_trace] = jnp.full((max_decode_len,), -1, jnp.int32)
  return fields


@functools.partial(xla_options.jit, static_argnames=('target', 'depth', 'size', 'fields',
                                                     'max_decode_len', 'config', 'eos_id'))
def plain_decode(target: Decoder, target_state: PyTree, rng: jax.Array, *, depth: int, size: int,
                 fields: Tuple[str, ...], max_decode_len: int, config: SamplingConfig,
                 eos_id: int, skip: Optional[jax.Array]) -> SpeculativeResult:
  """`adaptive.decode` (and `adaptive_tree.decode`) where no row speculates, as one compiled
  program: autoregressive decoding as an adaptive result of `depth` draft positions, every call
  counted at size 0 in its `fields` (`adaptive_fields`, the histogram `size` wide). `sequences`
  stay `[b, 1 + max_decode_len]` (no draft slack)."""
  r = autoregressive.decode(target, target_state, rng, max_decode_len=max_decode_len,
                            config=config, eos_id=eos_id, skip=skip)
  before = init_loop(target, target_state, None, rng, max_decode_len, depth, skip).result.replace(
      sequences=r.sequences, lengths=r.lengths,
      **adaptive_fields(r.lengths.shape[0], size, max_decode_len, *fields))
  return mark_plain(before.replace(target_calls=r.target_calls, loop_iterations=r.loop_iterations),
                    before, *fields)


def plain_loop(target: Decoder, loop: LoopState, max_decode_len: int, config: SamplingConfig,
               eos_id: int) -> LoopState:
  """`loop` run to the end with plain one-token target steps, counting target calls and loop
  iterations (`mark_plain` counts their draft sizes). The draft's state stays out of the loop's
  carry: XLA would copy a carried input buffer into the loop once per call."""
  batch = loop.done.shape[0]

  def plain_step(s: LoopState) -> LoopState:
    r = s.result
    rng, step_rng = jax.random.split(s.rng)
    active = ~s.done  # [b]
    last = jnp.take_along_axis(r.sequences, r.lengths[:, None], axis=1)  # [b, 1]
    logits, tstate = target.tokens_to_logits(s.target_state, last)  # [b, 1, V]
    t, _ = sampling.choose(step_rng, logits[:, 0], config)  # [b]
    rows = jnp.arange(batch)
    slot = r.lengths + 1  # [b]
    sequences = r.sequences.at[rows, slot].set(
        jnp.where(active, t, r.sequences[rows, slot]))  # [b, width]
    lengths = r.lengths + active  # [b]
    done = s.done | (active & (t == eos_id)) | (lengths >= max_decode_len)
    result = r.replace(sequences=sequences, lengths=lengths, target_calls=r.target_calls + active,
                       loop_iterations=r.loop_iterations + 1)
    return LoopState(target_state=target.rollback(tstate, lengths), draft_state=s.draft_state,
                     done=done, result=result, rng=rng)

  out = jax.lax.while_loop(lambda s: ~jnp.all(s.done), plain_step, loop.replace(draft_state=None))
  return out.replace(draft_state=loop.draft_state)


def mark_plain(r: SpeculativeResult, before: SpeculativeResult, histogram: str, trace: str,
               width_trace: Optional[str] = None) -> SpeculativeResult:
  """`r` with its plain steps (those past `before`, the result when they began) counted at size 0
  in the fields named `histogram`, `trace` and `width_trace` (`adaptive_fields`)."""
  calls = jnp.arange(getattr(r, trace).shape[1])  # [max_decode_len]
  plain = ((calls[None] >= before.target_calls[:, None])
           & (calls[None] < r.target_calls[:, None]))  # [b, max_decode_len]
  fields = {trace: jnp.where(plain, 0, getattr(r, trace)),
            histogram: getattr(r, histogram).at[:, 0].add(r.target_calls - before.target_calls)}
  if width_trace is not None:
    iterations = (calls >= before.loop_iterations) & (calls < r.loop_iterations)
    fields[width_trace] = jnp.where(iterations, 0, getattr(r, width_trace))
  return r.replace(**fields)
