"""The costs and starting acceptance `--gamma auto` decides with, measured on this machine and
batch before decoding (`generate --gamma auto`, the reproduction's auto rows, the benchmarks).

`measure_costs` gives the chain loop's (`adaptive.py`) c, v(1)..v(gamma_max) and alpha;
`first_stage` is its first stage, shared with the token trees' (`adaptive_tree.measure_costs`).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, NamedTuple, Tuple

import jax
import numpy as np

from gqa_spec import distributed
from gqa_spec.partitioning import to_host
from gqa_spec.decoding import autoregressive, sampling, theory, timing
from gqa_spec.decoding.adaptive import (CALIBRATED_PRIOR_WEIGHT, AdaptiveGamma, Calibration, decode,
                                        verify_width)
from gqa_spec.decoding.drafts.base import Draft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import Decoder

PyTree = Any

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
  the `(target state, draft state)` batches of `more` it read for the agreement; the mean of
  those batches' longest greedy outputs, in tokens."""
  t_step: float
  t_draft: float
  alpha: float
  t_call: float
  v_floor: float
  more: Tuple[Tuple[PyTree, PyTree], ...] = ()
  lengths: theory.Lengths = ()


def first_stage(target: Decoder, target_state: PyTree, max_decode_len: int, next_token, commit,
                draft_state: PyTree, slack: int,
                more: Iterable[Tuple[PyTree, PyTree]] = (),
                config: SamplingConfig = sampling.GREEDY) -> FirstStage:
  """The calibrations' first stage, chains (`measure_costs`) and trees
  (`adaptive_tree.measure_costs`) alike: a step of autoregressive decoding at `config` (the
  decoding's own sampling: the unit every cost is in, the plain steps speculation is compared
  with), the draft's pass over greedy decoding's output (`timing.teacher_forced` with
  `next_token` and `commit`, the output padded by `slack` slots) and the target's 1- and 2-token
  calls; v_floor = 1 + (2-token call - 1-token call) in steps, a lower bound of every
  iteration's v (`measure_costs`). The agreement also reads
  batches of `more` (`(target state, draft state)` of the same shapes, read lazily) until
  `CALIBRATION_POSITIONS` positions, at most `CALIBRATION_MAX_BATCHES` batches in all."""
  rng = jax.random.PRNGKey(0)
  greedy = lambda state, config=sampling.GREEDY: autoregressive.decode(
      target, state, rng, max_decode_len=max_decode_len, config=config)
  t_step = timing.per_iteration(lambda: greedy(target_state, config))  # seconds per plain step
  read, lengths = [], []

  def output(state):  # [b, 1 + L + slack] greedy decoding's sequences, and lengths [b]
    out = to_host(greedy(state))  # all rows, also where they are spread over processes
    lengths.append(tuple(int(x) for x in out.lengths))
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
  # process 0's times on every process: what comes next depends on them (`from_process_zero`)
  t_step, t_draft, alpha, t_one, t_two = distributed.from_process_zero(
      (t_step, t_draft, alpha, t_one, t_two))
  return FirstStage(t_step, t_draft, alpha, t_two, 1.0 + max(t_two - t_one, 0.0) / t_step,
                    tuple(read), theory.checked_lengths(lengths))


def measure_costs(target: Decoder, target_state: PyTree, draft: Draft, draft_state: PyTree,
                  max_decode_len: int, gamma_max: int,
                  more: Iterable[Tuple[PyTree, PyTree]] = (),
                  config: SamplingConfig = sampling.GREEDY,
                  one_width: bool = False) -> Calibration:
  """(c, v, alpha) on this machine and batch, for decoding at `config` (and with
  `AdaptiveGamma.one_width`: the loop that verifies at gamma_max + 1 tokens only, timed at that
  one width); c and v in units of one
  step of autoregressive decoding at `config` (seconds to a minute, compiles included; each time
  the fastest of a few runs):

    c = one draft token: a proposal of one token and its commit (`timing.teacher_forced`);
    v = (v(1), ..., v(gamma_max)): the rest of an iteration of this loop that proposes gamma
        tokens, timed whole: this loop at `config` with every row proposing w tokens (policy
        'optimal' `held` at w: its choice made every iteration and not taken, so that the
        program timed is the one the run compiles), w each compiled verification width
        (`AdaptiveGamma.verify_widths`), per iteration (at least that of every narrower width),
        less its w draft tokens; v(gamma) is that of the narrowest width that holds gamma
        (`verify_width`). It holds the target call, the sampling and verification of w + 1
        positions, appending, rollbacks, statistics, the policy's own work and the loops per width,
        at the decoding's temperature;
    lengths = the greedy output length of every row of the batches the first stage read (in
        tokens): what the policy prices a batch's wait for its slowest row with
        (`AdaptiveGamma.lengths`, `theory.batch_inflation`);
    alpha = the draft's acceptance, every row's starting estimate (`AdaptiveGamma.alpha_init`,
        `calibrated`): in the first stage that of one-token proposals at temperature 0 (so that
        no random draw enters it), its greedy token against greedy decoding's at every position
        of greedy decoding's output on this batch, fed the true prefix (`timing.teacher_forced`,
        the same pass that times c); where the second stage runs, the acceptance in this loop's
        gamma-1 run at `config` (the mean beta, the quantity the running alpha goes on to
        track, at the decoding's own temperature). Both are counted over at
        least `CALIBRATION_POSITIONS` output positions: where this batch holds fewer, batches of
        `more` (`(target state, draft state)` of the same shapes, e.g. the batches after this
        one, made as they are read) are read too, untimed, up to `CALIBRATION_MAX_BATCHES`.

  In two stages, so that ruling a draft out costs little. First the unit (`first_stage`), c and
  alpha, and the target's calls of 1 and 2 tokens. If Theorem 8 gives gamma 0 even with v(gamma) = 1
  + (the 2-token call - the 1-token call) in steps for every gamma, no gamma pays: that is a lower
  bound of every v (an iteration of this loop does all that a greedy step does besides its call, and
  its call is at least 2 tokens wide), so v is returned as that bound and nothing else is compiled
  or timed. `decode` is then greedy decoding from the start. On the cpu study's trained pair (a
  draft at c ~0.3-0.5, alpha ~0.3-0.5) this stage is the whole calibration: seconds where the second
  stage took half a minute more.

  Otherwise the loop at each width, all of them through one compiled loop (`decode`'s traced
  `first_gammas`: a compile per width took 135 s on the widened smoke pair at batch 1, against
  42 s in all). An earlier form timed the target's call at each width alone
  and the loop's own work at gamma 1 and T = 0 only, and added them: on the widened pair
  (`benchmarks/widened.py`) at T = 1 an iteration at gamma 8 cost 7.6 ms more than at T = 0
  (5 ms a greedy step), at gamma 5 2.9 ms, which that form did not see, and the policy stayed at
  gamma 8, 0.81x the best fixed gamma. On small models the loop's own work is the size of a target
  call (measured on this CPU: the smoke pair's n-gram drafts, c ~0.02, were slower than greedy at
  every gamma); without it Theorem 8 speculates where it does not pay. A draft without
  `propose_upto` (n-gram, copy) proposes the iteration's whole width every iteration whatever
  gamma a row asked for: its proposal is then part of every iteration's overhead, and c is 0. (A fixed
  optimistic starting alpha, 0.9, made every row try speculating first, which cost the smoke
  pair's n-gram drafts 10-30% of greedy decoding's speed on its 32-token outputs.)

  The second stage's alpha is its own run's (the mean beta of the tried positions: the quantity
  each row's running estimate goes on to track), the teacher-forced one counting every position
  of the output, the loop only those it proposes at (on the cpu study's pair, summarisation at
  batch 8: 0.465 and 0.483). A draft that reads the target's hidden states (Chimera,
  `reads_target_hidden`) proposes from those of the loop's own verification calls, which the
  teacher-forced pass does not make: the first stage does not stop it.

  Each time is the fastest of a few runs, taken at different moments: on this shared 2-core CPU
  the same measurement moved by up to 1.7x between runs of the calibration (c 0.16 to 0.32 for
  the cpu study's draft at batch 8), enough to change the decision where it is close. The second
  stage times the unit again and the loop at every width in interleaved rounds
  (`timing.interleaved_per_iteration`), v over that unit, so that a slow spell falls on all of
  them alike.

  With several processes (one mesh over all of them) every time is process 0's, on every process
  (`distributed.from_process_zero`): each process times the same programs but reads its own
  clock, and a calibration that differed would have one process compile and run the second
  stage, or loop for another iteration, while another waits for it. (The second stage's alpha is
  counted on the same global arrays by every process.)"""
  rng = jax.random.PRNGKey(0)

  def next_token(dstate, seqs, at):
    tokens, _, dstate = draft.propose(dstate, seqs, at, rng, 1, sampling.GREEDY)  # [b, 1]
    return tokens[:, 0], dstate

  first = first_stage(target, target_state, max_decode_len, next_token, draft.commit, draft_state,
                      gamma_max + 1, more, config)
  t_step, alpha = first.t_step, first.alpha
  c = first.t_draft / t_step if getattr(draft, 'propose_upto', None) is not None else 0.0
  floor = (first.v_floor,) * gamma_max
  batch = target.index(target_state).shape[0]
  shape = dict(lengths=first.lengths)  # what the batch waits for
  reads_hidden = getattr(draft, 'reads_target_hidden', False)
  if not reads_hidden and not AdaptiveGamma(gamma_max=gamma_max, cost_ratio=c, verify_ratio=floor,
                                            alpha_init=alpha, one_width=one_width,
                                            **shape).speculates:
    return Calibration(c, floor, alpha, t_step, **shape)
  # The policy's own loop (its choice made every iteration, not taken), at the first stage's
  # numbers: the constants differ from the run's, the program does not.
  policy = AdaptiveGamma(gamma_max=gamma_max, cost_ratio=c, verify_ratio=floor, alpha_init=alpha,
                         prior_weight=CALIBRATED_PRIOR_WEIGHT, one_width=one_width, **shape)
  widths = policy.verify_widths
  held = np.ones((), bool)
  run = lambda w, ts=target_state, ds=draft_state: decode(  # one compiled loop for every width
      target, ts, draft, ds, rng, adaptive=policy, max_decode_len=max_decode_len, config=config,
      first_gammas=np.full((batch,), w, np.int32), held=held)
  # seconds per greedy step and per iteration of this loop with every row proposing w tokens
  t_step, t_iter = time_widths(target, target_state, max_decode_len, config, run, widths)
  # the starting alpha: this loop's own at gamma 1, on the first stage's batches
  results = to_host([run(1)] + [run(1, ts, ds) for ts, ds in first.more])
  alpha = (sum(float(r.beta_sum) for r in results)
           / max(sum(float(r.beta_count) for r in results), 1.0))
  # gamma tokens cost gamma c + v(gamma): the iteration at the width w that holds gamma, less the
  # w draft tokens it proposed there; never below the first stage's bound.
  return Calibration(c, tuple(
      max(t_iter[w] / t_step - w * c, first.v_floor)
      for w in (verify_width(g, widths) for g in range(1, gamma_max + 1))), alpha, t_step,
      **shape)


def time_widths(target: Decoder, target_state: PyTree, max_decode_len: int,
                config: SamplingConfig, run, widths: Tuple[int, ...]):
  """The second stage's timings, chains' and trees' (`adaptive_tree.measure_costs`): seconds per
  step of autoregressive decoding at `config` and `{w: seconds per iteration of run(w)}` for every
  width, all in interleaved rounds (`timing.interleaved_per_iteration`: the unit again, beside the
  widths it divides). A wider iteration does all that a narrower one does, so its time is taken
  as at least theirs (the fastest-of-3 times moved by more than two widths differ: 3.14 steps at
  width 6 against 3.08 at 8 on the widened pair at batch 8, T = 1, which sent the policy to 8)."""
  unit = lambda: autoregressive.decode(target, target_state, jax.random.PRNGKey(0),
                                       max_decode_len=max_decode_len, config=config)
  t_step, *times = distributed.from_process_zero(timing.interleaved_per_iteration(
      [unit] + [lambda w=w: run(w) for w in widths]))  # process 0's on every process
  return t_step, dict(zip(widths, itertools.accumulate(times, max)))
