"""`generate --gamma auto`'s guard over whole runs: greedy decoding, `--gamma auto --no-guard` and
`--gamma auto` (the guard on) side by side.

  python -m benchmarks.guard --pair NAME TARGET DRAFT TASK [--pair ...] --data-dir DIR \
      [--pair-drafts draft|bigram|copy] [--misprice F] [--examples 32] [--batches 1,8] \
      [--temperatures 0,1] [--gamma-max 8] \
      [--max-decode-len 32] [--input-length 64] [--repeats 5] [--out results/benchmarks/guard]

A run is what `generate` does over `--examples` inputs in batches of the cell's size:
`guard.decode_batches` with the run function `generate` uses (each call encodes its batch and
decodes it: the adaptive loop, or with `plain` greedy decoding's own program), a fresh
`SpeculationGuard` per guarded run, none otherwise. The calibration (`calibration.measure_costs` on
the first batch, as `generate`) is made once per cell and shared by both `--gamma auto` runs.
Seconds: the run's timed calls (`generate --stats` `seconds`: the plain program's compiling call
excluded), median of `--repeats` rounds, the three methods in turn, the order rotated every round,
after one untimed compiling call each. x greedy: tokens per second over greedy decoding's in the
same cell. For the guarded runs, each round's decisions: speculative calls, plain calls, the call
after which speculation stopped, and the guard's speed estimate at the end.

`--misprice F` scales the calibration's v by F before the runs, so that the policy speculates
where it does not pay, as on the H200 (a price of 1.8 greedy steps an iteration for 2.6 measured).

A guard earns its place where the calibration's price is wrong (speculation slower than greedy
decoding: it should stop it, >= 0.97x greedy decoding over the run) and costs nothing where it is
right (speculation that pays: it should not stop it, the guarded run at the unguarded one's speed).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import adaptive_gamma, common
from gqa_spec.decoding import adaptive, autoregressive, calibration, guard
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length

METHODS = ('greedy', 'auto --no-guard', 'auto')


def measure(args: argparse.Namespace, on_cell=lambda rows: None) -> List[Dict[str, Any]]:
  L, gmax = args.max_decode_len, args.gamma_max
  rows = []
  for pair in adaptive_gamma.pairs_of(args):
    target, params = T5Decoder(pair['target_model']), pair['params']
    (draft_name, (draft, dinit)), = pair['drafts'].items()  # `--pair-drafts`: one
    for batch in adaptive_gamma._ints(args.batches):  # pylint: disable=protected-access
      batches = [(jnp.asarray(pair['inputs'][i:i + batch]), batch)
                 for i in range(0, args.examples, batch)]
      slots = cache_length(L, AdaptiveGamma(gamma_max=gmax, gamma_init=1).call_tokens)
      for temperature in [float(t) for t in args.temperatures.split(',')]:
        config = SamplingConfig(temperature=temperature)
        cal = calibration.measure_costs(
            target, target.init(params, batches[0][0], slots), draft, dinit(batches[0][0]), L,
            gmax, more=((target.init(params, e, slots), dinit(e)) for e, _ in batches[1:]),
            config=config)
        if args.misprice != 1.0:  # a calibration that prices iterations below their cost
          cal = cal._replace(verify_ratio=tuple(v * args.misprice for v in cal.verify_ratio))
        auto = AdaptiveGamma(gamma_max=gmax).calibrated(cal)

        def greedy_call(enc, n, rng, plain, config=config):
          del plain, n
          return jax.device_get(jax.block_until_ready(autoregressive.decode(
              target, target.init(params, enc, L + 1), rng, max_decode_len=L, config=config)))

        def auto_call(enc, n, rng, plain, config=config, auto=auto):
          del n  # full batches only
          policy = dataclasses.replace(auto, gamma_init=0) if plain else auto
          state = target.init(params, enc, cache_length(L, policy.call_tokens))
          return jax.device_get(jax.block_until_ready(adaptive.decode(
              target, state, draft, dinit(enc) if policy.speculates else None, rng,
              adaptive=policy, max_decode_len=L, config=config)))

        for call in (greedy_call, auto_call):  # compile, untimed (the first call `generate` makes)
          call(*batches[0], jax.random.PRNGKey(0), False)
        # as `generate`: the encoder pass on the first batch, at the run's slots
        auto_slots = cache_length(L, auto.call_tokens)
        call_seconds = guard.call_seconds(lambda: target.init(params, batches[0][0], auto_slots))
        make = {'greedy': lambda: (greedy_call, None),
                'auto --no-guard': lambda: (auto_call, None),
                'auto': lambda: (auto_call, guard.SpeculationGuard(cal.step_seconds, call_seconds)
                                 if auto.speculates else None)}
        seconds = {m: [] for m in METHODS}
        tokens = {m: [] for m in METHODS}
        decisions = []
        for r in range(args.repeats):
          for m in METHODS[r % 3:] + METHODS[:r % 3]:
            call, g = make[m]()
            results, s, _ = guard.decode_batches(call, batches, jax.random.PRNGKey(r), g)
            seconds[m].append(s)
            tokens[m].append(sum(int(np.sum(res.lengths)) for res, _ in results))
            if g is not None:
              decisions.append(g.to_dict())
        key = {'pair': pair['name'], 'draft': draft_name, 'batch': batch,
               'temperature': temperature, 'calls': len(batches)}
        speed = {m: np.median(np.array(tokens[m]) / np.array(seconds[m])) for m in METHODS}
        for m in METHODS:
          row = dict(key, method=m, seconds=float(np.median(seconds[m])),
                     seconds_rounds=seconds[m], tokens=int(np.median(tokens[m])),
                     x_greedy=float(speed[m] / speed['greedy']))
          if m != 'greedy':
            row.update(cost_ratio=cal.cost_ratio, verify_ratio=list(cal.verify_ratio),
                       alpha_init=cal.alpha, speculated=auto.speculates, misprice=args.misprice)
          if m == 'auto':
            row.update(guard_rounds=decisions, call_seconds=call_seconds)
          rows.append(row)
          common.print_row({k: v for k, v in row.items() if not isinstance(v, (list, dict))})
        on_cell(rows)
        jax.clear_caches()
  return rows


def _decisions(row: Dict[str, Any]) -> str:
  """A guarded row's rounds: speculative + plain calls, and where it stopped."""
  if not row.get('guard_rounds'):
    return '' if row['method'] != 'auto' else 'no speculation (calibration)'
  return (f'call {row["call_seconds"] * 1e3:.0f} ms: ' if 'call_seconds' in row else '') + '; '.join(
      f'{d["speculative_calls"]}+{d["plain_calls"]}'
      + (f' stop@{d["stopped_after_call"]}' if d['stopped_after_call'] else '')
      + (f' ({d["speed"]:.2f}x)' if d['speed'] is not None else '') for d in row['guard_rounds'])


def markdown(result: Dict[str, Any]) -> List[str]:
  cells = [(r['pair'], r['draft'], r['batch'], r['temperature'], r['calls'], r['method'],
            f'{r["seconds"]:.3f}', r['tokens'], f'{r["x_greedy"]:.3f}', _decisions(r))
           for r in result['rows']]
  return common.table_report(
      "--gamma auto's guard over whole runs", result,
      f'Each run: {result["examples"]} inputs in `calls` batches (guard.decode_batches, as '
      '`generate`); seconds: the timed calls, median of '
      f'{result["repeats"]} rounds (methods in turn, order rotated); x greedy: tokens/s over '
      "greedy decoding's in the cell; guard: per round, speculative + plain calls, stop@N: "
      'speculation stopped after call N, and the guard\'s speed estimate at the end; call: the '
      "encoder pass the guard adds to each call's greedy-equivalent seconds until a plain call is "
      'timed (`guard.call_seconds`).',
      ['pair', 'draft', 'batch', 'T', 'calls', 'method', 'seconds', 'tokens', 'x greedy', 'guard'],
      cells) + common.result_load_note(
          result, ': the machine was shared with other jobs; ratios within a cell were measured '
                  'side by side, absolute times are not representative.')


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  adaptive_gamma.add_pair_arguments(
      p, 'a trained pair and the task whose test inputs it decodes (repeatable)', required=True)
  p.add_argument('--pair-drafts', default='draft', choices=('draft', 'bigram', 'copy'),
                 help="each pair's draft: its DRAFT model, a bigram fitted on its task's training "
                      'targets, or copy (prompt lookup)')
  p.add_argument('--misprice', type=float, default=1.0, metavar='F',
                 help="multiply the calibration's v by F before the runs: a calibration that "
                      'prices an iteration at F times its cost, as the H200 run in '
                      'results/gpu/adaptive_smoke_2026-11-27 did (1.8 / 2.6 = 0.69)')
  p.add_argument('--examples', type=int, default=32, help='inputs per run')
  p.add_argument('--batches', default='1,8')
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--gamma-max', type=int, default=8)
  p.add_argument('--max-decode-len', type=int, default=32)
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--repeats', type=int, default=5)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  if not args.misprice > 0:
    p.error(f'--misprice must be > 0, got {args.misprice}')
  if any(args.examples % b for b in adaptive_gamma._ints(args.batches)):  # pylint: disable=protected-access
    p.error('--examples must be a multiple of every batch size')
  args.gammas = str(args.gamma_max)  # what `pairs_of` reads
  before = os.getloadavg()

  def write(rows, complete):
    result = common.results(__file__, argv, rows, before, repeats=args.repeats,
                            examples=args.examples, complete=complete)
    common.write_report(args.out, result, markdown(result))

  write(measure(args, lambda rows: write(rows, False)), True)
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
