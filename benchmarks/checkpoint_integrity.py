"""Load-time cost of checkpoint integrity checks: native checkpoints' per-parameter CRC-32
(`integrity.json`) and train-state checkpoints' per-array fingerprints (`checkpoints/integrity.py`).

A checkpoint of the given model preset (T5.1.1-base by default; random float32 parameters) is
written once each way: `native.save_checkpoint`, and a trainer `manager.Checkpointer` save of a
`TrainState` holding those parameters (no optimizer state, so both read the same bytes). Then each
is loaded with and without its verification (the without-case replaces `native.verify` or
`integrity.verify` with a no-op), alternating, and medians are reported. The check alone (CRC-32
of the loaded tree; the fingerprints) is timed beside the memory bandwidth of a jitted sum
(`common.bandwidth`), the rate a single pass over the parameters cannot beat.

  python -m benchmarks.checkpoint_integrity --preset base --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from benchmarks import common
from gqa_spec.checkpoints import integrity
from gqa_spec.checkpoints import manager
from gqa_spec.checkpoints import native
from gqa_spec.models.config import preset
from gqa_spec.training.train_step import TrainState


def random_params(config):
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32),
                      native.abstract_params(config))


def _alternate(repeats, load, set_verify, check, times):
  """Times `load()` verified and unverified (alternating order), and `check(loaded)` alone."""
  for r in range(repeats):
    for name in (('load_verified', 'load_unverified') if r % 2 == 0 else
                 ('load_unverified', 'load_verified')):
      set_verify(name == 'load_verified')
      start = time.perf_counter()
      loaded = load()
      jax.block_until_ready(loaded)
      times[name].append(time.perf_counter() - start)
    set_verify(True)
    start = time.perf_counter()
    check(loaded)
    times['check'].append(time.perf_counter() - start)
    del loaded


def _native(path, config, params, repeats):
  native.save_checkpoint(path, config, params)
  verify = native.verify
  times = {'load_verified': [], 'load_unverified': [], 'check': []}

  def set_verify(on):
    native.verify = verify if on else (lambda *_: None)

  native.load_checkpoint(path)  # warm: imports, page cache
  _alternate(repeats, lambda: native.load_checkpoint(path)[1], set_verify,
             lambda loaded: native.checksums(jax.tree.map(np.asarray, loaded)), times)
  return times


def _train_state(path, params, repeats):
  state = TrainState(step=jax.numpy.asarray(1, jax.numpy.int32), params=params, opt_state=())
  ckpt = manager.Checkpointer(path, save_period=1, asynchronous=False)
  ckpt.save(1, state, {'data_start_step': 0})
  ckpt.close()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = manager.abstract_with_shardings(jax.eval_shape(lambda: state),
                                           jax.tree.map(lambda _: device, state))
  del state
  verify = integrity.verify
  times = {'load_verified': [], 'load_unverified': [], 'check': []}

  def set_verify(on):
    integrity.verify = verify if on else (lambda *_: None)

  def load():
    ckpt = manager.Checkpointer(path)
    try:
      return ckpt.restore(1, target)[0]
    finally:
      ckpt.close()

  jax.block_until_ready(load())  # warm
  _alternate(repeats, load, set_verify, integrity.fingerprints, times)
  return times


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--preset', default='base')
  parser.add_argument('--repeats', type=int, default=5)
  common.add_out_argument(parser, __file__)
  args = parser.parse_args(argv)
  load_before = os.getloadavg()
  config = preset(args.preset)
  params = random_params(config)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
  bandwidth = common.bandwidth()
  rows, all_times = [], {}
  with tempfile.TemporaryDirectory() as root:
    for kind, measure in [
        ('native (CRC-32)', lambda: _native(os.path.join(root, 'native'), config, params,
                                            args.repeats)),
        ('train state (fingerprints)', lambda: _train_state(os.path.join(root, 'run'),
                                                            jax.device_put(params),
                                                            args.repeats))]:
      times = all_times[kind] = measure()
      medians = {k: statistics.median(v) for k, v in times.items()}
      rows.append({'kind': kind, 'preset': args.preset, 'parameter_bytes': nbytes,
                   **{f'{k}_s': v for k, v in medians.items()},
                   'overhead_s': medians['load_verified'] - medians['load_unverified'],
                   'overhead_fraction': medians['load_verified'] / medians['load_unverified'] - 1,
                   'check_bytes_per_s': nbytes / medians['check'],
                   'memory_bandwidth_bytes_per_s': bandwidth})
      common.print_row(rows[-1])
  report = common.results(__file__, argv, rows, load_before, repeats=args.repeats,
                          times=all_times)
  common.write_json(args.out, report)
  lines = markdown(report)
  common.write_markdown(args.out + '.md', lines, report['machine'])
  print('\n'.join(lines))


def markdown(report: dict) -> list:
  gb = 1e9
  first = report['rows'][0]
  lines = common.heading('Checkpoint integrity: load-time cost of the checks', report['command'])
  lines += [f"T5.1.1-{first['preset']} parameters ({first['parameter_bytes'] / gb:.2f} GB float32, "
            "random) written once as a native checkpoint and once as a trainer checkpoint (a "
            "`TrainState` of those parameters, no optimizer state); each loaded with and without "
            f"its verification, alternating, medians over {report['repeats']} repeats. "
            + common.load_note(*report['loadavg_before_after'],
                               ' (other jobs shared the machine: the figures are noisy).'), '']
  lines += common.table_head(('checkpoint (check)', 'load, verified (s)', 'load, unverified (s)',
                              'overhead (s)', 'overhead', 'check alone (s)', 'check rate',
                              'memory bandwidth'))
  for r in report['rows']:
    lines.append(f"| {r['kind']} | {r['load_verified_s']:.2f} | {r['load_unverified_s']:.2f} | "
                 f"{r['overhead_s']:.2f} | {100 * r['overhead_fraction']:.0f}% | "
                 f"{r['check_s']:.2f} | {r['check_bytes_per_s'] / gb:.2f} GB/s | "
                 f"{r['memory_bandwidth_bytes_per_s'] / gb:.1f} GB/s |")
  lines += ['', 'The CRC-32 is one pass over the parameter bytes on one core (zlib, on the host); the '
                'fingerprints of CPU arrays are one numpy pass on one core too (arrays on an '
                'accelerator are summed by XLA where their shards live); the memory bandwidth (a '
                'jitted sum, all cores) bounds any single pass from above.']
  return lines


if __name__ == '__main__':
  main()
