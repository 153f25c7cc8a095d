"""Timing decode calls and loops: the measured costs speculative decoding is planned from.

  step_time      seconds per target (or draft) call appending k tokens: v(gamma) and c
  propose_time   seconds per draft proposal of gamma tokens (drafts that are not models)
  teacher_forced seconds per draft proposal of one token, and its agreement with greedy decoding
  median_time, min_time   wall seconds of a callable over repeats (after a compiling run)
  per_iteration, interleaved_per_iteration   seconds per loop iteration of decoding calls
  first_runs     the untimed, compiling first runs of several loops, some at a time in threads

Used by `speedup` (the grids), `adaptive` (`--gamma auto`'s calibration) and the benchmarks.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import statistics
import time
from typing import Any, Callable, Iterable, List, Sequence, Tuple

import jax
import jax.numpy as jnp

from gqa_spec.decoding import xla_options
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.partitioning import to_host


def _timed_runs(fn: Callable[[], Any], repeats: int, warm: bool = True) -> List[float]:
  if warm:
    jax.block_until_ready(fn())  # compile and warm up, untimed
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return times


def median_time(fn: Callable[[], Any], repeats: int, warm: bool = True) -> float:
  """Median wall seconds of `fn()` over `repeats` runs, after one untimed (compiling) run (`warm`
  False: the caller has just run it, untimed)."""
  return statistics.median(_timed_runs(fn, repeats, warm))


def first_runs(fns: Sequence[Callable[[], Any]], workers: int = 1) -> List[Any]:
  """`fn()` of each, once and untimed (the runs that compile), `workers` at a time in threads;
  their results, ready, in order. XLA compiles outside Python's lock, so on a machine whose cores
  one tiny loop does not fill (the smoke's speculative stage on 2 cores) compiles overlap. Each
  thread runs in a copy of the caller's context (`xla_options.fast_compile` reaches it)."""
  if workers < 1:
    raise ValueError(f'workers must be >= 1, got {workers}')
  if workers == 1 or len(fns) < 2:
    return [jax.block_until_ready(fn()) for fn in fns]
  with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix='first-run') as pool:
    futures = [pool.submit(contextvars.copy_context().run,
                           lambda fn=fn: jax.block_until_ready(fn())) for fn in fns]
    return [f.result() for f in futures]


def min_time(fn: Callable[[], Any], repeats: int) -> float:
  """Least disturbed of `repeats` runs: micro-benchmarks on a shared CPU."""
  return min(_timed_runs(fn, repeats))


def per_iteration(run: Callable[[], Any], repeats: int = 3) -> float:
  """Seconds per loop iteration of a decoding call `run()` (its result's `loop_iterations`), the
  fastest of `repeats` runs after one untimed run."""
  iterations = max(int(jax.block_until_ready(run()).loop_iterations), 1)
  return min_time(run, repeats) / iterations


def interleaved_per_iteration(runs: Sequence[Callable[[], Any]], repeats: int = 3) -> List[float]:
  """Seconds per loop iteration of each decoding call `runs[i]()` (as `per_iteration`), the
  fastest of `repeats` rounds after one untimed run each. A round runs every call once, in turn,
  the order rotated each round, so that a slow spell of a shared machine falls on all of them
  rather than on one. Timed one after another (`per_iteration` each), the calibration's v(gamma)
  on this 2-core machine moved by 1.24x-1.41x (median 1.29x) across 4 runs on the same batch,
  interleaved by 1.03x-1.30x (median 1.11x) (results/benchmarks/calibration_spread)."""
  iterations = [max(int(jax.block_until_ready(run()).loop_iterations), 1) for run in runs]
  times = [[] for _ in runs]
  for r in range(repeats):
    for i in [(r + j) % len(runs) for j in range(len(runs))]:
      t0 = time.perf_counter()
      jax.block_until_ready(runs[i]())
      times[i].append(time.perf_counter() - t0)
  return [min(t) / n for t, n in zip(times, iterations)]


def step_time(decoder, state, k: int, fill: int, iters: int = 40) -> float:
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

  return min_time(lambda: loop(state), 5) / iters


def propose_time(draft, dstate, gamma: int, batch: int, length: int, iters: int = 20) -> float:
  """Seconds per `propose` of gamma tokens (plus its commit) at sequence length `length // 2`."""
  seqs = jnp.full((batch, length), 5, jnp.int32)
  lengths = jnp.full((batch,), length // 2, jnp.int32)

  @xla_options.jit
  def loop(dstate):
    def body(_, carry):
      s, acc = carry
      toks, _, s = draft.propose(s, seqs, lengths, jax.random.PRNGKey(0), gamma, SamplingConfig())
      return draft.commit(s, seqs, lengths), acc + jnp.sum(toks)
    return jax.lax.fori_loop(0, iters, body, (dstate, jnp.zeros((), jnp.int32)))

  return min_time(lambda: loop(dstate), 5) / iters


def teacher_forced(next_token: Callable[..., Any], commit: Callable[..., Any], state: Any,
                   sequences: jax.Array, lengths: jax.Array, repeats: int = 5,
                   min_calls: int = 64, more: Iterable[Tuple[Any, jax.Array, jax.Array]] = (),
                   min_positions: int = 0) -> Tuple[float, float]:
  """A draft fed the true prefix at every position of a greedy decoding's output: the seconds
  of one position (the fastest of `repeats` runs after a compiling one) and the agreement.

  `sequences [b, T]` (slot 0 the start token) and `lengths [b]` are greedy decoding's output, T at
  least max(lengths) + 2. At each position i < n = max(lengths), `next_token(state, sequences,
  at)` gives `[b]` the draft's token after the first i + 1 slots (`at` `[b]`, all i) and its
  state, and `commit(state, sequences, at + 1)` advances it by the true token, as the speculative
  loops call their drafts. The agreement is the fraction of the rows' positions (i < the row's
  length) where the draft's token is greedy decoding's: at temperature 0, the acceptance rate
  (Leviathan et al. Definition 1) of a one-token proposal, averaged over every position of the
  output. The timed call makes at least `min_calls` proposals, passes over the n positions one
  after another (a `commit` to 0 between them), so that its dispatch is not in the seconds.

  While fewer than `min_positions` positions are counted, the agreement reads further batches
  from `more` (`(state, sequences, lengths)` of the same shapes, e.g. the batches after the
  first: one compiled program serves them all; read lazily, none past the bound), untimed: an
  acceptance from the ~10 tokens of one short output is too noisy to decide on."""
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
  seconds = min(_timed_runs(lambda: loop(state, sequences, lengths, n, passes), repeats,
                            warm=False)) / (n * passes)
  for batch_state, batch_sequences, batch_lengths in (more if positions < min_positions else ()):
    h, p = agreement(batch_state, batch_sequences, batch_lengths)
    hits, positions = hits + h, positions + p
    if positions >= min_positions:
      break
  return seconds, hits / max(positions, 1)
