"""Compile and run time of a speculative loop with XLA's default vs fast-compile options.

  python -m benchmarks.xla_options [--repeats 3] [--runs 5]

The loop is the smoke preset's (`gqa_spec.reproduce.presets`): its target (2+2 layers) and draft
(1+1), random weights, a batch of 4 x 64 input tokens, 32 new tokens, gamma 1 and 3, greedy. Per
gamma and options (`gqa_spec.decoding.xla_options`: none, or `FAST_COMPILE`) it lowers and
compiles the loop `--repeats` times afresh (median) and times `--runs` runs of the compiled loop
(median). The two option sets alternate, so a change in the machine's load touches both. The
speculative stage of a reproduction compiles each loop once and runs it 1 + `speculative_repeats`
times (3 in smoke), which is what `stage_s` adds up.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Dict, List

import jax

from benchmarks import common
from gqa_spec.decoding import speculative, xla_options
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.models.t5 import Transformer
from gqa_spec.reproduce import presets
from gqa_spec.training.train_step import init_params

MAX_LEN, BATCH, INPUTS = 32, 4, 64


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  p = presets.PRESETS['smoke']()
  params = init_params(p.target, jax.random.PRNGKey(0))
  dparams = init_params(p.draft, jax.random.PRNGKey(1))
  enc = jax.random.randint(jax.random.PRNGKey(2), (BATCH, INPUTS), 2, 300)
  target, draft = T5Decoder(Transformer(p.target)), ModelDraft.t5(Transformer(p.draft))
  loop = speculative.decode.__wrapped__  # the undecorated loop: one fresh jit per compile
  statics = ('target', 'draft', 'gamma', 'max_decode_len')
  times: Dict[tuple, Dict[str, list]] = {}
  for gamma in args.gammas:
    tstate = target.init(params, enc, cache_length(MAX_LEN, gamma + 1))
    dstate = draft.init(dparams, enc, MAX_LEN, gamma)
    call = dict(gamma=gamma, max_decode_len=MAX_LEN)
    for _ in range(args.repeats):
      for name, options in (('default', None), ('fast', xla_options.FAST_COMPILE)):
        t = times.setdefault((gamma, name), {'lower_s': [], 'compile_s': [], 'run_ms': []})
        jax.clear_caches()  # a fresh trace, lowering and compile each time
        fn = jax.jit(loop, static_argnames=statics, compiler_options=options)
        t0 = time.perf_counter()
        lowered = fn.lower(target, tstate, draft, dstate, jax.random.PRNGKey(0), **call)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        t['lower_s'].append(t1 - t0)
        t['compile_s'].append(t2 - t1)
        args_ = (tstate, dstate, jax.random.PRNGKey(0))
        t['run_ms'].append(1e3 * common.median_seconds(lambda: compiled(*args_), args.runs))
  rows = []
  for (gamma, name), t in times.items():
    row = {'gamma': gamma, 'options': name, **{k: statistics.median(v) for k, v in t.items()}}
    row['stage_s'] = row['lower_s'] + row['compile_s'] + 3 * row['run_ms'] / 1e3
    common.print_row(row)
    rows.append(row)
  return rows


def markdown(result: Dict[str, Any]) -> List[str]:
  lines = common.table_report(
      "Speculative loop: XLA's default vs fast-compile options", result,
      "The smoke preset's speculative loop (target 2+2 layers, draft 1+1, batch 4 x 64 inputs, 32 "
      "new tokens, greedy), compiled with XLA:CPU's default options and with "
      '`xla_options.FAST_COMPILE` (LLVM optimisation off, no fusion emitters). `stage s`: lower + '
      'compile + 3 runs, what the speculative stage spends per loop. Medians; the two option sets '
      'alternate.',
      ['gamma', 'options', 'lower s', 'compile s', 'run ms', 'stage s'],
      [[r['gamma'], r['options'], f"{r['lower_s']:.2f}", f"{r['compile_s']:.2f}",
        f"{r['run_ms']:.1f}", f"{r['stage_s']:.2f}"] for r in result['rows']])
  lines += common.result_load_note(result)
  return lines


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--gammas', type=lambda s: [int(x) for x in s.split(',')], default=[1, 3])
  p.add_argument('--repeats', type=int, default=3, help='fresh compiles per (gamma, options)')
  p.add_argument('--runs', type=int, default=5, help='timed runs of each compiled loop')
  return common.measure_and_write(__file__, p, argv, measure, markdown)


if __name__ == '__main__':
  raise SystemExit(main())
