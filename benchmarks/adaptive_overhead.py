"""What `--gamma auto`'s loop costs beyond the fixed-gamma loop, per call and per iteration.

  python -m benchmarks.adaptive_overhead [--preset mini] [--batch 1] [--gamma 8] \
      [--lengths 16,32,64] [--methods greedy,speculative,fixed,onewidth,held,heuristic] \
      [--out results/benchmarks/adaptive_overhead]

Why: on an H200 (results/benchmarks/adaptive_gamma_gpu_smoke_bigram.md) `--gamma auto` held at
gamma 8 by the smoke pair's bigram ran at 2.6 greedy steps an iteration where the calibration,
which then timed the same loop under policy 'fixed', priced it at 1.77 and `speculative.decode` at
gamma 8 ran at 1.54: 0.59x of greedy decoding (the calibration now times the optimal policy's
own program, `adaptive.decode(held=...)`). A fixed cost per call and a cost per iteration read
alike in that table (about 15 iterations a call). This separates them: each method decodes a
random-init `--preset` target with a bigram draft (fitted on the target's own outputs) for exactly
`L` tokens (EOS never ends a row) at each of `--lengths`, and a least-squares line
`seconds = intercept + slope x loop iterations` over the lengths gives the call's fixed cost
(intercept) and an iteration's (slope). Methods (`--methods`, in this order; each costs a compile
per length, ~50 s of a GPU call's time: on an H200 a 156 s run measured 3 of the first 5,
results/gpu/guard_2026-11-28), all at `--gamma` where they hold one:
  * greedy: greedy decoding (`autoregressive.decode`; an iteration is a token), always measured
    (the unit of the greedy-steps column);
  * speculative: `speculative.decode` at gamma;
  * fixed: `adaptive.decode`, policy 'fixed' with traced `first_gammas` (the calibration's program
    until the H200 run above);
  * onewidth: the same with `AdaptiveGamma.one_width` (every proposal verified at gamma + 1
    tokens, one loop, as `speculative.decode`);
  * held: `adaptive.decode`, policy 'optimal' `held` at gamma (the calibration's program now): it
    makes the policy's choice every iteration (`batch_gamma`), does not take it, and proposes what
    the fixed one does;
  * heuristic: `adaptive.decode`, policy 'heuristic' (its draft lengths move; its own iteration
    count).
One target cache of max(lengths) + gamma + 1 slots for every length, so a step attends over the
same allocation whatever the length. The loops' outputs are not compared here (tests do that).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from benchmarks.loop_overhead import fit
from gqa_spec.decoding import adaptive, autoregressive, speculative
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.drafts import NgramDraft
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models.config import preset
from gqa_spec.models.t5 import Transformer


METHODS = ('greedy', 'speculative', 'fixed', 'onewidth', 'held', 'heuristic')


def methods(target, tstate, draft, dstate, batch: int, gamma: int):
  """`METHODS` key -> (the row's name, run(L) -> result with `loop_iterations`)."""
  rng = jax.random.PRNGKey(0)
  fixed = AdaptiveGamma(gamma_max=gamma, policy='fixed', gamma_init=gamma)
  optimal = AdaptiveGamma(gamma_max=gamma, cost_ratio=0.5, verify_ratio=(1.5,) * gamma,
                          alpha_init=0.7, prior_weight=adaptive.CALIBRATED_PRIOR_WEIGHT)
  held = np.ones((), bool)
  heuristic = AdaptiveGamma(gamma_max=gamma, policy='heuristic')
  first = jnp.full((batch,), gamma, jnp.int32)
  ad = lambda a, L, **kw: adaptive.decode(target, tstate, draft, dstate, rng, adaptive=a,
                                          max_decode_len=L, eos_id=-1, **kw)
  return {
      'greedy': ('greedy decoding', lambda L: autoregressive.decode(
          target, tstate, rng, max_decode_len=L, eos_id=-1)),
      'speculative': (f'speculative.decode, gamma {gamma}', lambda L: speculative.decode(
          target, tstate, draft, dstate, rng, gamma=gamma, max_decode_len=L, eos_id=-1)),
      'fixed': (f"auto, policy 'fixed' at {gamma}", lambda L: ad(fixed, L, first_gammas=first)),
      'onewidth': (f"auto, policy 'fixed' at {gamma}, one width", lambda L: ad(
          dataclasses.replace(fixed, one_width=True), L, first_gammas=first)),
      'held': (f"auto, policy 'optimal' held at {gamma} (the calibration's program)", lambda L: ad(
          optimal, L, first_gammas=first, held=held)),
      'heuristic': ("auto, policy 'heuristic'", lambda L: ad(heuristic, L)),
  }


def measure(args, on_row=lambda rows: None) -> list:
  """Every method's row; `on_row(rows so far)` after each."""
  lengths = [int(x) for x in args.lengths.split(',')]
  model = Transformer(preset(args.preset))
  params = workloads.random_params(model)
  target = T5Decoder(model)
  vocab = model.config.vocab_size
  enc = jnp.asarray(workloads.synthetic_inputs(args.batch, args.input_length, vocab, seed=0))
  tstate = target.init(params, enc, max(lengths) + args.gamma + 1)  # [b, S] encoded once
  draft = NgramDraft(vocab)
  dstate = draft.init(workloads.output_bigram(model, params, args.input_length, max(lengths)))
  # The hardware's floor beside the figures: one greedy step reads at least the decoder's weights.
  bw, weights = common.bandwidth(), workloads.tree_bytes(params['decoder'])
  args.floor = {'bandwidth_gb_s': bw / 1e9, 'decoder_param_mib': weights / 2 ** 20,
                'step_floor_us': weights / bw * 1e6}
  rows = []
  every = methods(target, tstate, draft, dstate, args.batch, args.gamma)
  for name, run in (every[key] for key in METHODS if key in args.methods.split(',')):
    iterations, times = [], []
    for L in lengths:
      iterations.append(int(jax.block_until_ready(run(L)).loop_iterations))
      times.append(common.median_seconds(lambda L=L: run(L), args.repeats))
    intercept, slope = fit(iterations, times)
    rows.append({'method': name, 'lengths': lengths, 'iterations': iterations, 'seconds': times,
                 'intercept_ms': intercept * 1e3, 'slope_us': slope * 1e6})
    rows[-1]['slope_steps'] = rows[-1]['slope_us'] / rows[0]['slope_us']  # in greedy steps
    common.print_row(rows[-1])
    on_row(rows)
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--preset', default='mini', help='the random-init target (models/presets.py)')
  p.add_argument('--batch', type=int, default=1)
  p.add_argument('--gamma', type=int, default=8, help='the held draft length (and gamma_max)')
  p.add_argument('--lengths', default='16,32,64', help='tokens decoded (max_decode_len)')
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--repeats', type=int, default=7)
  p.add_argument('--methods', default=','.join(METHODS),
                 help=f'which loops, comma-separated, of {",".join(METHODS)} (greedy always)')
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  unknown = set(args.methods.split(',')) - set(METHODS)
  if unknown:
    p.error(f'--methods: unknown {",".join(sorted(unknown))}; choose from {",".join(METHODS)}')
  args.methods = ','.join(['greedy'] + [m for m in args.methods.split(',') if m != 'greedy'])
  if len(args.lengths.split(',')) < 2:
    p.error('--lengths needs at least two lengths for a line')
  if args.gamma < 1:
    p.error('--gamma must be >= 1')
  load_before = os.getloadavg()
  # Rewritten after every method, so that a run cut short (a device call's clock) keeps its rows.
  measure(args, lambda rows: write(args, argv, rows, load_before))


def write(args, argv, rows, load_before) -> None:
  flags = os.environ.get('XLA_FLAGS', '')
  results = common.results(__file__, argv, rows, load_before, xla_flags=flags,
                           complete=len(rows) == len(args.methods.split(',')), **args.floor)
  common.write_json(args.out, results)
  lines = [*common.heading("`--gamma auto`'s loop against the fixed one: per call and per "
                           'iteration', results['command']),
           f'Backend {jax.default_backend()}, XLA_FLAGS `{flags or "(none)"}`. Random-init '
           f'`{args.preset}` target, bigram draft, batch {args.batch}, {args.input_length} input '
           f'tokens; each time the median of {args.repeats} calls; intercept (per call) and slope '
           f'(per loop iteration, also in greedy steps: over greedy decoding\'s slope) are a '
           f'least-squares line over the loop iterations of {args.lengths} tokens. The floor: '
           f'a greedy step reads the decoder\'s {args.floor["decoder_param_mib"]:.2f} MiB of '
           f'weights at the {args.floor["bandwidth_gb_s"]:.1f} GB/s measured here (a jitted '
           f'sum), {args.floor["step_floor_us"]:.1f} us from memory; '
           + (f'greedy decoding\'s {rows[0]["slope_us"]:.1f} us a step is below that: the weights '
              f'stay in cache at this size, and the loops are bound by their own work. '
              if rows[0]['slope_us'] < args.floor['step_floor_us'] else
              f'greedy decoding\'s step is {rows[0]["slope_us"] / args.floor["step_floor_us"]:.1f}x '
              f'that. ')
           + common.load_note(load_before, os.getloadavg(),
                              ' (the machine was shared with other jobs).'), '',
           *common.table_head(['method', 'per call ms', 'per iteration us',
                               'per iteration, greedy steps', 'iterations', 'ms each'])]
  for r in rows:
    lines.append(f'| {r["method"]} | {r["intercept_ms"]:.3f} | {r["slope_us"]:.1f} | '
                 f'{r["slope_steps"]:.2f} | {" / ".join(map(str, r["iterations"]))} | '
                 f'{" / ".join(f"{t * 1e3:.2f}" for t in r["seconds"])} |')
  if not results['complete']:
    lines += ['', f'**Partial**: the run stopped after {len(rows)} of the '
                  f'{len(args.methods.split(","))} methods.']
  common.write_markdown(args.out + '.md', lines, results['machine'])


if __name__ == '__main__':
  main()
