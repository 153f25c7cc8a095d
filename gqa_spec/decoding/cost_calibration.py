"""Cost calibration: what `--gamma auto` and `--tree best:auto` decide with, measured on this
machine and batch before decoding (`measure_costs`), in units of one greedy step:

  c        one draft token (chains; 0 for a draft without `propose_upto`), or one of the D draft
           calls that grow a tree;
  v        per gamma (chains) or per compiled width (trees): the rest of an adaptive iteration;
  alpha    the draft's acceptance, every row's starting estimate;
  accepted (trees) draft tokens accepted per call at each width;
  lengths  the greedy output length of every row of the batches read (`theory.Lengths`).

The first stage times a greedy step, the draft's teacher-forced pass over greedy decoding's output
(`teacher_forced`: c, and alpha as its agreement) and the target's 1- and 2-token calls, whose
difference bounds every v from below. If the policy pays for no speculation even at that bound,
decoding is greedy and nothing else is compiled (except for a draft that reads the target's
hidden states, which the teacher-forced pass cannot run). The second stage times the policy's own
compiled loop with every row held at each width in turn, interleaved with the unit
(`interleaved_per_iteration`), and measures alpha there. Alpha is counted over at least
`CALIBRATION_POSITIONS` positions, reading up to `CALIBRATION_MAX_BATCHES` batches of `more`.
Times are the fastest of a few runs read from `clock`; with several processes every process takes
process 0's times (`distributed.from_process_zero`).
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Iterable, List, NamedTuple, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec import distributed
from gqa_spec.decoding import adaptive, adaptive_tree, autoregressive, sampling, theory, xla_options
from gqa_spec.decoding import tree as tree_lib
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.adaptive_tree import AdaptiveTree
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import Decoder
from gqa_spec.partitioning import to_host

PyTree = Any
Clock = Callable[[], float]

CALIBRATION_POSITIONS = 128  # the fewest output positions alpha is measured over
CALIBRATION_MAX_BATCHES = 16  # the most batches read for it


class Calibration(NamedTuple):
  """What `measure_costs` measured (module docstring): c, v (per gamma for chains, per compiled
  width for trees), alpha, seconds per greedy step (`guard`'s unit; 0: not measured), the batches'
  output lengths, and for trees the accepted tokens per width (() where not measured)."""
  cost_ratio: float
  verify_ratio: Tuple[float, ...]
  alpha: float
  step_seconds: float = 0.0
  lengths: theory.Lengths = ()
  accepted: Tuple[float, ...] = ()


# ---- timing ---------------------------------------------------------------------------------


def min_time(fn: Callable[[], Any], repeats: int, clock: Clock = time.perf_counter,
             warm: bool = True) -> float:
  """Seconds of the fastest of `repeats` runs of `fn()`, after one untimed (compiling) run where
  `warm`."""
  if warm:
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = clock()
    jax.block_until_ready(fn())
    times.append(clock() - t0)
  return min(times)


def interleaved_per_iteration(runs: Sequence[Callable[[], Any]], repeats: int = 3,
                              clock: Clock = time.perf_counter) -> List[float]:
  """Seconds per loop iteration (`loop_iterations`) of each decoding call of `runs`, the fastest
  of `repeats` rounds after one untimed run; each round runs every call once, the order rotated
  (a slow spell of a shared machine falls on all alike)."""
  iterations = [max(int(jax.block_until_ready(run()).loop_iterations), 1) for run in runs]
  times = [[] for _ in runs]
  for r in range(repeats):
    for i in [(r + j) % len(runs) for j in range(len(runs))]:
      t0 = clock()
      jax.block_until_ready(runs[i]())
      times[i].append(clock() - t0)
  return [min(t) / n for t, n in zip(times, iterations)]


def step_time(decoder, state, k: int, fill: int, iters: int = 40,
              clock: Clock = time.perf_counter) -> float:
  """Seconds per `tokens_to_logits` call appending k tokens at cache fill `fill` (rolled back)."""
  batch = decoder.index(state).shape[0]
  index = jnp.full((batch,), fill, jnp.int32)

  @xla_options.jit
  def loop(state):
    def body(_, s):
      logits, s = decoder.tokens_to_logits(s, jnp.full((batch, k), 5, jnp.int32))
      # Depending on every logit keeps XLA from slicing away the work of the other positions.
      return decoder.rollback(s, index + (jnp.sum(logits) > 1e30))
    return jax.lax.fori_loop(0, iters, body, decoder.rollback(state, index))

  return min_time(lambda: loop(state), 5, clock) / iters


def teacher_forced(next_token: Callable[..., Any], commit: Callable[..., Any], state: Any,
                   sequences: jax.Array, lengths: jax.Array, repeats: int = 5,
                   min_calls: int = 64, more: Iterable[Tuple[Any, jax.Array, jax.Array]] = (),
                   min_positions: int = 0, clock: Clock = time.perf_counter
                   ) -> Tuple[float, float]:
  """A draft fed the true prefix at every position of greedy decoding's output: the seconds of
  one position and the agreement.

  `sequences [b, T]` (T >= max(lengths) + 2) and `lengths [b]` are greedy decoding's output. At
  each position i, `next_token(state, sequences, at)` gives `[b]` the draft's next token and
  `commit(state, sequences, at + 1)` advances it by the true one. The agreement (the acceptance
  of a one-token greedy proposal) is over the rows' positions, reading further batches of `more`
  (`(state, sequences, lengths)`, untimed) while fewer than `min_positions` are counted; the
  timed call makes at least `min_calls` proposals."""
  sequences, lengths = jnp.asarray(sequences), jnp.asarray(lengths)
  batch = lengths.shape[0]

  @xla_options.jit
  def loop(state, sequences, lengths, n, passes):  # n, passes: traced (one program for all)
    def body(j, carry):
      s, agree = carry
      i = j % n
      at = jnp.full((batch,), i, jnp.int32)  # [b]
      token, s = next_token(s, sequences, at)  # [b]
      hit = (token == jax.lax.dynamic_index_in_dim(sequences, i + 1, 1, False)) & (i < lengths)
      hit &= j < n  # the first pass counts
      return commit(s, sequences, jnp.where(i + 1 < n, at + 1, 0)), agree + hit.astype(jnp.int32)
    return jax.lax.fori_loop(0, n * passes, body, (state, jnp.zeros((batch,), jnp.int32)))

  def agreement(state, sequences, lengths):  # (positions that agree, positions)
    n = max(int(jnp.max(lengths)), 1)
    agree = to_host(loop(state, jnp.asarray(sequences), jnp.asarray(lengths), n, 1)[1])  # [b]
    return int(agree.sum()), int(jnp.sum(lengths))

  n = max(int(jnp.max(lengths)), 1)
  passes = -(-min_calls // n)
  hits, positions = agreement(state, sequences, lengths)  # compiles
  seconds = min_time(lambda: loop(state, sequences, lengths, n, passes), repeats, clock,
                     warm=False) / (n * passes)
  for batch_state, batch_sequences, batch_lengths in (more if positions < min_positions else ()):
    h, p = agreement(batch_state, batch_sequences, batch_lengths)
    hits, positions = hits + h, positions + p
    if positions >= min_positions:
      break
  return seconds, hits / max(positions, 1)


# ---- the calibration ------------------------------------------------------------------------


class _FirstStage(NamedTuple):
  t_step: float  # seconds per greedy step
  t_draft: float  # seconds per teacher-forced proposal (with its commit)
  alpha: float  # the teacher-forced agreement
  v_floor: float  # v's lower bound, in steps
  more: Tuple[Tuple[PyTree, PyTree], ...]  # the batches of `more` read
  lengths: theory.Lengths


def _first_stage(target: Decoder, target_state: PyTree, max_decode_len: int, next_token, commit,
                 draft_state: PyTree, slack: int, more: Iterable[Tuple[PyTree, PyTree]],
                 config: SamplingConfig, clock: Clock) -> _FirstStage:
  """The unit, the draft's teacher-forced pass (over greedy outputs padded by `slack` slots) and
  the target's 1- and 2-token calls (module docstring)."""
  rng = jax.random.PRNGKey(0)
  greedy = lambda state, config=sampling.GREEDY: autoregressive.decode(
      target, state, rng, max_decode_len=max_decode_len, config=config)
  t_step = interleaved_per_iteration([lambda: greedy(target_state, config)], clock=clock)[0]
  read, lengths = [], []

  def output(state):  # [b, 1 + L + slack] greedy decoding's sequences, and lengths [b]
    out = to_host(greedy(state))  # all rows, also where they are spread over processes
    lengths.append(tuple(int(x) for x in out.lengths))
    return np.pad(out.sequences, ((0, 0), (0, slack))), out.lengths

  def more_outputs():
    for tstate, dstate in itertools.islice(more, CALIBRATION_MAX_BATCHES - 1):
      read.append((tstate, dstate))
      yield (dstate, *output(tstate))

  t_draft, alpha = teacher_forced(next_token, commit, draft_state, *output(target_state),
                                  more=more_outputs(), min_positions=CALIBRATION_POSITIONS,
                                  clock=clock)
  fill = max_decode_len // 2
  t_one = step_time(target, target_state, 1, fill, clock=clock)
  t_two = step_time(target, target_state, 2, fill, clock=clock)
  t_step, t_draft, alpha, t_one, t_two = distributed.from_process_zero(
      (t_step, t_draft, alpha, t_one, t_two))
  return _FirstStage(t_step, t_draft, alpha, 1.0 + max(t_two - t_one, 0.0) / t_step, tuple(read),
                     theory.checked_lengths(lengths))


def measure_costs(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
                  max_decode_len: int, settings: Union[int, AdaptiveGamma, AdaptiveTree],
                  more: Iterable[Tuple[PyTree, PyTree]] = (),
                  config: SamplingConfig = sampling.GREEDY,
                  clock: Clock = time.perf_counter) -> Calibration:
  """The `Calibration` of `draft` for `settings`' loop: an `AdaptiveGamma` (or its gamma_max) for
  `adaptive.decode`, an `AdaptiveTree` for `adaptive_tree.decode`; measured on this batch at
  `config`, reading batches of `more` for alpha as far as it needs."""
  tree = isinstance(settings, AdaptiveTree)
  if not tree and not isinstance(settings, AdaptiveGamma):
    settings = AdaptiveGamma(gamma_max=int(settings))
  rng = jax.random.PRNGKey(0)
  batch = target.index(target_state).shape[0]
  if tree:
    shape = settings.shape
    nothing = jnp.full((batch, shape.depth), -1, jnp.int32)  # no path

    def next_token(dstate, seqs, at):
      grown, dstate = draft.propose_tree(dstate, seqs, at, rng, shape, sampling.GREEDY)
      return tree_lib.first_nodes(tree_lib.by_rank(grown)[0], 1).tokens[:, 0], dstate  # [b]

    commit = lambda dstate, seqs, at: draft.commit_tree(dstate, seqs, at, nothing)
    slack, widths, costs = shape.depth + 1, settings.widths, len(settings.widths)
    loop = adaptive_tree._speculative  # pylint: disable=protected-access
    calls, draft_tokens = shape.depth, lambda width: shape.depth  # D draft calls grow a tree
  else:
    def next_token(dstate, seqs, at):
      tokens, _, dstate = draft.propose(dstate, seqs, at, rng, 1, sampling.GREEDY)  # [b, 1]
      return tokens[:, 0], dstate

    commit = draft.commit
    slack, widths, costs = settings.gamma_max + 1, settings.verify_widths, settings.gamma_max
    loop = adaptive._speculative  # pylint: disable=protected-access
    calls = 1 if getattr(draft, 'propose_upto', None) is not None else 0  # 0: c = 0
    draft_tokens = lambda width: width
  first = _first_stage(target, target_state, max_decode_len, next_token, commit, draft_state,
                       slack, more, config, clock)
  c = first.t_draft / calls / first.t_step if calls else 0.0
  cal = Calibration(c, (first.v_floor,) * costs, first.alpha, first.t_step, first.lengths)
  policy = settings.calibrated(cal)
  if not getattr(draft, 'reads_target_hidden', False) and not policy.speculates:
    return cal
  # The policy's own loop, its choice made every iteration and not taken (`held`), at the first
  # stage's numbers: the constants differ from the run's, the program does not.
  held = np.ones((), bool)
  start = 'first_nodes' if tree else 'first_gammas'
  run = lambda w, ts=target_state, ds=draft_state: loop(
      target, ts, draft, ds, rng, adaptive=policy, max_decode_len=max_decode_len, config=config,
      eos_id=autoregressive.EOS, skip=None, held=held, **{start: np.full((batch,), w, np.int32)})
  unit = lambda: autoregressive.decode(target, target_state, rng, max_decode_len=max_decode_len,
                                       config=config)
  t_step, *times = distributed.from_process_zero(interleaved_per_iteration(
      [unit] + [lambda w=w: run(w) for w in widths], clock=clock))
  # a wider iteration does all that a narrower one does
  t_iter = dict(zip(widths, itertools.accumulate(times, max)))
  v = {w: max(t_iter[w] / t_step - draft_tokens(w) * c, first.v_floor) for w in widths}
  # the loop's own acceptance, on the first stage's batches (every process counts the same rows)
  results = {w: to_host([run(w)] + [run(w, ts, ds) for ts, ds in first.more])
             for w in (widths if tree else (1,))}
  total = lambda w, field: sum(float(np.sum(getattr(r, field))) for r in results[w])
  if tree:
    alpha = total(1, 'accepted') / max(total(1, 'proposed'), 1.0)
    accepted = tuple(total(u, 'accepted') / max(total(u, 'target_calls'), 1.0) for u in widths)
    return Calibration(c, tuple(v[u] for u in widths), alpha, t_step, first.lengths, accepted)
  alpha = total(1, 'beta_sum') / max(total(1, 'beta_count'), 1.0)
  return Calibration(c, tuple(v[adaptive.verify_width(g, widths)]
                              for g in range(1, settings.gamma_max + 1)), alpha, t_step,
                     first.lengths)
