"""Static counts of the compiled train step: XLA's FLOPs and bytes accessed, scatters, copies.

  python -m benchmarks.train_step_hlo [--inputs 64 --targets 64 --dropout 0.1]

Prints one JSON line for the `mini` train step (batch 16, synthetic shapes) as compiled by XLA for
this machine: `cost_analysis()` FLOPs and bytes accessed, and how many `scatter`, `copy`,
`transpose` and plain (non-YNNPACK-fused) `dot` instructions the optimised HLO holds. To compare
versions without timing noise, run it as `PYTHONPATH=OTHER:. python -P -m benchmarks.train_step_hlo`
with another copy of `gqa_spec` in OTHER (`-P`: the working directory's `gqa_spec` does not come
first).
"""

from __future__ import annotations

import argparse
import functools
import json

import jax

import gqa_spec
from benchmarks import workloads
from gqa_spec.models.config import preset
from gqa_spec.training import train_step as ts


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--inputs', type=int, default=64)
  p.add_argument('--targets', type=int, default=64)
  p.add_argument('--dropout', type=float, default=0.1)
  args = p.parse_args(argv)
  config = preset('mini').replace(dropout_rate=args.dropout)
  step = workloads.train_step(config, pretrain=False)
  [batch] = workloads.train_batches(step, 16, args.inputs, args.targets)
  fn = jax.jit(functools.partial(ts._train_step, config=config, tx=step.tx,  # pylint: disable=protected-access
                                 learning_rate_fn=step.learning_rate_fn, z_loss=1e-4,
                                 loss_normalizing_factor=None, dropout_seed=0))
  compiled = fn.lower(step.abstract_state(), batch).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  text = compiled.as_text()
  print(json.dumps({'gqa_spec': gqa_spec.__file__, 'flops': cost.get('flops'),
                    'bytes_accessed': cost.get('bytes accessed'),
                    **{op: text.count(f' {op}(') for op in ('scatter', 'copy', 'transpose', 'dot')}}))


if __name__ == '__main__':
  main()
