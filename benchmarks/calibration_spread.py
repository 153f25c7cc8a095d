"""How much `--gamma auto`'s calibration moves between runs on the same input, by timing schedule.

  python -m benchmarks.calibration_spread --target DIR --draft DIR --task TASK --data-dir DIR \
      [--batch 1] [--temperature 0] [--runs 3] [--gamma-max 8] [--max-decode-len 32] \
      [--out results/benchmarks/calibration_spread]

`calibration.measure_costs` on the task's first `--batch` test inputs (the next ones, up to 8 inputs
in all, for its starting alpha), `--runs` times under each schedule of its second stage, the
schedules alternating (ABBA: each goes first, and compiles after the caches are cleared, every other
run):
  interleaved  the library's: the unit (a step of autoregressive decoding) and the loop at every
               compiled width in rounds, each once per round, the fastest of 3 rounds each
               (`timing.interleaved_per_iteration`);
  blocked      the earlier form, reproduced here: each of them timed alone, its 3 runs one after
               another (`timing.per_iteration` each), the unit first.
Each row is one calibration: c, v(1)..v(gamma_max) in steps of autoregressive decoding, alpha, the
seconds it took. The summary gives, per schedule and gamma, max/min of v(gamma) across the runs:
how far two calibrations of the same batch can disagree.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from benchmarks.adaptive_gamma import task_inputs
from gqa_spec.decoding import calibration, speculative, timing
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length

SCHEDULES = ('interleaved', 'blocked')


def blocked(runs: Sequence[Any], repeats: int = 3) -> List[float]:
  """The earlier schedule: each call timed alone, `timing.per_iteration` one after another."""
  return [timing.per_iteration(run, repeats) for run in runs]


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  L, gmax, b = args.max_decode_len, args.gamma_max, args.batch
  target_model, params = workloads.checkpoint_model(args.target)
  draft_model, dparams = workloads.checkpoint_model(args.draft)
  target, draft = T5Decoder(target_model), ModelDraft.t5(draft_model)
  inputs = task_inputs(args.task, args.data_dir, max(8, b), args.input_length, L)
  encs = [jnp.asarray(inputs[i:i + b]) for i in range(0, len(inputs) - b + 1, b)]
  slots = cache_length(L, gmax + 1)
  states = [(target.init(params, enc, slots), draft.init(dparams, enc, L, gmax)) for enc in encs]
  config = SamplingConfig(temperature=args.temperature)
  library = timing.interleaved_per_iteration
  rows = []
  for run in range(args.runs):
    for schedule in SCHEDULES[::1 if run % 2 == 0 else -1]:  # ABBA: each first every other run
      timing.interleaved_per_iteration = library if schedule == 'interleaved' else blocked
      try:
        t0 = time.perf_counter()
        (tstate, dstate), more = states[0], iter(states[1:])
        cal = calibration.measure_costs(target, tstate, draft, dstate, L, gmax, more=more,
                                        config=config)
        seconds = time.perf_counter() - t0
      finally:
        timing.interleaved_per_iteration = library
      row = {'schedule': schedule, 'run': run, 'cost_ratio': cal.cost_ratio,
             'verify_ratio': list(cal.verify_ratio), 'alpha': cal.alpha, 'seconds': seconds}
      common.print_row(row)
      rows.append(row)
    jax.clear_caches()
  return rows


def spread(rows: List[Dict[str, Any]], schedule: str) -> np.ndarray:
  """`[gamma_max]` max/min of v(gamma) across `schedule`'s runs."""
  v = np.asarray([r['verify_ratio'] for r in rows if r['schedule'] == schedule])  # [runs, G]
  return v.max(axis=0) / v.min(axis=0)


def markdown(result: Dict[str, Any]) -> List[str]:
  rows = result['rows']
  cells = [(r['schedule'], r['run'], f'{r["cost_ratio"]:.3f}',
            ' '.join(f'{x:.2f}' for x in r['verify_ratio']), f'{r["alpha"]:.2f}',
            f'{r["seconds"]:.0f}') for r in rows]
  lines = common.table_report(
      '--gamma auto calibration: spread between runs by timing schedule', result,
      'The same batch calibrated repeatedly (`calibration.measure_costs`), the schedules '
      'alternating (ABBA); c and v in steps of autoregressive decoding at the temperature '
      'given; seconds: the calibration\'s, compiles included (the caches are cleared after each '
      'pair of runs: the first of each pair compiles).',
      ['schedule', 'run', 'c', 'v(1)..v(gamma_max)', 'alpha', 'seconds'], cells)
  lines += ['', '| schedule | max/min of v(1)..v(gamma_max) over the runs | median | largest |',
            '|---|---|---|---|']
  for s in SCHEDULES:
    x = spread(rows, s)
    lines.append(f'| {s} | {" ".join(f"{v:.2f}" for v in x)} | {np.median(x):.2f} | '
                 f'{np.max(x):.2f} |')
  return lines + common.result_load_note(result)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--target', required=True)
  parser.add_argument('--draft', required=True)
  parser.add_argument('--task', required=True)
  parser.add_argument('--data-dir', required=True)
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--runs', type=int, default=3)
  parser.add_argument('--gamma-max', type=int, default=8)
  parser.add_argument('--max-decode-len', type=int, default=32)
  parser.add_argument('--input-length', type=int, default=64)
  return common.measure_and_write(__file__, parser, argv, measure, markdown)


if __name__ == '__main__':
  raise SystemExit(main())
