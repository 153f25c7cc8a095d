"""The train step on 8 devices as 1 process x 8 against 2 processes x 4 (JAX's multi-controller
runtime on localhost, gloo collectives): the cost of cross-process collectives, same 2x4 mesh.

  python -m benchmarks.multihost_train_step [--preset nano] [--batch 8] [--steps 10]

Each configuration runs in fresh child processes (`--child N I PORT`) with
`--xla_force_host_platform_device_count` 8 / N; a child compiles the step, runs two untimed steps
and then times `--steps` steps one by one (`jax.block_until_ready` after each) on synthetic
batches; the row is process 0's median. Virtual CPU devices share the machine's cores, so the
difference is the collectives' cost (gloo over localhost TCP against XLA's in-process all-reduce),
not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import List, Optional

from benchmarks import common

MESH = (2, 4)  # data x model


def _child(args: argparse.Namespace) -> None:
  n, i, port = args.child
  from gqa_spec import distributed  # pylint: disable=g-import-not-at-top
  if n > 1:
    distributed.initialize(f'localhost:{port}', n, i, timeout=120)
  import jax  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.config import preset  # pylint: disable=g-import-not-at-top
  from gqa_spec.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import optimizer  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.data import DatasetConfig, synthetic_batches  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.train_step import TrainStep  # pylint: disable=g-import-not-at-top
  config = preset(args.preset)
  step = TrainStep(config, optimizer.adafactor(), optimizer.rsqrt_decay(),
                   Partitioner.create(config, *MESH))
  data = DatasetConfig('synthetic', {'inputs': args.inputs, 'targets': args.targets},
                       batch_size=args.batch)
  local = args.batch // n
  batches = [step.partitioner.shard_batch(b) for b, _ in
             zip(synthetic_batches(data, local, vocab_size=config.vocab_size), range(4))]
  state = step.init(jax.random.PRNGKey(0))
  start = time.perf_counter()
  state, metrics = step(state, batches[0])
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - start
  for k in range(2):
    state, metrics = step(state, batches[k % 4])
  jax.block_until_ready(metrics)
  times = []
  for k in range(args.steps):
    start = time.perf_counter()
    state, metrics = step(state, batches[k % 4])
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  if i == 0:
    print(json.dumps({'processes': n, 'devices_per_process': 8 // n, 'mesh': f'{MESH[0]}x{MESH[1]}',
                      'step_ms_median': 1e3 * statistics.median(times),
                      'step_ms_min': 1e3 * min(times), 'first_step_s': compile_s,
                      'loss_last': float(jax.device_get(metrics['loss_sum']))}), flush=True)


def _port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _run(n: int, argv: List[str]) -> dict:
  port = _port()
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=f'--xla_force_host_platform_device_count={8 // n}')
  procs = [subprocess.Popen([sys.executable, '-m', 'benchmarks.multihost_train_step', *argv,
                             '--child', str(n), str(i), str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
           for i in range(n)]
  try:
    outs = [p.communicate(timeout=600)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  if any(p.returncode for p in procs):
    raise SystemExit(f'multihost_train_step: a {n}-process child failed')
  return json.loads(outs[0].strip().splitlines()[-1])


def _measure(args: argparse.Namespace) -> List[dict]:
  argv = ['--preset', args.preset, '--batch', str(args.batch), '--inputs', str(args.inputs),
          '--targets', str(args.targets), '--steps', str(args.steps)]
  rows = []
  for n in (1, 2):
    row = _run(n, argv)
    common.print_row(row)
    rows.append(row)
  return rows


def _markdown(result: dict) -> List[str]:
  rows = result['rows']
  cells = [(r['processes'], r['devices_per_process'], r['mesh'], f"{r['step_ms_median']:.1f}",
            f"{r['step_ms_min']:.1f}", f"{r['first_step_s']:.1f}") for r in rows]
  ratio = rows[1]['step_ms_median'] / rows[0]['step_ms_median']
  return common.table_report(
      'Train step: 1 process x 8 devices vs 2 processes x 4', result,
      f'Preset {result["preset"]}, batch {result["batch"]}, the same 2x4 mesh of 8 virtual CPU '
      f'devices; 2 processes take {ratio:.2f}x the one-process step time (cross-process '
      'collectives over gloo/TCP on localhost).',
      ('processes', 'devices each', 'mesh', 'step ms (median)', 'step ms (min)',
       'first step s (compile)'), cells) + common.result_load_note(result)


def main(argv: Optional[List[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='nano')
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--inputs', type=int, default=64)
  parser.add_argument('--targets', type=int, default=16)
  parser.add_argument('--steps', type=int, default=10)
  parser.add_argument('--child', type=int, nargs=3, default=None, metavar=('N', 'I', 'PORT'),
                      help=argparse.SUPPRESS)
  common.add_out_argument(parser, __file__)
  args = parser.parse_args(argv)
  if args.child:
    _child(args)
    return 0
  before = os.getloadavg()
  result = common.results(__file__, argv, _measure(args), before, preset=args.preset,
                          batch=args.batch)
  common.write_report(args.out, result, _markdown(result))
  return 0


if __name__ == '__main__':
  sys.exit(main())
