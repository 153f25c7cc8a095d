"""Speculative decoding that tunes its own draft length per row (`generate --gamma auto`).

The loop of `speculative.py` with one change: every row r keeps its own draft length gamma_r in
[0, gamma_max], chosen inside the jitted loop from what the row has seen. Shapes stay static: the
draft proposes into `[b, gamma_max]` buffers (a model draft stops calling its decoder once every
row has its gamma_r tokens, `ModelDraft.propose_upto`; other drafts propose gamma_max), the target
scores gamma_max + 1 positions, and `sampling.verify(limit=gamma_r)` verifies only each row's own
prefix: positions past gamma_r are rejected and, when the prefix is accepted whole, the bonus token
comes from p_{gamma_r + 1}. The causal mask keeps the positions past gamma_r from changing p at
the ones before. The target scores only as many positions as the batch needs: the call is one of a
few compiled widths (`verify_gammas`: 1, 2, 3, 4, 6, 8, 12, ... up to gamma_max, each + 1 tokens),
the narrowest that holds the longest proposal an active row asked for (`lax.switch`), so a batch
whose rows all ask for gamma 1 pays for a two-token call, not a gamma_max + 1 one (a draft that
reads the target's hidden states, Chimera, keeps the gamma_max + 1 width). Once no active row
speculates (every one at gamma_r = 0, which is final), the rest runs as plain one-token target
steps in a second loop, without the draft. When the costs say that not even the starting
`alpha_init` would pay for a proposal (`AdaptiveGamma.speculates` is False: a draft that costs
what the target costs, or one whose acceptance `measure_costs` found too low for its cost),
`decode` is `autoregressive.decode` itself, greedy decoding's own compiled program, on a cache
of one slot per token (`target_cache_length`), with two statistics from a second small program
(`plain_decode`).

Exactness: gamma_r depends only on the row's past (and, with a confidence stop, on the draft's
distributions at the positions already proposed), so it is a stopping rule; the
correctness argument (Leviathan et al. App. A.1; Chen et al. Theorem 1) holds for each iteration
whatever gamma it used, and greedy output is token-identical to greedy decoding.

Policies (`AdaptiveGamma.policy`):
  'optimal'   (default) alpha_r, the row's acceptance (Corollary 6: alpha = E(beta)) as a
              discounted ratio, the betas of the positions it tried over their number, both
              weighted by `decay` per call, starting from `alpha_init` counted as gamma_max
              positions, and the cost ratio c give
              gamma_r = argmax_gamma of Theorem 8 over [0, gamma_max] (`theory.optimal_gammas`;
              with a measured verification cost v(gamma), a gamma >= 1 costs gamma c + v(gamma)
              greedy steps; v(gamma) is the narrowest compiled width that holds gamma plus the
              loop's own per-iteration work, `measure_costs`).
              At gamma_r = 0 the row learns nothing more, so 0 is final for it; once no active row
              speculates the draft is no longer kept up to date and the batch stays on plain
              target steps.
  'heuristic' HF's `num_assistant_tokens_schedule="heuristic"`: +2 after a proposal accepted whole,
              else -1, within [1, gamma_max].
  'fixed'     every row keeps `gamma_init` (not a CLI choice: `measure_costs` times this very
              loop's iteration with it).
`confidence` > 0 (`--draft-confidence`, model drafts only) also ends a row's proposal after the
first token whose draft top probability is below it (HF's `assistant_confidence_threshold`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Iterable, NamedTuple, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import autoregressive, sampling, theory, timing, xla_options
from gqa_spec.decoding.autoregressive import EOS
from gqa_spec.decoding.drafts.base import Draft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import (LoopState, SpeculativeResult, append_accepted,
                                           init_loop, record_call, with_draft_calls)
from gqa_spec.decoding.targets import Decoder
from gqa_spec.errors import UserError

PyTree = Any
POLICIES = ('optimal', 'heuristic', 'fixed')


@dataclasses.dataclass(frozen=True)
class AdaptiveGamma:
  """How each row chooses its draft length; hashable (a static `jax.jit` argument).

  Attributes:
    gamma_max: the longest proposal (the compiled width is gamma_max + 1).
    policy: 'optimal' (Theorem 8 from a running alpha and `cost_ratio`) or 'heuristic' (HF's).
    cost_ratio: c, one draft call's time over one target call's (policy 'optimal').
    verify_ratio: v, the verification call over a one-token target call (policy 'optimal'): one
      number for every gamma (1 = Theorem 8 as printed, which assumes verification costs one
      step) or gamma_max numbers v(1)..v(gamma_max), as `measure_costs` gives.
    confidence: stop a row's proposal after a token whose draft top probability is below this
      (0 = off).
    gamma_init: every row's first draft length (None: the policy's choice at `alpha_init`, or
      gamma_max // 2 for 'heuristic').
    alpha_init: the running alpha's starting value (policy 'optimal'): by default an optimistic
      0.9, so that a row tries speculating (at the gamma this alpha would pay for) before its own
      alpha decides; `calibrated` sets the draft's acceptance `measure_costs` found on the
      first batch instead (what `generate --gamma auto` does).
    decay: the weight of the positions before each call in the running alpha (policy
      'optimal'). The ratio counts every tried position alike, which is the acceptance's
      maximum-likelihood estimate whatever the rule that stopped each proposal; a mean of each
      call's mean (the earlier estimator) weights a call that a first-token rejection ended (one
      position, beta 0) as much as a run of gamma_max accepted ones and reads alpha low: on the
      widened pair of `benchmarks/widened.py` (translation, the 0.1-noise draft) it took 2 of 8
      rows to gamma 0, final, after three calls each, one of them having accepted 0.75 of the
      positions it tried.
  """

  gamma_max: int = 8
  policy: str = 'optimal'
  cost_ratio: float = 0.0
  verify_ratio: Union[float, Tuple[float, ...]] = 1.0
  confidence: float = 0.0
  gamma_init: Optional[int] = None
  alpha_init: float = 0.9
  decay: float = 0.7

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

  def first_gamma(self) -> int:
    """Every row's first draft length, a Python int."""
    if self.gamma_init is not None:
      return self.gamma_init
    if self.policy == 'heuristic':
      return max(1, self.gamma_max // 2)
    if self.policy == 'fixed':
      raise UserError('the fixed gamma policy needs gamma_init')
    return _optimal_first_gamma(self.alpha_init, self.cost_ratio, self.gamma_max,
                                self.verify_ratio)

  def calibrated(self, calibration: 'Calibration') -> 'AdaptiveGamma':
    """These settings with `measure_costs`' c, v and starting alpha."""
    return dataclasses.replace(self, cost_ratio=calibration.cost_ratio,
                               verify_ratio=calibration.verify_ratio,
                               alpha_init=min(max(calibration.alpha, 0.0), 1.0))

  @property
  def speculates(self) -> bool:
    """Whether any row ever proposes: False when the costs say that not even `alpha_init` would
    pay for gamma >= 1 (policy 'optimal', first gamma 0, final for every row); `decode` is then
    autoregressive decoding itself, on a cache of `max_decode_len + 1` slots
    (`target_cache_length`)."""
    return self.first_gamma() > 0

  def first(self, batch: int) -> jax.Array:
    """`[b]` the first iteration's draft lengths."""
    return jnp.full((batch,), self.first_gamma(), jnp.int32)

  def describe(self) -> str:
    v = self.verify_ratio
    v = f'{v[0]:.3g}..{v[-1]:.3g}' if isinstance(v, tuple) else f'{v:.3g}'
    extra = f',c={self.cost_ratio:.3g},v={v}' if self.policy == 'optimal' else ''
    conf = f',confidence={self.confidence:g}' if self.confidence else ''
    return f'auto({self.policy},max={self.gamma_max}{extra}{conf})'


@functools.lru_cache(maxsize=256)
def _optimal_first_gamma(alpha: float, c: float, gamma_max: int,
                         v: Union[float, Tuple[float, ...]]) -> int:
  """Theorem 8's gamma at `alpha`, a Python int (computed once per setting: callers ask per
  batch, and it is a few eager device ops)."""
  with jax.ensure_compile_time_eval():  # a Python int, also while tracing
    return int(theory.optimal_gammas(jnp.full((1,), alpha), c, gamma_max, v)[0])


@flax.struct.dataclass
class AdaptiveState:
  loop: LoopState
  want: jax.Array  # [b] the draft length each row asks for next
  alpha: jax.Array  # [b] running acceptance estimate
  weight: jax.Array  # [b] the (discounted) positions behind it


def target_cache_length(max_decode_len: int, adaptive: AdaptiveGamma) -> int:
  """The target cache `decode` needs: room for a gamma_max + 1 token verification call, or one
  slot per token when no row will speculate."""
  return max_decode_len + (adaptive.gamma_max + 1 if adaptive.speculates else 1)


def verify_gammas(gamma_max: int) -> Tuple[int, ...]:
  """The proposal lengths the loop compiles a verification call for (each + 1 tokens): 1, 2, 3,
  4, 6, 8, 12, 16, ... below gamma_max, and gamma_max."""
  out, g = [1, 2, 3], 4
  while g < gamma_max:
    out += [g, g * 3 // 2]
    g *= 2
  return tuple(sorted({x for x in out if x < gamma_max} | {gamma_max}))


def verify_width(gamma: int, gamma_max: int) -> int:
  """The narrowest compiled proposal length (`verify_gammas`) that holds `gamma`."""
  return min(w for w in verify_gammas(gamma_max) if w >= gamma)


class Calibration(NamedTuple):
  """What `measure_costs` measured: `AdaptiveGamma`'s cost_ratio, verify_ratio and alpha_init."""
  cost_ratio: float
  verify_ratio: Tuple[float, ...]
  alpha: float


# The fewest output positions the starting alpha is measured over: `first_stage` reads batches
# after the first (untimed: greedy decoding and the draft's teacher-forced pass, programs it has
# compiled) until it has counted this many, or read `CALIBRATION_MAX_BATCHES` in all. One batch
# was too few: summarisation at batch 1 (~10 tokens an output) measured a bigram's alpha at 0.80
# on its first input, speculated, and ran at 0.55x greedy decoding on an H200, where the bigram's
# acceptance over 8 inputs was 0.11-0.24 (results/gpu/adaptive_2026-11-27).
CALIBRATION_POSITIONS = 128
CALIBRATION_MAX_BATCHES = 16


class FirstStage(NamedTuple):
  """`first_stage`'s measurements: seconds per greedy step, per draft proposal (with its commit)
  and per 2-token target call; the draft's teacher-forced agreement; v's lower bound in steps;
  the `(target state, draft state)` batches of `more` it read for the agreement."""
  t_step: float
  t_draft: float
  alpha: float
  t_call: float
  v_floor: float
  more: Tuple[Tuple[PyTree, PyTree], ...] = ()


def first_stage(target: Decoder, target_state: PyTree, max_decode_len: int, next_token, commit,
                draft_state: PyTree, slack: int,
                more: Iterable[Tuple[PyTree, PyTree]] = ()) -> FirstStage:
  """The calibrations' first stage, chains (`measure_costs`) and trees
  (`adaptive_tree.measure_costs`) alike: greedy decoding per step, the draft's pass over its
  output (`timing.teacher_forced` with `next_token` and `commit`, the output padded by `slack`
  slots) and the target's 1- and 2-token calls; v_floor = 1 + (2-token call - 1-token call) in
  greedy steps, a lower bound of every iteration's v (`measure_costs`). The agreement also reads
  batches of `more` (`(target state, draft state)` of the same shapes, read lazily) until
  `CALIBRATION_POSITIONS` positions, at most `CALIBRATION_MAX_BATCHES` batches in all."""
  rng = jax.random.PRNGKey(0)
  greedy = lambda state: autoregressive.decode(target, state, rng, max_decode_len=max_decode_len)
  t_step = timing.per_iteration(lambda: greedy(target_state))  # seconds per greedy step
  read = []

  def output(state):  # [b, 1 + L + slack] greedy decoding's sequences, and lengths [b]
    out = jax.device_get(greedy(state))
    return np.pad(out.sequences, ((0, 0), (0, slack))), out.lengths

  def more_outputs():
    for tstate, dstate in itertools.islice(more, CALIBRATION_MAX_BATCHES - 1):
      read.append((tstate, dstate))
      yield (dstate, *output(tstate))

  t_draft, alpha = timing.teacher_forced(next_token, commit, draft_state, *output(target_state),
                                         more=more_outputs(), min_positions=CALIBRATION_POSITIONS)
  fill = max_decode_len // 2
  t_one = timing.step_time(target, target_state, 1, fill)  # greedy decoding's call
  t_two = timing.step_time(target, target_state, 2, fill)
  return FirstStage(t_step, t_draft, alpha, t_two, 1.0 + max(t_two - t_one, 0.0) / t_step,
                    tuple(read))


def measure_costs(target: Decoder, target_state: PyTree, draft: Draft, draft_state: PyTree,
                  max_decode_len: int, gamma_max: int,
                  more: Iterable[Tuple[PyTree, PyTree]] = ()) -> Calibration:
  """(c, v, alpha) on this machine and batch; c and v in units of one step of greedy decoding's
  loop (a few seconds, compiles included; each time the fastest of a few runs):

    c = one draft token: a proposal of one token and its commit (`timing.teacher_forced`);
    v = (v(1), ..., v(gamma_max)): the rest of an iteration of this loop that verifies gamma
        tokens: the target call at the narrowest compiled width that holds gamma
        (`verify_width`, + 1 tokens; `timing.step_time`), plus what the loop spends besides its
        calls (verification, appending, rollbacks, statistics, the width's `lax.switch`);
    alpha = the draft's acceptance of one-token proposals at temperature 0 (so that no random
        draw of the decoding to come enters it), every row's starting estimate
        (`AdaptiveGamma.alpha_init`, `calibrated`): in the first stage its greedy token against
        greedy decoding's at every position of greedy decoding's output on this batch, fed the
        true prefix (`timing.teacher_forced`, the same pass that times c); where the second
        stage runs, the acceptance in its gamma-1 run of this loop. Both are counted over at
        least `CALIBRATION_POSITIONS` output positions: where this batch holds fewer, batches of
        `more` (`(target state, draft state)` of the same shapes, e.g. the batches after this
        one, made as they are read) are read too, untimed, up to `CALIBRATION_MAX_BATCHES`.

  In two stages, so that ruling a draft out costs little. First the unit (greedy decoding,
  `autoregressive.decode`, per step), c and alpha, and the target's calls of 1 and 2 tokens. If
  Theorem 8 gives gamma 0 even with v(gamma) = 1 + (the 2-token call - the 1-token call) in
  steps for every gamma, no gamma pays: that is a lower bound of every v (an iteration of this
  loop does all that a greedy step does besides its call, and its call is at least 2 tokens
  wide), so v is returned as that bound and nothing else is compiled or timed. `decode` is then
  greedy decoding from the start. On the cpu study's trained pair (a draft at c ~0.3-0.5, alpha
  ~0.3-0.5) this stage is the whole calibration: seconds where the second stage took half a
  minute more.

  Otherwise the other widths, and the loop's own work: this loop with every row at gamma 1
  (policy 'fixed') per iteration, less its draft token and its width-1 call. On small models that
  overhead is the size of a target call (measured on this CPU: the smoke pair's n-gram drafts,
  c ~0.02, were slower than greedy at every gamma); without it Theorem 8 speculates where it does
  not pay. A draft without `propose_upto` (n-gram, copy) proposes gamma_max tokens every
  iteration whatever gamma a row asked for: its proposal is then part of every iteration's
  overhead, and c is 0. (A fixed optimistic starting alpha, 0.9, made every row try speculating
  first, which cost the smoke pair's n-gram drafts 10-30% of greedy decoding's speed on its
  32-token outputs.)

  The second stage's alpha is its own run's (the mean beta of the tried positions: the quantity
  each row's running estimate goes on to track), the teacher-forced one counting every position
  of the output, the loop only those it proposes at (on the cpu study's pair, summarisation at
  batch 8: 0.465 and 0.483). A draft that reads the target's hidden states (Chimera,
  `reads_target_hidden`) proposes from those of the loop's own verification calls, which the
  teacher-forced pass does not make: the first stage does not stop it.

  Each time is the fastest of a few runs, taken at different moments: on this shared 2-core CPU
  the same measurement moved by up to 1.7x between runs of the calibration (c 0.16 to 0.32 for
  the cpu study's draft at batch 8), enough to change the decision where it is close."""
  fill = max_decode_len // 2
  rng = jax.random.PRNGKey(0)

  def next_token(dstate, seqs, at):
    tokens, _, dstate = draft.propose(dstate, seqs, at, rng, 1, sampling.GREEDY)  # [b, 1]
    return tokens[:, 0], dstate

  first = first_stage(target, target_state, max_decode_len, next_token, draft.commit, draft_state,
                      gamma_max + 1, more)
  t_step, alpha = first.t_step, first.alpha
  c = first.t_draft / t_step if getattr(draft, 'propose_upto', None) is not None else 0.0
  t_call = {1: first.t_call}  # seconds per call of w + 1
  floor = (first.v_floor,) * gamma_max
  reads_hidden = getattr(draft, 'reads_target_hidden', False)
  if not reads_hidden and _optimal_first_gamma(alpha, c, gamma_max, floor) == 0:
    return Calibration(c, floor, alpha)
  for w in verify_gammas(gamma_max)[1:]:
    t_call[w] = timing.step_time(target, target_state, w + 1, fill)
  fixed = AdaptiveGamma(gamma_max=gamma_max, policy='fixed', gamma_init=1)
  run = lambda ts=target_state, ds=draft_state: decode(target, ts, draft, ds, rng, adaptive=fixed,
                                                       max_decode_len=max_decode_len)
  t_iter = timing.per_iteration(run)
  results = jax.device_get([run()] + [run(ts, ds) for ts, ds in first.more])
  alpha = (sum(float(r.beta_sum) for r in results)  # this loop's own, on the first stage's batches
           / max(sum(float(r.beta_count) for r in results), 1.0))
  overhead = max(t_iter - t_call[1] - c * t_step, 0.0)
  return Calibration(c, tuple((t_call[verify_width(g, gamma_max)] + overhead) / t_step
                              for g in range(1, gamma_max + 1)), alpha)


def decode(target: Decoder, target_state: PyTree, draft: Draft, draft_state: PyTree,
           rng: jax.Array, *, adaptive: AdaptiveGamma, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None) -> SpeculativeResult:
  """Speculative decoding with per-row adaptive draft lengths (arguments as `speculative.decode`).

  `draft_state` may be None where `adaptive.speculates` is False: the call is then one jitted
  function of the target alone (`plain_decode`), autoregressive decoding with its result in this
  function's form (`sequences` then `[b, 1 + max_decode_len]`, without the draft's slack), so
  that its dispatch costs about what greedy decoding's does (the draft and the settings are not
  even hashed).

  Returns:
    `SpeculativeResult` with depth gamma_max, plus `gamma_histogram` `[b, gamma_max + 1]` (how
    often each row verified a proposal of each length), `gamma_trace` `[b, max_decode_len]` (the
    length of each of the row's target calls, -1 after its last) and `draft_steps` `[]` (draft
    decode calls made, all rows together; gamma_max per iteration for drafts that cannot stop
    early).
  """
  if adaptive.confidence and getattr(draft, 'propose_upto', None) is None:
    raise UserError(f'--draft-confidence needs a model draft (one with draft probabilities); '
                    f'{type(draft).__name__} has none')
  if not adaptive.speculates:
    r, histogram, trace = plain_decode(target, target_state, rng, gamma_max=adaptive.gamma_max,
                                 max_decode_len=max_decode_len, config=config, eos_id=eos_id,
                                 skip=skip)
    return _as_adaptive_result(r, histogram, trace, adaptive.gamma_max)
  return _speculative(target, target_state, draft, draft_state, rng, adaptive=adaptive,
                      max_decode_len=max_decode_len, config=config, eos_id=eos_id, skip=skip)


def plain_decode(target: Decoder, target_state: PyTree, rng: jax.Array, *, gamma_max: int,
                 max_decode_len: int, config: SamplingConfig, eos_id: int,
                 skip: Optional[jax.Array], iteration_trace: bool = False) -> Tuple[jax.Array, ...]:
  """`decode` where no row speculates (also `adaptive_tree.decode`'s, gamma_max = N_max there):
  autoregressive decoding, and its `gamma_histogram` `[b, gamma_max + 1]` and `gamma_trace`
  `[b, max_decode_len]` (every call at draft length 0), and with `iteration_trace` the trees'
  `tree_width_trace` `[max_decode_len]` (0 for each loop iteration, -1 after the last).

  The decoding is `autoregressive.decode` itself, the compiled program greedy decoding runs (the
  same cache entry), and the statistics come from a second small program. The earlier form, one
  program holding both, took 4% to 18% (chain cells) and 7% to 11% (tree cells) longer than
  greedy decoding on an H200, by more than the rounds spread (the tree at batch 1: 31.9-32.2 ms a
  round against 35.5-36.0 ms; results/gpu/adaptive_2026-11-27; why was not profiled). This form
  leaves the loop nothing to differ in. The statistics that are constants are made on the host
  (`_as_adaptive_result`)."""
  r = autoregressive.decode(target, target_state, rng, max_decode_len=max_decode_len,
                            config=config, eos_id=eos_id, skip=skip)
  return (r, *_plain_statistics(r.target_calls, r.loop_iterations, gamma_max=gamma_max,
                                max_decode_len=max_decode_len, iteration_trace=iteration_trace))


@functools.partial(jax.jit, static_argnames=('gamma_max', 'max_decode_len', 'iteration_trace'))
def _plain_statistics(target_calls: jax.Array, loop_iterations: jax.Array, *, gamma_max: int,
                      max_decode_len: int, iteration_trace: bool) -> Tuple[jax.Array, ...]:
  """`plain_decode`'s histogram, trace (and width trace) from `target_calls [b]` and
  `loop_iterations []`."""
  batch = target_calls.shape[0]
  calls = jnp.arange(max_decode_len)[None]  # [1, max_decode_len]
  histogram = jnp.zeros((batch, gamma_max + 1), jnp.int32).at[:, 0].set(target_calls)
  trace = jnp.where(calls < target_calls[:, None], 0, -1).astype(jnp.int32)
  if iteration_trace:
    return histogram, trace, jnp.where(calls[0] < loop_iterations, 0, -1).astype(jnp.int32)
  return histogram, trace


@functools.partial(xla_options.jit, static_argnames=('target', 'draft', 'adaptive',
                                                     'max_decode_len', 'config', 'eos_id'))
def _speculative(target: Decoder, target_state: PyTree, draft: Draft, draft_state: PyTree,
                 rng: jax.Array, *, adaptive: AdaptiveGamma, max_decode_len: int,
                 config: SamplingConfig, eos_id: int,
                 skip: Optional[jax.Array]) -> SpeculativeResult:
  """`decode` where rows speculate (its docstring)."""
  gmax = adaptive.gamma_max
  upto = getattr(draft, 'propose_upto', None)
  loop = init_loop(target, target_state, draft_state, rng, max_decode_len, gmax, skip)
  batch = loop.done.shape[0]
  loop = loop.replace(result=loop.result.replace(
      gamma_histogram=jnp.zeros((batch, gmax + 1), jnp.int32),
      gamma_trace=jnp.full((batch, max_decode_len), -1, jnp.int32),
      draft_steps=jnp.zeros((), jnp.int32)))
  init = AdaptiveState(loop=loop, want=adaptive.first(batch),
                       alpha=jnp.full((batch,), adaptive.alpha_init, jnp.float32),
                       weight=jnp.full((batch,), float(gmax), jnp.float32))
  positions = jnp.arange(gmax + 1)  # [gmax + 1]
  widths = verify_gammas(gmax)

  def verify_call(tstate, inputs, longest):
    """The target's logits `[b, gmax + 1, V]` for `inputs [b, gmax + 1]`, scored at the narrowest
    compiled width that holds `longest` proposed tokens; the positions past it are zeros (no row
    verifies them: every row's limit is <= longest)."""
    def branch(w):
      def call(ts, inp):
        logits, ts = target.tokens_to_logits(ts, inp[:, :w + 1])  # [b, w + 1, V]
        return jnp.pad(logits, ((0, 0), (0, gmax - w), (0, 0))), ts
      return call
    if len(widths) == 1:
      return branch(gmax)(tstate, inputs)
    index = jnp.searchsorted(jnp.asarray(widths), longest)  # the first width >= longest
    return jax.lax.switch(index, [branch(w) for w in widths], tstate, inputs)

  def speculate(s: LoopState, want, draft_rng, verify_rng):
    r = s.result
    if upto is not None:
      tokens, q, limit, steps, dstate = upto(s.draft_state, r.sequences, r.lengths, draft_rng, gmax,
                                             config, want, adaptive.confidence)
    else:
      tokens, q, dstate = draft.propose(s.draft_state, r.sequences, r.lengths, draft_rng, gmax,
                                        config)  # [b, gmax], [b, gmax, V]
      limit, steps = want, jnp.asarray(gmax, jnp.int32)
    last = jnp.take_along_axis(r.sequences, r.lengths[:, None], axis=1)  # [b, 1]
    inputs = jnp.concatenate([last, tokens], axis=1)  # [b, gmax + 1]
    if getattr(draft, 'reads_target_hidden', False):
      logits, hidden, tstate = target.tokens_to_logits_and_hidden(s.target_state, inputs)
      dstate = draft.observe(dstate, hidden, r.lengths)
    else:
      logits, tstate = verify_call(s.target_state, inputs, jnp.max(want))  # [b, gmax + 1, V]
    k, t, beta = sampling.verify(verify_rng, tokens, q, logits, config, limit)  # [b], [b], [b, g]
    new = jnp.concatenate([tokens, jnp.zeros_like(tokens[:, :1])], axis=1)  # [b, gmax + 1]
    new = jnp.where(positions[None] == k[:, None], t[:, None], new)  # x_1..x_k, t, junk
    return new, k, limit, beta, steps, tstate, dstate

  def speculating(a: AdaptiveState):  # some active row wants a proposal
    return jnp.any(~a.loop.done & (a.want > 0))

  def body(a: AdaptiveState) -> AdaptiveState:
    s, r = a.loop, a.loop.result
    rng, draft_rng, verify_rng = jax.random.split(s.rng, 3)
    active = ~s.done  # [b]
    want = jnp.where(active, a.want, 0)  # [b]
    new, k, limit, beta, steps, tstate, dstate = speculate(s, want, draft_rng, verify_rng)
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
    else:
      nxt = jnp.where(a.want > 0, theory.optimal_gammas(alpha, adaptive.cost_ratio, gmax,
                                                        adaptive.verify_ratio), 0)
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
  final = jax.lax.while_loop(lambda a: ~jnp.all(a.loop.done) & speculating(a), body, init)
  loop = plain_loop(target, final.loop, max_decode_len, config, eos_id)
  return with_draft_calls(plain_statistics(loop, final.loop.result.target_calls))


def running_alpha(alpha: jax.Array, weight: jax.Array, beta: jax.Array, tried: jax.Array,
                  decay: float) -> Tuple[jax.Array, jax.Array]:
  """One call's update of each row's acceptance estimate (`AdaptiveGamma.decay`): `alpha [b]`
  over `weight [b]` discounted positions, `beta [b, g]` at the positions `tried [b, g]` (bool);
  rows that tried none keep theirs. Returns the new `(alpha [b], weight [b])`."""
  n = jnp.sum(tried, axis=1).astype(jnp.float32)  # [b]
  kept = decay * weight  # [b]
  new_weight = jnp.where(n > 0, kept + n, weight)  # [b]
  beta_sum = jnp.sum(jnp.where(tried, beta, 0.0), axis=1)  # [b]
  new_alpha = jnp.where(n > 0, (kept * alpha + beta_sum) / jnp.maximum(new_weight, 1e-6), alpha)
  return new_alpha, new_weight


def plain_loop(target: Decoder, loop: LoopState, max_decode_len: int, config: SamplingConfig,
               eos_id: int) -> LoopState:
  """`loop` run to the end with plain one-token target steps (no draft), each token appended for
  the active rows; target calls and loop iterations are counted, the caller adds the draft sizes
  of these calls (0) to its own statistics. Also the tree loop's (`adaptive_tree.py`).

  The draft's state (its parameters and cache) stays out of the loop's carry: XLA copies a carried
  input buffer into the loop once per call, which at batch 1 on small models is a measurable part
  of the call."""
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


def _as_adaptive_result(r: autoregressive.DecodeResult, histogram: jax.Array, trace: jax.Array,
                        gamma_max: int) -> SpeculativeResult:
  """`plain_decode`'s outputs as `decode`'s result; `sequences` stay `[b, 1 + max_decode_len]` (no
  draft slack), the statistics that are zeros are host constants."""
  batch = r.lengths.shape[0]
  zeros_b = np.zeros((batch,), np.int32)
  return SpeculativeResult(
      sequences=r.sequences, lengths=r.lengths, target_calls=r.target_calls, proposed=zeros_b,
      accepted=zeros_b, accepted_per_position=np.zeros((gamma_max,), np.int32),
      accept_histogram=np.zeros((gamma_max + 1,), np.int32),
      beta_sum=np.zeros((), np.float32), beta_count=np.zeros((), np.float32),
      loop_iterations=r.loop_iterations, gamma_histogram=histogram, gamma_trace=trace,
      draft_steps=np.zeros((), np.int32))
