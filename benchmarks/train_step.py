"""How close is the train step to the machine's matmul rate? Tokens/s and achieved FLOP/s of the
jitted train step, beside the measured matmul rate.

  python -m benchmarks.train_step [--preset mini] [--settings pretrain,finetune] [--steps 6] \
      [--batch N] [--dtype bfloat16] [--scan-layers] [--remat-policy minimal] \
      [--baseline HEAD~1 --rounds 3] [--out PATH] [--force]

Settings (`workloads.SETTINGS`: pretrain, finetune, summarize) are the `cpu` reproduction preset's
train steps of the `mini` target on synthetic packed batches of its shapes.
A `--kv` other than mha gives the decoder that many K/V heads (the uptrained GQA targets).

FLOPs per step are stated (`workloads.model_flops`: 6 x matmul parameters x tokens + 3 x the
attention matmuls, every position of the padded batch); XLA's own count (`cost_analysis()['flops']`
of the lowered step) is reported beside it.
The matmul rate is measured in the same child process, in the activation dtype (`--dtype`): a
jitted square product (1024^3 on CPU; 8192^3 on an accelerator, where a small one measures dispatch)
and the model-shaped `[batch x length, emb] x [emb, mlp]`, best of 5.

`--baseline REF` measures the library at git REF (e.g. the parent commit) in child processes that
alternate with the working tree's (`common.py`), so before and after share the machine's load.
"""

from __future__ import annotations

import argparse
import os

import jax
import numpy as np

from benchmarks import common, workloads
from gqa_spec.models.config import preset


def measure(args) -> list:
  rows = []
  for name in args.settings.split(','):
    batch, enc_len, dec_len, dropout, pretrain = workloads.SETTINGS[name]
    batch = args.batch or batch
    for kv in args.kv.split(','):
      base = preset(args.preset)
      groups = workloads.kv_heads(base, kv)
      config = base.replace(num_kv_heads=groups, dropout_rate=dropout, dtype=args.dtype,
                            scan_layers=args.scan_layers, remat_policy=args.remat_policy)
      step_fn = workloads.train_step(config, pretrain)
      state = step_fn.init(jax.random.PRNGKey(0))
      batches = workloads.train_batches(step_fn, batch, enc_len, dec_len, count=4)

      def step(i):
        nonlocal state
        state, metrics = step_fn(state, batches[i % len(batches)])
        return state, metrics

      compile_s = common.seconds(lambda: step(0))
      times = [common.seconds(lambda i=i: step(i)) for i in range(1, args.steps + 1)]
      step_s = float(np.median(times))
      flops = workloads.model_flops(config, batch, enc_len, dec_len)
      xla_flops = None
      if step_fn._jitted is not None:  # pylint: disable=protected-access
        try:
          cost = step_fn._jitted.lower(state, batches[0]).cost_analysis()  # pylint: disable=protected-access
          cost = cost[0] if isinstance(cost, (list, tuple)) else cost
          xla_flops = float(cost.get('flops', 0.0))
        except Exception:  # pylint: disable=broad-except
          xla_flops = None
      square = 1024 if jax.default_backend() == 'cpu' else 8192  # dispatch-free on a GPU
      peak = common.matmul_rate(square, square, square, dtype=config.activation_dtype)
      peak_model = common.matmul_rate(batch * max(enc_len, dec_len), config.emb_dim,
                                      config.mlp_dim, dtype=config.activation_dtype)
      row = {'setting': name, 'preset': args.preset, 'kv_heads': groups, 'batch': batch,
             'dtype': args.dtype, 'scan_layers': args.scan_layers,
             'remat_policy': args.remat_policy,
             'inputs_length': enc_len, 'targets_length': dec_len, 'dropout': dropout,
             'step_s': step_s, 'step_s_min': float(min(times)), 'compile_s': compile_s,
             'tokens_per_s': batch * (enc_len + dec_len) / step_s,
             'stated_gflop': flops / 1e9, 'xla_gflop': None if xla_flops is None else xla_flops / 1e9,
             'achieved_gflop_s': flops / step_s / 1e9,
             'matmul_peak_gflop_s': peak / 1e9, 'matmul_peak_model_shape_gflop_s': peak_model / 1e9,
             'fraction_of_peak': flops / step_s / max(peak, peak_model),
             'loadavg': os.getloadavg()[0]}
      rows.append(row)
      common.print_row(row)
  return rows


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--settings', default='pretrain,finetune')
  p.add_argument('--preset', default='mini')
  p.add_argument('--kv', default='mha')
  p.add_argument('--steps', type=int, default=6)
  p.add_argument('--batch', type=int, default=0, help='override the settings\' batch size')
  p.add_argument('--scan-layers', action='store_true', help='one nn.scan per stack')
  p.add_argument('--remat-policy', default='none', choices=('none', 'minimal', 'full'),
                 help="T5Config.remat_policy (what the backward pass recomputes)")
  common.add_dtype_argument(p)  # the matmul peak is measured in it too
  common.add_ab_arguments(p)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  load_before = os.getloadavg()
  rows = common.rows(__file__, args, argv, measure, key=lambda r: (r['setting'], r['kv_heads']),
                     timed=('step_s', 'tokens_per_s', 'achieved_gflop_s', 'matmul_peak_gflop_s',
                            'matmul_peak_model_shape_gflop_s', 'loadavg'))
  if rows is None:  # an A/B child: its rows are written
    return
  if args.baseline:
    for r in rows:
      r['speedup_vs_baseline'] = r['baseline_step_s'] / r['step_s']
      r['fraction_of_peak'] = r['achieved_gflop_s'] / max(r['matmul_peak_gflop_s'],
                                                          r['matmul_peak_model_shape_gflop_s'])
  results = common.results(__file__, argv, rows, load_before, **common.ab_fields(args))
  base = args.baseline
  lines = [*common.heading('Train step throughput', results['command']),
           f'Median step time over {args.steps} steps (after one compile step) per run'
           + (f', then the median over {args.rounds} rounds alternating this code with the library '
              f'at `{base}` ("baseline")' if base else '') + '. Stated FLOPs: 6 x matmul params x '
           'tokens + 3 x attention matmuls (see `benchmarks/workloads.py`); peak: measured '
           f'{args.dtype} matmul rate in the same runs (best of square and model-shaped). '
           + common.load_note(load_before, os.getloadavg(),
                              ' (the machine was shared with other jobs, so absolute rates are '
                              'low; compare the columns side by side).', ' (no other jobs).'), '',
           *common.table_head(
               ['setting', 'kv', 'batch x in/out', 'dropout', 'step s']
               + (['baseline s', 'speedup'] if base else [])
               + ['tokens/s', 'GFLOP (stated / XLA)', 'GFLOP/s', 'matmul peak GFLOP/s', 'of peak'])]
  for r in rows:
    b = f' {r["baseline_step_s"]:.3f} | {r["speedup_vs_baseline"]:.2f} |' if base else ''
    xla = '-' if r['xla_gflop'] is None else f'{r["xla_gflop"]:.1f}'
    peak = max(r['matmul_peak_gflop_s'], r['matmul_peak_model_shape_gflop_s'])
    what = r.get('preset', 'mini') + ('' if r.get('dtype', 'float32') == 'float32' else ', bf16')
    lines.append(f'| {r["setting"]} ({what}) | {r["kv_heads"]} | {r["batch"]} x {r["inputs_length"]}/'
                 f'{r["targets_length"]} | {r["dropout"]} | {r["step_s"]:.3f} |{b} '
                 f'{r["tokens_per_s"]:.0f} | {r["stated_gflop"]:.1f} / {xla} | '
                 f'{r["achieved_gflop_s"]:.1f} | {peak:.1f} | {r["fraction_of_peak"]:.0%} |')
  common.write_report(args.out, results, lines, args.force)


if __name__ == '__main__':
  main()
