"""What `--gamma auto` costs a call where it decides not to speculate, beside greedy decoding.

  python -m benchmarks.plain_path [--preset mini] [--batches 1,8] [--length 32] [--rounds 300] \
      [--out results/benchmarks/plain_path]

Why: where the calibration says no proposal pays, `adaptive.decode` is greedy decoding's loop
(`plain_steps.plain_decode`) with its length statistics (`gamma_histogram`, `gamma_trace`). With
the statistics in a second small program (1ef574d) that path ran ~0.2 ms a call slower than greedy
decoding on an H200 at batch 1 (0.92x-0.95x on the smoke pair's 2-3 ms calls,
results/benchmarks/guard_gpu_bigram.md, adaptive_gamma_gpu_bigram.md). This splits the call: each
variant decodes a random-init `--preset` target for exactly `--length` tokens (EOS never ends a
row), the variants called in turn, `--rounds` rounds; each row is the median of the variant's
seconds and the median, over rounds, of its difference from greedy decoding in the same round.

Variants:
  * greedy: `autoregressive.decode`;
  * auto: `adaptive.decode` with a policy that does not speculate (what `--gamma auto` runs; one
    program since the run above, `plain_steps.plain_decode`);
  * greedy + statistics: greedy decoding, then the statistics in a second jitted program (the
    form of 1ef574d);
  * greedy + identity: greedy decoding, then a jitted identity of `target_calls`: what any second
    program costs (its dispatch and the wait for it);
  * greedy + host: greedy decoding, then `target_calls` fetched and the statistics made in NumPy;
  * one program (closure): greedy decoding and the statistics in one `jax.jit` of a closure over
    the target and the length (the computation `auto`'s program holds, jitted another way).
On an H200 (results/gpu/adaptive_2026-11-28b) the closure measured +15 to +39 us and `auto`, once
it was one program itself, +221 to +255 us, each in its own place of the rotation: which of the
two differences (the place, the way it is jitted, `adaptive.decode`'s Python) costs the time is
open. `--shuffle` calls the variants in a new random order every round (seeded), so that no
variant always follows the same one.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from gqa_spec.decoding import adaptive, autoregressive, plain_steps, sampling
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models.config import preset
from gqa_spec.models.t5 import Transformer

GAMMA_MAX = 8
# Costs under which not even alpha_init's proposal pays (`AdaptiveGamma.speculates` is False).
NO_SPECULATION = AdaptiveGamma(gamma_max=GAMMA_MAX, cost_ratio=2.0,
                               verify_ratio=(1.5,) * GAMMA_MAX, alpha_init=0.1)


def variants(target: T5Decoder, state: Any, length: int) -> Dict[str, Callable[[], Any]]:
  """The variants' names -> a call each (its result's arrays are what is waited for)."""
  rng, greedy = jax.random.PRNGKey(0), sampling.GREEDY
  assert not NO_SPECULATION.speculates
  stats = jax.jit(lambda calls: plain_steps.length_statistics(calls, None, GAMMA_MAX, length))
  decode = lambda: autoregressive.decode(target, state, rng, max_decode_len=length, eos_id=-1)

  def host():
    r = decode()
    calls = np.asarray(r.target_calls)  # [b]
    histogram = np.zeros((calls.shape[0], GAMMA_MAX + 1), np.int32)
    histogram[:, 0] = calls
    trace = np.where(np.arange(length)[None] < calls[:, None], 0, -1).astype(np.int32)
    return r, histogram, trace

  identity = jax.jit(lambda x: x + 0)

  @jax.jit
  def one_program(s, key):
    r = autoregressive.decode(target, s, key, max_decode_len=length, eos_id=-1)
    return r, *plain_steps.length_statistics(r.target_calls, None, GAMMA_MAX, length)

  return {
      'greedy': decode,
      'auto': lambda: adaptive.decode(target, state, None, None, rng, adaptive=NO_SPECULATION,
                                      max_decode_len=length, config=greedy, eos_id=-1),
      'greedy + statistics': lambda: (lambda r: (r, *stats(r.target_calls)))(decode()),
      'greedy + identity': lambda: (lambda r: (r, identity(r.target_calls)))(decode()),
      'greedy + host': host,
      'one program (closure)': lambda: one_program(state, rng),
  }


def measure(args, on_row: Callable[[List[Dict[str, Any]]], None] = lambda rows: None):
  model = Transformer(preset(args.preset))
  params = workloads.random_params(model)
  target = T5Decoder(model)
  rows = []
  for batch in [int(b) for b in args.batches.split(',')]:
    enc = jnp.asarray(workloads.synthetic_inputs(batch, args.input_length,
                                                 model.config.vocab_size, seed=0))
    state = target.init(params, enc, args.length + 1)  # greedy decoding's allocation
    runs = variants(target, state, args.length)
    for fn in runs.values():
      jax.block_until_ready(fn())  # compiles
    times = {name: [] for name in runs}
    names = list(runs)
    order = np.random.default_rng(0)
    for r in range(args.rounds):  # the order rotated (or shuffled) every round
      for name in (list(order.permutation(names)) if args.shuffle else
                   names[r % len(names):] + names[:r % len(names)]):
        t0 = time.perf_counter()
        jax.block_until_ready(runs[name]())
        times[name].append(time.perf_counter() - t0)
    greedy = np.asarray(times['greedy'])
    for name in names:
      t = np.asarray(times[name])
      rows.append({'batch': batch, 'variant': name, 'median_ms': float(np.median(t)) * 1e3,
                   'over_greedy_us': float(np.median(t - greedy)) * 1e6,
                   'spread_ms': [float(np.percentile(t, q)) * 1e3 for q in (10, 90)]})
      common.print_row({k: v for k, v in rows[-1].items() if k != 'spread_ms'})
    on_row(rows)
  return rows


def write(args, argv, rows, load_before) -> None:
  results = common.results(__file__, argv, rows, load_before, length=args.length,
                           rounds=args.rounds, preset=args.preset, shuffle=args.shuffle)
  common.write_json(args.out, results)
  lines = [*common.heading("`--gamma auto`'s call where it does not speculate, against greedy "
                           'decoding', results['command']),
           f'Backend {jax.default_backend()}. Random-init `{args.preset}` target, '
           f'{args.input_length} input tokens, {args.length} tokens decoded a call; '
           f'{args.rounds} rounds, the variants in turn ('
           + ('a new random order every round' if args.shuffle else 'the order rotated every round')
           + '; see the module docstring); "over greedy" is the median over rounds of the call\'s '
           'time minus greedy decoding\'s in the same round. '
           + common.load_note(load_before, os.getloadavg(),
                              ' (the machine was shared with other jobs).'), '',
           *common.table_head(['batch', 'variant', 'median ms', 'over greedy us',
                               '10th-90th percentile ms'])]
  for r in rows:
    lines.append(f'| {r["batch"]} | {r["variant"]} | {r["median_ms"]:.3f} | '
                 f'{r["over_greedy_us"]:+.0f} | {r["spread_ms"][0]:.3f}-{r["spread_ms"][1]:.3f} |')
  common.write_markdown(args.out + '.md', lines, results['machine'])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--preset', default='mini', help='the random-init target (models/presets.py)')
  p.add_argument('--batches', default='1,8')
  p.add_argument('--length', type=int, default=32, help='tokens decoded a call')
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--rounds', type=int, default=300)
  p.add_argument('--shuffle', action='store_true',
                 help='a random order of the variants every round (default: rotated)')
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  load_before = os.getloadavg()
  measure(args, lambda rows: write(args, argv, rows, load_before))


if __name__ == '__main__':
  main()
