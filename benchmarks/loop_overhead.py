"""Per-iteration overhead of the decode loops: a `lax.while_loop` with a data-dependent condition
(as `autoregressive.decode`) vs the same steps in chunks of a static trip count (`loop_chunk`).

  python -m benchmarks.loop_overhead [--preset nano] [--steps 16,32,64,128] [--chunks 1,8] \
      [--dtype bfloat16 --param-dtype bfloat16] [--out results/benchmarks/loop_overhead]

Two measurements, each a least-squares line `time = intercept + slope * steps` over `--steps`:
  * empty loops: a while loop whose body only counts (and updates one `[b]` vector), its condition
    read from the loop state, vs `lax.fori_loop` over the same count: the slope is the loop
    machinery's own cost per iteration (on XLA:GPU the while loop's condition goes to the host
    every iteration; the static trip count does not);
  * decode: greedy batch-1 decoding of a random-init `--preset` model for exactly `steps` tokens
    (EOS suppressed; one cache of max(steps) + 1 slots for every count), per `--chunks` K: the
    slope is the per-token step time, the intercept the fixed cost of a call (launch, result
    transfer).
Run it with `XLA_FLAGS=--xla_gpu_enable_command_buffer=...` to measure XLA:GPU command buffers
(`benchmarks/gpu.sh` part `loop-overhead` does both); the flags in force are recorded.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.decode_roofline import decode_state, random_decoder
from gqa_spec.decoding import autoregressive


def fit(steps, seconds):
  """(intercept s, slope s per step) of a least-squares line."""
  slope, intercept = np.polyfit(np.asarray(steps, float), np.asarray(seconds, float), 1)
  return float(intercept), float(slope)


@jax.jit
def _while(n, x):
  def body(s):
    i, v = s
    return i + 1, v * 0.5 + 1.0  # [b]
  return jax.lax.while_loop(lambda s: s[0] < n, body, (jnp.zeros((), jnp.int32), x))[1]


def _fori(n: int):
  return jax.jit(lambda x: jax.lax.fori_loop(0, n, lambda _, v: v * 0.5 + 1.0, x))


def measure(args) -> list:
  steps = [int(s) for s in args.steps.split(',')]
  rows = []
  x = jnp.ones((8,), jnp.float32)
  for kind in ('while', 'fori'):
    times = []
    for n in steps:
      fn = (lambda n=n: _while(jnp.int32(n), x)) if kind == 'while' else (
          lambda f=_fori(n): f(x))
      times.append(common.median_seconds(fn, args.repeats, warmup=2))
    intercept, slope = fit(steps, times)
    rows.append({'what': f'empty {kind} loop', 'chunk': None, 'steps': steps,
                 'seconds': times, 'intercept_ms': intercept * 1e3, 'slope_us': slope * 1e6})
    common.print_row(rows[-1])
  dec, params = random_decoder(args.preset, None, args.dtype, args.param_dtype)
  # One cache length for every step count: each step attends over the whole allocation, so a
  # cache sized per count would make the step itself grow with the count.
  state = decode_state(dec, params, args.input_length, 1, max(steps))
  for chunk in (int(c) for c in args.chunks.split(',')):
    times = []
    for n in steps:
      run = lambda st=state, n=n: autoregressive.decode(
          dec, st, jax.random.PRNGKey(0), max_decode_len=n, eos_id=-1, loop_chunk=chunk)
      times.append(common.median_seconds(run, args.repeats))
    intercept, slope = fit(steps, times)
    rows.append({'what': f'{args.preset} greedy decode, batch 1', 'chunk': chunk, 'steps': steps,
                 'seconds': times, 'intercept_ms': intercept * 1e3, 'slope_us': slope * 1e6})
    common.print_row(rows[-1])
  return rows


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--preset', default='nano')
  p.add_argument('--steps', default='16,32,64,128')
  p.add_argument('--chunks', default='1,8', help='loop_chunk values (1: the plain while loop)')
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--repeats', type=int, default=7)
  common.add_dtype_argument(p)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  load_before = os.getloadavg()
  rows = measure(args)
  flags = os.environ.get('XLA_FLAGS', '')
  results = common.results(__file__, argv, rows, load_before, xla_flags=flags,
                           dtype=args.dtype, param_dtype=args.param_dtype)
  common.write_json(args.out, results)
  lines = [*common.heading('Decode loop overhead: while loop vs static-trip-count chunks',
                           results['command']),
           f'Backend {jax.default_backend()}, XLA_FLAGS `{flags or "(none)"}`. Each time is the '
           f'median of {args.repeats} calls; intercept and slope are a least-squares line over '
           f'{args.steps} steps (decode: batch 1, {args.input_length} input tokens, '
           f'{args.dtype} activations, {args.param_dtype or "float32"} parameters). '
           + common.load_note(load_before, os.getloadavg(),
                              ' (the machine was shared with other jobs).'), '',
           *common.table_head(['loop', 'chunk', 'intercept ms', 'per step us', 'ms at each step count'])]
  for r in rows:
    lines.append(f'| {r["what"]} | {r["chunk"] or "-"} | {r["intercept_ms"]:.3f} | '
                 f'{r["slope_us"]:.1f} | {" / ".join(f"{t * 1e3:.2f}" for t in r["seconds"])} |')
  common.write_markdown(args.out + '.md', lines, results['machine'])


if __name__ == '__main__':
  main()
