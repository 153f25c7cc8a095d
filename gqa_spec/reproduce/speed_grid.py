"""Measured speculative speedup against Leviathan et al.'s predictions, side by side in one run.

`measure_grid` (chains) and `measure_trees` (token trees) are the speculative stage of
`gqa-spec reproduce`. For every temperature it times our jitted autoregressive decoding of
the target, then for every draft and gamma the speculative loop on the same inputs and batches
(median of repeats, after the untimed first run that compiles it: `first_runs`, `workers` of
them at a time), and reports:
  alpha            Corollary 6: mean acceptance probability beta over the positions the loop
                   tried, i.e. on the target's own generations;
  tokens_per_call  generated tokens / target calls (the corrected or bonus token counted);
  accepted         draft tokens accepted (accepted / target_calls: the mean accepted length);
  loop_iterations  batched target calls (parameter bytes read = bytes x iterations);
  c                draft cost per proposed token / target step (timed here: per gamma, once for
                   every temperature; a model draft's decode step once);
  verify_ratio_v   target time for gamma + 1 tokens / for 1 token (Theorem 8 assumes 1);
  speedup_measured per-token time of autoregressive / of speculative decoding;
  speedup_thm8     Theorem 8 with the measured alpha and c; `_with_v` also with v(gamma).
With `auto_drafts`, `measure_grid` also runs `--gamma auto` (`adaptive.decode`, policy optimal,
gamma_max = the largest gamma) for those drafts on the same batches (`auto_rows`), with c and
v(1)..v(gamma_max) from `cost_calibration.measure_costs` on the first batch at each temperature, as
`generate --gamma auto` measures them.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import statistics
import time
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

import jax
import jax.numpy as jnp

from gqa_spec.decoding import (adaptive, autoregressive, cost_calibration, speculative, theory,
                               tree_speculative, xla_options)
from gqa_spec.decoding.cost_calibration import step_time
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length


def median_time(fn: Callable[[], Any], repeats: int, warm: bool = True) -> float:
  """Median wall seconds of `fn()` over `repeats` runs, after one untimed (compiling) run (`warm`
  False: the caller has just run it, untimed)."""
  if warm:
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def first_runs(fns: Sequence[Callable[[], Any]], workers: int = 1) -> List[Any]:
  """`fn()` of each, once and untimed (the runs that compile), `workers` at a time in threads;
  their results, ready, in order. XLA compiles outside Python's lock, so compiles overlap where
  one loop does not fill the cores. Each thread runs in a copy of the caller's context
  (`xla_options.fast_compile` reaches it)."""
  if workers < 1:
    raise ValueError(f'workers must be >= 1, got {workers}')
  if workers == 1 or len(fns) < 2:
    return [jax.block_until_ready(fn()) for fn in fns]
  with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix='first-run') as pool:
    futures = [pool.submit(contextvars.copy_context().run,
                           lambda fn=fn: jax.block_until_ready(fn())) for fn in fns]
    return [f.result() for f in futures]


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

  return cost_calibration.min_time(lambda: loop(dstate), 5) / iters


# name -> (draft, init(encoder_tokens [b, S]) -> draft state)
Drafts = Mapping[str, Tuple[Any, Callable[[jax.Array], Any]]]


def measure_grid(target: T5Decoder, params: Any, drafts: Drafts, batches: Sequence[jax.Array], *,
                 max_decode_len: int, gammas: Sequence[int], temperatures: Sequence[float],
                 repeats: int, seed: int = 0, workers: int = 1,
                 auto_drafts: Sequence[str] = ()) -> Dict[str, Any]:
  """Autoregressive vs speculative decoding for every (temperature, draft, gamma).

  Args:
    target: the target's decoder binding.
    params: its parameters.
    drafts: name -> (draft, init from encoder tokens).
    batches: `[b, S]` encoder inputs, decoded batch by batch (same batches for every method).
    max_decode_len: tokens generated per row at most.
    gammas: draft lengths.
    temperatures: 0 (greedy) and/or sampling temperatures.
    repeats: timed repeats (median).
    seed: sampling seed.
    workers: the untimed first runs (compiling every loop) this many at a time (`first_runs`);
      the timed runs always one at a time, after all of them.
    auto_drafts: drafts (names in `drafts`) also decoded with `--gamma auto` (module docstring).

  Returns:
    `{'autoregressive': {temperature: {...}}, 'target_step_seconds': {k: s}, 'rows': [...],
    'auto_rows': [...]}`.
  """
  L = max_decode_len
  gmax = max(gammas)
  slots = cache_length(L, gmax + 1)
  fill = L // 2
  widths = adaptive.verify_gammas(gmax) if auto_drafts else ()

  def ar_all(config):
    return [autoregressive.decode(target, target.init(params, enc, slots),
                                  jax.random.PRNGKey(seed), max_decode_len=L, config=config)
            for enc in batches]

  tstate = target.init(params, batches[0], slots)
  t_target = {k: step_time(target, tstate, k, fill)
              for k in sorted({1} | {g + 1 for g in gammas} | {w + 1 for w in widths})}
  costs: Dict[Tuple[Any, ...], float] = {}

  def draft_cost(name: str, draft, dinit, gamma: int) -> float:
    """c: seconds per proposed token / target step. A model draft's is one decode step at any
    gamma; another draft's per gamma. Neither depends on the temperature: timed once."""
    key = (name,) if isinstance(draft, ModelDraft) else (name, gamma)
    if key not in costs:
      if isinstance(draft, ModelDraft):
        seconds = step_time(draft.decoder, dinit(batches[0]), 1, fill)
      else:
        seconds = propose_time(draft, dinit(batches[0]), gamma, batches[0].shape[0],
                               2 * fill) / gamma
      costs[key] = seconds / t_target[1]
    return costs[key]

  def spec_all(config, draft, dinit, gamma):
    return [speculative.decode(target, target.init(params, enc, slots), draft, dinit(enc),
                               jax.random.PRNGKey(seed + 1), gamma=gamma, max_decode_len=L,
                               config=config) for enc in batches]

  # Every loop's first run (compiling it), then the timed runs: (temperature, draft or None, gamma)
  runs = {(temp, None, None): lambda t=temp: ar_all(SamplingConfig(temperature=t))
          for temp in temperatures}
  runs.update({(temp, name, gamma): lambda t=temp, d=draft, i=dinit, g=gamma:
               spec_all(SamplingConfig(temperature=t), d, i, g)
               for temp in temperatures for name, (draft, dinit) in drafts.items()
               for gamma in gammas})
  autos = {(temp, name): auto_costs(target, params, *drafts[name], batches, L, gmax,
                                    SamplingConfig(temperature=temp))
           for temp in temperatures for name in auto_drafts}

  def auto_all(config, draft, dinit, auto):
    slots_auto = cache_length(L, auto.call_tokens)  # as `generate --gamma auto` allocates
    return [adaptive.decode(target, target.init(params, enc, slots_auto), draft,
                            dinit(enc) if auto.speculates else None,
                            jax.random.PRNGKey(seed + 1), adaptive=auto, max_decode_len=L,
                            config=config) for enc in batches]

  runs.update({(temp, name, 'auto'): lambda t=temp, n=name: auto_all(
      SamplingConfig(temperature=t), *drafts[n], autos[t, n])
               for temp in temperatures for name in auto_drafts})
  first = dict(zip(runs, first_runs(list(runs.values()), workers)))
  out: Dict[str, Any] = {'target_step_seconds': {str(k): v for k, v in t_target.items()},
                         'autoregressive': {}, 'rows': [], 'auto_rows': []}
  for temp in temperatures:
    ar = first[temp, None, None]
    ar_secs = median_time(runs[temp, None, None], repeats, warm=False)
    ar_tokens = sum(int(r.lengths.sum()) for r in ar)
    ar_lists: List[List[int]] = sum((autoregressive.strip(r.sequences, r.lengths) for r in ar), [])
    out['autoregressive'][str(temp)] = {'seconds': ar_secs, 'tokens': ar_tokens,
                                        'seconds_per_token': ar_secs / ar_tokens,
                                        'outputs': ar_lists}
    for name, (draft, dinit) in drafts.items():
      for gamma in gammas:
        res = first[temp, name, gamma]
        secs = median_time(runs[temp, name, gamma], repeats, warm=False)
        tokens = sum(int(r.lengths.sum()) for r in res)
        calls = sum(int(r.target_calls.sum()) for r in res)
        beta_count = sum(float(r.beta_count) for r in res)
        alpha = sum(float(r.beta_sum) for r in res) / max(beta_count, 1.0)
        c = draft_cost(name, draft, dinit, gamma)
        v = t_target[gamma + 1] / t_target[1]
        spec_lists = sum((autoregressive.strip(r.sequences, r.lengths) for r in res), [])
        row = {'draft': name, 'temperature': temp, 'gamma': gamma, 'alpha': alpha,
               'tokens': tokens, 'target_calls': calls, 'tokens_per_call': tokens / calls,
               'accepted': sum(int(r.accepted.sum()) for r in res),
               'loop_iterations': sum(int(r.loop_iterations) for r in res),
               'c': c, 'verify_ratio_v': v, 'seconds': secs, 'ar_seconds': ar_secs,
               'ar_tokens': ar_tokens,
               'speedup_measured': (ar_secs / ar_tokens) / (secs / tokens),
               'speedup_thm8': theory.walltime_improvement(alpha, gamma, c),
               'speedup_thm8_with_v': theory.walltime_improvement(alpha, gamma, c, v),
               'optimal_gamma_thm8': theory.optimal_gamma(min(alpha, 0.999), c),
               'tokens_equal_autoregressive': (spec_lists == ar_lists) if temp == 0 else None}
        row['measured_over_thm8'] = row['speedup_measured'] / row['speedup_thm8']
        out['rows'].append(row)
    for name in auto_drafts:
      res = first[temp, name, 'auto']
      secs = median_time(runs[temp, name, 'auto'], repeats, warm=False)
      tokens = sum(int(r.lengths.sum()) for r in res)
      calls = sum(int(r.target_calls.sum()) for r in res)
      spec_lists = sum((autoregressive.strip(r.sequences, r.lengths) for r in res), [])
      auto = autos[temp, name]
      out['auto_rows'].append({
          'draft': name, 'temperature': temp, 'gamma': 'auto', 'policy': auto.describe(),
          'c': auto.cost_ratio, 'verify_ratio_v': list(auto.verify_ratio),
          'alpha_init': auto.alpha_init, 'speculated': auto.speculates,
          'tokens': tokens, 'target_calls': calls, 'tokens_per_call': tokens / calls,
          'accepted': sum(int(r.accepted.sum()) for r in res),
          'loop_iterations': sum(int(r.loop_iterations) for r in res),
          'gamma_histogram': [int(x) for x in sum(r.gamma_histogram.sum(axis=0) for r in res)],
          'seconds': secs, 'ar_seconds': ar_secs, 'ar_tokens': ar_tokens,
          'speedup_measured': (ar_secs / ar_tokens) / (secs / tokens),
          'tokens_equal_autoregressive': (spec_lists == ar_lists) if temp == 0 else None})
  return out


def auto_costs(target, params: Any, draft, dinit: Callable[[jax.Array], Any],
               batches: Sequence[jax.Array], max_decode_len: int, gamma_max: int,
               config: SamplingConfig = SamplingConfig()) -> adaptive.AdaptiveGamma:
  """`--gamma auto`'s settings for `draft` at `config` as `generate` measures them: c,
  v(1)..v(gamma_max) and the starting alpha from `cost_calibration.measure_costs` on the first of
  `batches` (the alpha also on the batches after it that it asks for)."""
  slots = cache_length(max_decode_len, gamma_max + 1)
  states = ((target.init(params, enc, slots), dinit(enc)) for enc in batches)  # lazily
  first = next(states)
  return adaptive.AdaptiveGamma(gamma_max=gamma_max).calibrated(cost_calibration.measure_costs(
      target, first[0], draft, first[1], max_decode_len, gamma_max, more=states, config=config))


# name -> (tree draft, its TreeShape, init(encoder_tokens [b, S]) -> draft state)
TreeDrafts = Mapping[str, Tuple[Any, Any, Callable[[jax.Array], Any]]]


def measure_trees(target: T5Decoder, params: Any, drafts: TreeDrafts,
                  batches: Sequence[jax.Array], *, max_decode_len: int,
                  autoregressive_runs: Mapping[str, Mapping[str, Any]], repeats: int,
                  seed: int = 0, workers: int = 1) -> List[Dict[str, Any]]:
  """Tree speculative decoding (`tree_speculative.decode`) beside `measure_grid`'s autoregressive runs.

  Args:
    target, params, batches, max_decode_len, repeats, seed, workers: as `measure_grid`.
    drafts: name -> (tree draft, shape, init from encoder tokens).
    autoregressive_runs: `measure_grid(...)['autoregressive']` on the same batches: its
      temperatures are the ones measured, its times the baseline, its outputs the greedy reference.

  Returns:
    Rows `{draft, tree, depth, nodes, temperature, tokens, target_calls, tokens_per_call,
    accepted, loop_iterations, seconds, ar_seconds, ar_tokens, speedup_measured,
    tokens_equal_autoregressive, accept_histogram, draft_calls}` per (temperature, draft);
    draft_calls: batched draft decode calls where the draft counts them (`TreeModelDraft`), else
    None.
  """
  L = max_decode_len

  def run_all(config, draft, shape, dinit):
    slots = cache_length(L, shape.num_nodes + 1)
    return [tree_speculative.decode(target, target.init(params, enc, slots), draft, dinit(enc),
                                    jax.random.PRNGKey(seed + 1), shape=shape, max_decode_len=L,
                                    config=config) for enc in batches]

  runs = {(temp_key, name): lambda t=temp_key, d=draft, s=shape, i=dinit:
          run_all(SamplingConfig(temperature=float(t)), d, s, i)
          for temp_key in autoregressive_runs for name, (draft, shape, dinit) in drafts.items()}
  first = dict(zip(runs, first_runs(list(runs.values()), workers)))
  rows = []
  for temp_key, ar in autoregressive_runs.items():
    config = SamplingConfig(temperature=float(temp_key))
    for name, (_, shape, _) in drafts.items():
      res = first[temp_key, name]
      secs = median_time(runs[temp_key, name], repeats, warm=False)
      tokens = sum(int(r.lengths.sum()) for r in res)
      calls = sum(int(r.target_calls.sum()) for r in res)
      outputs = sum((autoregressive.strip(r.sequences, r.lengths) for r in res), [])
      rows.append({
          'draft': name, 'tree': shape.describe(), 'depth': shape.depth,
          'nodes': shape.num_nodes, 'temperature': float(temp_key), 'tokens': tokens,
          'target_calls': calls, 'tokens_per_call': tokens / calls,
          'accepted': sum(int(r.accepted.sum()) for r in res),
          'loop_iterations': sum(int(r.loop_iterations) for r in res), 'seconds': secs,
          'ar_seconds': ar['seconds'], 'ar_tokens': ar['tokens'],
          'speedup_measured': ar['seconds_per_token'] / (secs / tokens),
          'tokens_equal_autoregressive': (outputs == ar['outputs']) if config.greedy else None,
          'accept_histogram': [int(x) for x in sum(r.accept_histogram for r in res)],
          'draft_calls': (None if res[0].draft_calls is None
                          else sum(int(r.draft_calls) for r in res))})
  return rows
