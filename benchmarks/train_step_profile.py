"""Per-op profile of the jitted train step, by op category (matmul / elementwise / reduction / ...).

  python -m benchmarks.train_step_profile [--setting pretrain] [--dropout 0.1] [--repeats 3] \
      [--out results/benchmarks/train_step_profile]

The `mini` train step of a `train_throughput.py` setting (synthetic packed batches of its shapes;
`--dropout` overrides the setting's rate), compiled for this machine and run `--repeats` times under
`jax.profiler.trace`; `op_profile.py` sums the per-thunk durations per HLO instruction and
categorises them. Beside it: XLA's cost analysis (FLOPs, bytes accessed) and the stated FLOPs of
`workloads.model_flops`, so the matmul time can be read against the matmul peak measured in
the same process.
"""

from __future__ import annotations

import argparse
import functools
import json
import os

import jax

from benchmarks import common, op_profile, workloads
from gqa_spec.models.config import preset
from gqa_spec.training import train_step as ts


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--setting', default='pretrain', choices=sorted(workloads.SETTINGS))
  p.add_argument('--dropout', type=float, default=None, help='override the setting\'s dropout')
  p.add_argument('--repeats', type=int, default=3)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  batch, enc_len, dec_len, dropout, pretrain = workloads.SETTINGS[args.setting]
  dropout = dropout if args.dropout is None else args.dropout
  config = preset('mini').replace(dropout_rate=dropout)
  step_fn = workloads.train_step(config, pretrain)
  state = step_fn.init(jax.random.PRNGKey(0))
  [batch_arrays] = workloads.train_batches(step_fn, batch, enc_len, dec_len)
  load_before = os.getloadavg()
  fn = functools.partial(ts._train_step, config=config, tx=step_fn.tx,  # pylint: disable=protected-access
                         learning_rate_fn=step_fn.learning_rate_fn, z_loss=step_fn.z_loss,
                         loss_normalizing_factor=None, dropout_seed=0)
  result = op_profile.profile(fn, (state, batch_arrays), args.repeats)
  stated = workloads.model_flops(config, batch, enc_len, dec_len)
  peak = max(common.matmul_rate(1024, 1024, 1024),
             common.matmul_rate(batch * max(enc_len, dec_len), config.emb_dim, config.mlp_dim))
  result.update({
      'command': common.command(__file__, argv), 'setting': args.setting, 'dropout': dropout,
      'shapes': f'batch {batch} x {enc_len}/{dec_len}', 'stated_gflop': stated / 1e9,
      'matmul_peak_gflop_s': peak / 1e9,
      'matmul_ms_at_peak': stated / peak * 1e3,
      'loadavg_before_after': [load_before, os.getloadavg()], 'machine': common.machine()})
  common.write_json(args.out, result)
  load = result['loadavg_before_after']
  note = (f'`mini`, {args.setting} shapes ({result["shapes"]}), dropout {dropout}, synthetic '
          f'batch, {args.repeats} profiled runs. Stated FLOPs {result["stated_gflop"]:.1f} GFLOP; '
          f'measured matmul peak {result["matmul_peak_gflop_s"]:.1f} GFLOP/s, so the stated '
          f'matmuls alone need {result["matmul_ms_at_peak"]:.0f} ms at peak. XLA cost analysis: '
          f'{(result["xla_flops"] or 0) / 1e9:.1f} GFLOP, '
          f'{(result["xla_bytes_accessed"] or 0) / 2 ** 30:.2f} GiB accessed. '
          + common.load_note(*load, ' (shared machine: absolute ms are contaminated, shares less '
                             'so).', ' (no other jobs; the load is this sequence of benchmarks).'))
  common.write_lines(args.out + '.md', op_profile.markdown('Train step: per-op profile',
                                                           result['command'], result, note))
  print(json.dumps({k: result[k] for k in ('wall_ms', 'thunk_total_ms', 'by_category_ms',
                                            'matmul_ms_at_peak')}, indent=1))


if __name__ == '__main__':
  main()
