"""Two training jobs one after the other vs side by side in threads (the reproduction's `workers`).

  python -m benchmarks.side_by_side [--steps 100 --rounds 3]

The smoke preset's fine-tuning step (its target, 2+2 layers, dropout 0.1, Adafactor, batch 16 x
64/32 synthetic tokens), compiled once: two train states each take `--steps` steps, first one
after the other, then in two threads at once. The two orders alternate over `--rounds` rounds
(medians), so a change in the machine's load touches both. A step this small keeps about one core
busy (XLA:CPU's ops are too small to split), so on 2 cores two jobs side by side take less than
one after the other.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any, Dict, List

import jax

from benchmarks import common
from gqa_spec.partitioning import Partitioner
from gqa_spec.reproduce import presets
from gqa_spec.training import data, optimizer
from gqa_spec.training.train_step import TrainStep


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  p = presets.get('smoke')
  config = p.target.replace(dropout_rate=0.1)
  part = Partitioner.create(config)
  step = TrainStep(config, optimizer.adafactor(), optimizer.constant(p.finetune_learning_rate), part)
  lengths = p.finetune_lengths[presets.TRANSLATE]
  batch = part.shard_batch(next(data.get_batches(data.DatasetConfig(
      'synthetic', {'inputs': lengths[0], 'targets': lengths[1]}, batch_size=p.finetune_batch))))
  states = [step.init(jax.random.PRNGKey(i)) for i in range(2)]
  states = [step(s, batch)[0] for s in states]  # compiled
  jax.block_until_ready(states)

  def job(i: int) -> None:
    state, metrics = states[i], None
    for _ in range(args.steps):
      state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    states[i] = state

  def serial() -> float:
    t0 = time.perf_counter()
    job(0)
    job(1)
    return time.perf_counter() - t0

  def side_by_side() -> float:
    threads = [threading.Thread(target=job, args=(i,)) for i in range(2)]
    t0 = time.perf_counter()
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    return time.perf_counter() - t0

  times = {'one after the other': [], 'side by side': []}
  for _ in range(args.rounds):
    times['one after the other'].append(serial())
    times['side by side'].append(side_by_side())
  # The hardware's limits beside the figures: the step's work by XLA's cost analysis, and what this
  # machine's matmul and memory reach.
  cost = step._jitted.lower(states[0], batch).compile().cost_analysis()  # pylint: disable=protected-access
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  limits = {'step_gflop': cost['flops'] / 1e9, 'step_mb_accessed': cost['bytes accessed'] / 1e6,
            'matmul_gflops': common.matmul_rate(512, 512, 512) / 1e9,
            'bandwidth_gbs': common.bandwidth() / 1e9}
  medians = {name: statistics.median(ts) for name, ts in times.items()}
  rows = [{'order': name, 'jobs': 2, 'steps_per_job': args.steps, 'seconds': seconds,
           'ms_per_step': 1e3 * seconds / (2 * args.steps),
           'speedup': medians['one after the other'] / seconds,
           'gflops': 2 * args.steps * limits['step_gflop'] / seconds, **limits}
          for name, seconds in medians.items()]
  for row in rows:
    common.print_row(row)
  return rows


def markdown(result: Dict[str, Any]) -> List[str]:
  lines = common.table_report(
      'Two training jobs: one after the other vs side by side', result,
      "The smoke preset's fine-tuning step (target 2+2 layers, batch 16 x 64/32, dropout 0.1), two "
      'jobs of the same number of steps; medians over alternating rounds. `ms per step`: wall time '
      '/ all steps of both jobs.',
      ['order', 'steps per job', 'seconds', 'ms per step', 'speedup', 'GFLOP/s'],
      [[r['order'], r['steps_per_job'], f"{r['seconds']:.2f}", f"{r['ms_per_step']:.1f}",
        f"{r['speedup']:.2f}x", f"{r['gflops']:.1f}"] for r in result['rows']])
  r = result['rows'][0]
  lines += ['', f"Limits: one step is {r['step_gflop']:.2f} GFLOP and {r['step_mb_accessed']:.0f} MB "
            "accessed (XLA's cost analysis); on this machine a 512^3 float32 matmul runs at "
            f"{r['matmul_gflops']:.0f} GFLOP/s (both cores) and a jitted sum reads "
            f"{r['bandwidth_gbs']:.1f} GB/s. One job alone keeps about one core busy: its many "
            'small ops are not split across cores.']
  lines += common.result_load_note(result)
  return lines


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--steps', type=int, default=100, help='steps per job')
  p.add_argument('--rounds', type=int, default=3)
  return common.measure_and_write(__file__, p, argv, measure, markdown)


if __name__ == '__main__':
  raise SystemExit(main())
