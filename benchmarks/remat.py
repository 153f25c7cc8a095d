"""Train-step memory and speed per remat policy (`T5Config.remat_policy`).

  python -m benchmarks.remat [--size mini --batch 16 --inputs 128 --targets 128 --repeats 5]

For each policy ('none', 'minimal', 'full') and layer layout this compiles the Adafactor train step
(`train_step._train_step`) and reads XLA's `compiled.memory_analysis()`: the peak is arguments +
outputs - aliased + temporaries (the activations the backward pass keeps live among them). Then
it runs the compiled step on random parameters and synthetic packed batches and reports the median
of `--repeats` steps as target tokens per second. Remat trades recomputation (slower steps) for
temporaries (a larger batch fits).
"""

from __future__ import annotations

import argparse
import functools
import os
from typing import Any, Dict, List

import jax

from benchmarks import common, workloads
from gqa_spec.models.config import REMAT_POLICIES, preset
from gqa_spec.training import train_step as ts


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  rows = []
  for scan in (True, False):
    for policy in REMAT_POLICIES:
      config = preset(args.size, scan_layers=scan, remat_policy=policy)
      step = workloads.train_step(config, pretrain=True)
      [batch] = workloads.train_batches(step, args.batch, args.inputs, args.targets)
      fn = jax.jit(functools.partial(
          ts._train_step, config=config, tx=step.tx,  # pylint: disable=protected-access
          learning_rate_fn=step.learning_rate_fn, z_loss=1e-4, loss_normalizing_factor=None,
          dropout_seed=0))
      state = step.init(jax.random.PRNGKey(0))
      compiled = fn.lower(state, batch).compile()
      mem = compiled.memory_analysis()
      peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
              + mem.temp_size_in_bytes)
      seconds = common.median_seconds(lambda: compiled(state, batch), args.repeats)
      row = {'layout': 'scanned' if scan else 'unrolled', 'remat_policy': policy,
             'temp_mib': mem.temp_size_in_bytes / 2**20, 'peak_mib': peak / 2**20,
             'step_s': seconds, 'target_tokens_per_s': args.batch * args.targets / seconds}
      common.print_row(row)
      rows.append(row)
  return rows


def markdown(result: Dict[str, Any]) -> List[str]:
  lines = common.table_report(
      'Remat policies: train-step memory and speed', result,
      f"`{result['size']}` preset, batch {result['batch']} x {result['inputs']} input / "
      f"{result['targets']} target tokens, Adafactor, float32. Peak: XLA's compiled memory "
      'analysis (arguments + outputs - aliased + temporaries); speed: median step.',
      ['layout', 'remat_policy', 'temporaries MiB', 'peak MiB', 'step s', 'target tokens/s'],
      [[r['layout'], r['remat_policy'], f"{r['temp_mib']:.0f}", f"{r['peak_mib']:.0f}",
        f"{r['step_s']:.3f}", f"{r['target_tokens_per_s']:.0f}"] for r in result['rows']])
  lines += common.result_load_note(result, ': the machine was shared with other jobs, so the step '
                                   'times are noisy (the memory figures are not).')
  return lines


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--size', default='mini')
  p.add_argument('--batch', type=int, default=16)
  p.add_argument('--inputs', type=int, default=128)
  p.add_argument('--targets', type=int, default=128)
  p.add_argument('--repeats', type=int, default=5)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  before = os.getloadavg()
  result = common.results(__file__, argv, measure(args), before, size=args.size, batch=args.batch,
                          inputs=args.inputs, targets=args.targets)
  common.write_json(args.out, result)
  common.write_markdown(args.out + '.md', markdown(result), result['machine'])
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
