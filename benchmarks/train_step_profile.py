"""Per-op profile of the jitted train step, by op category (matmul / elementwise / reduction / ...).

  python benchmarks/train_step_profile.py [--setting pretrain] [--dropout 0.1] [--repeats 3] \
      [--out results/benchmarks/train_step_profile]

The `mini` train step of a `train_throughput.py` setting (synthetic packed batches of its shapes;
`--dropout` overrides the setting's rate), compiled for this machine and run `--repeats` times under
`jax.profiler.trace`; `op_profile.py` sums the per-thunk durations per HLO instruction and
categorises them. Beside it: XLA's cost analysis (FLOPs, bytes accessed) and the stated FLOPs of
`train_throughput.model_flops`, so the matmul time can be read against the matmul peak measured in
the same process.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import op_profile  # pylint: disable=g-import-not-at-top,wrong-import-position
from speculative import machine  # pylint: disable=g-import-not-at-top,wrong-import-position
from train_throughput import SETTINGS, _peak, model_flops  # pylint: disable=g-import-not-at-top,wrong-import-position

from gqa_spec.models.config import preset  # pylint: disable=wrong-import-position
from gqa_spec.training import optimizer  # pylint: disable=wrong-import-position
from gqa_spec.training.data import DatasetConfig, synthetic_batches  # pylint: disable=wrong-import-position
from gqa_spec.partitioning import Partitioner  # pylint: disable=wrong-import-position
from gqa_spec.training import train_step as ts  # pylint: disable=wrong-import-position
from gqa_spec.training.train_step import TrainStep  # pylint: disable=wrong-import-position


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--setting', default='pretrain', choices=sorted(SETTINGS))
  p.add_argument('--dropout', type=float, default=None, help='override the setting\'s dropout')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--out', default='results/benchmarks/train_step_profile')
  args = p.parse_args(argv)
  batch, enc_len, dec_len, dropout, pretrain = SETTINGS[args.setting]
  dropout = dropout if args.dropout is None else args.dropout
  config = preset('mini').replace(dropout_rate=dropout)
  lr = optimizer.rsqrt_decay(warmup_steps=500) if pretrain else optimizer.constant(1e-2)
  step_fn = TrainStep(config, optimizer.adafactor(), lr, Partitioner.create(config))
  state = step_fn.init(jax.random.PRNGKey(0))
  data = DatasetConfig('synthetic', {'inputs': enc_len, 'targets': dec_len}, batch_size=batch)
  batch_arrays = step_fn.partitioner.shard_batch(
      next(synthetic_batches(data, batch, vocab_size=config.vocab_size)))
  load_before = os.getloadavg()
  fn = functools.partial(ts._train_step, config=config, tx=step_fn.tx,  # pylint: disable=protected-access
                         learning_rate_fn=lr, z_loss=step_fn.z_loss,
                         loss_normalizing_factor=None, dropout_seed=0)
  result = op_profile.profile(fn, (state, batch_arrays), args.repeats)
  stated = model_flops(config, batch, enc_len, dec_len)
  peak = max(_peak(1024, 1024, 1024), _peak(batch * max(enc_len, dec_len), config.emb_dim,
                                             config.mlp_dim))
  result.update({
      'command': ' '.join(['python'] + sys.argv), 'setting': args.setting, 'dropout': dropout,
      'shapes': f'batch {batch} x {enc_len}/{dec_len}', 'stated_gflop': stated / 1e9,
      'matmul_peak_gflop_s': peak / 1e9,
      'matmul_ms_at_peak': stated / peak * 1e3,
      'loadavg_before_after': [load_before, os.getloadavg()], 'machine': machine()})
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  with open(args.out + '.json', 'w') as f:
    json.dump(result, f, indent=2)
  load = result['loadavg_before_after']
  note = (f'`mini`, {args.setting} shapes ({result["shapes"]}), dropout {dropout}, synthetic '
          f'batch, {args.repeats} profiled runs. Stated FLOPs {result["stated_gflop"]:.1f} GFLOP; '
          f'measured matmul peak {result["matmul_peak_gflop_s"]:.1f} GFLOP/s, so the stated '
          f'matmuls alone need {result["matmul_ms_at_peak"]:.0f} ms at peak. XLA cost analysis: '
          f'{(result["xla_flops"] or 0) / 1e9:.1f} GFLOP, '
          f'{(result["xla_bytes_accessed"] or 0) / 2 ** 30:.2f} GiB accessed. Load average '
          f'before/after {load[0][0]:.1f} / {load[1][0]:.1f} on {os.cpu_count()} cores'
          + (' (shared machine: absolute ms are contaminated, shares less so).'
             if load[0][0] > 2.5 else ' (no other jobs; the load is this sequence of benchmarks).'))
  lines = op_profile.markdown('Train step: per-op profile', result['command'], result, note)
  with open(args.out + '.md', 'w') as f:
    f.write('\n'.join(lines) + '\n')
  print(json.dumps({k: result[k] for k in ('wall_ms', 'thunk_total_ms', 'by_category_ms',
                                            'matmul_ms_at_peak')}, indent=1))


if __name__ == '__main__':
  main()
