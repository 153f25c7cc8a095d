"""Load-time cost of native checkpoints' integrity check (per-parameter CRC-32, `integrity.json`).

A checkpoint of the given model preset (T5.1.1-base by default; random float32 parameters) is
written once with `native.save_checkpoint`; then `native.load_checkpoint` runs with and without
`native.verify` (the without-case replaces it with a no-op), alternating, and reports medians. The
checksum alone (`native.checksums` over the loaded tree) and zlib's CRC-32 rate are measured
beside the memory bandwidth of a jitted sum (`common.bandwidth`), the rate a single pass over the
parameters cannot beat.

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
from gqa_spec.checkpoints import native
from gqa_spec.models.config import preset


def random_params(config):
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32),
                      native.abstract_params(config))


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
  verify = native.verify
  times = {'load_verified': [], 'load_unverified': [], 'checksums': []}
  with tempfile.TemporaryDirectory() as root:
    path = os.path.join(root, 'ckpt')
    native.save_checkpoint(path, config, params)
    del params
    native.load_checkpoint(path)  # warm: imports, page cache
    for r in range(args.repeats):
      for name in (('load_verified', 'load_unverified') if r % 2 == 0 else
                   ('load_unverified', 'load_verified')):
        native.verify = verify if name == 'load_verified' else (lambda *_: None)
        start = time.perf_counter()
        _, loaded, _ = native.load_checkpoint(path)
        jax.block_until_ready(loaded)
        times[name].append(time.perf_counter() - start)
      native.verify = verify
      start = time.perf_counter()
      native.checksums(jax.tree.map(np.asarray, loaded))
      times['checksums'].append(time.perf_counter() - start)
      del loaded
  medians = {k: statistics.median(v) for k, v in times.items()}
  row = {'preset': args.preset, 'parameter_bytes': nbytes,
         **{f'{k}_s': v for k, v in medians.items()},
         'overhead_s': medians['load_verified'] - medians['load_unverified'],
         'overhead_fraction': medians['load_verified'] / medians['load_unverified'] - 1,
         'crc32_bytes_per_s': nbytes / medians['checksums'],
         'memory_bandwidth_bytes_per_s': common.bandwidth()}
  common.print_row(row)
  report = common.results(__file__, argv, [row], load_before, repeats=args.repeats,
                          times=times)
  common.write_json(args.out, report)
  lines = markdown(report)
  common.write_markdown(args.out + '.md', lines, report['machine'])
  print('\n'.join(lines))


def markdown(report: dict) -> list:
  r = report['rows'][0]
  gb = 1e9
  lines = common.heading('Native checkpoint integrity: load-time cost of the CRC-32 check',
                         report['command'])
  lines += [f"T5.1.1-{r['preset']} parameters ({r['parameter_bytes'] / gb:.2f} GB float32, random) "
            f"written once; `native.load_checkpoint` with and without `native.verify`, "
            f"alternating, medians over {report['repeats']} repeats. "
            + common.load_note(*report['loadavg_before_after'],
                               ' (other jobs shared the machine: the figures are noisy).'), '']
  lines += common.table_head(('load, verified (s)', 'load, unverified (s)', 'overhead (s)',
                              'overhead', 'CRC-32 alone (s)', 'CRC-32 rate', 'memory bandwidth'))
  lines.append(f"| {r['load_verified_s']:.2f} | {r['load_unverified_s']:.2f} | "
               f"{r['overhead_s']:.2f} | {100 * r['overhead_fraction']:.0f}% | "
               f"{r['checksums_s']:.2f} | {r['crc32_bytes_per_s'] / gb:.2f} GB/s | "
               f"{r['memory_bandwidth_bytes_per_s'] / gb:.1f} GB/s |")
  lines += ['', 'The CRC-32 is one pass over the parameter bytes on one core (zlib); the memory '
                'bandwidth (a jitted sum, all cores) bounds any single pass from above.']
  return lines


if __name__ == '__main__':
  main()
