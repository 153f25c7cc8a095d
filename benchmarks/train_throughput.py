"""Tokens/s and achieved FLOP/s of the jitted train step, beside the measured matmul rate.

  python benchmarks/train_throughput.py [--settings pretrain,finetune] [--steps 6] \
      [--baseline HEAD~1 --rounds 3] [--out results/benchmarks/train_throughput]

Settings are the `cpu` reproduction preset's train steps of the `mini` target (synthetic packed
batches of the preset's shapes, `gqa_spec.training.data.synthetic_batches`, so that the step and
not the input pipeline is measured):
  pretrain   batch 16 x 128/32 tokens, dropout 0 (span corruption's shapes), rsqrt lr
  finetune   batch 16 x 64/64 tokens, dropout 0.1 (translation's shapes), constant lr
  summarize  batch 16 x 128/32 tokens, dropout 0.1
A `--kv` other than mha gives the decoder that many K/V heads (the uptrained GQA targets).

FLOPs per step (stated, not measured): 6 x (matmul parameters x the tokens that pass through them:
encoder layers x encoder tokens, decoder layers and the logits kernel x decoder tokens; the
embedding lookup is not a matmul) + 3 x the attention matmuls (2 x 2 x q x k x heads x head_dim per
row for QK^T and AV; encoder self, decoder self and cross), counting every position of the padded
batch. XLA's own count (`cost_analysis()['flops']` of the lowered step) is reported beside it.
The matmul rate is measured in the same child process, in the activation dtype (`--dtype`): a
jitted square product (1024^3 on CPU; 8192^3 on an accelerator, where a small one measures dispatch)
and the model-shaped `[batch x length, emb] x [emb, mlp]`, best of 5.

`--baseline REF` measures the library at git REF (e.g. the parent commit) in child processes that
alternate with the working tree's (`ab.py`), so before and after share the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab  # pylint: disable=g-import-not-at-top,wrong-import-position
from speculative import machine, write_markdown  # pylint: disable=g-import-not-at-top,wrong-import-position

from gqa_spec.models.config import preset  # pylint: disable=wrong-import-position
from gqa_spec.training import optimizer  # pylint: disable=wrong-import-position
from gqa_spec.training.data import DatasetConfig, synthetic_batches  # pylint: disable=wrong-import-position
from gqa_spec.partitioning import Partitioner  # pylint: disable=wrong-import-position
from gqa_spec.training.train_step import TrainStep  # pylint: disable=wrong-import-position

SETTINGS = {  # name: (batch, inputs length, targets length, dropout, pre-training schedule)
    'pretrain': (16, 128, 32, 0.0, True),
    'finetune': (16, 64, 64, 0.1, False),
    'summarize': (16, 128, 32, 0.1, False),
}


def model_flops(config, batch: int, enc_len: int, dec_len: int) -> float:
  """The stated FLOPs of one train step (see the module docstring)."""
  e, h, d, m = config.emb_dim, config.num_heads, config.head_dim, config.mlp_dim
  g = config.num_kv_heads
  mlp = e * m * (len(config.mlp_activations) + 1)
  enc_layer = 4 * e * h * d + mlp
  dec_layer = 2 * (2 * e * h * d + 2 * e * g * d) + mlp
  enc_tokens, dec_tokens = batch * enc_len, batch * dec_len
  dense = (config.num_encoder_layers * enc_layer * enc_tokens
           + (config.num_decoder_layers * dec_layer + e * config.vocab_size) * dec_tokens)
  attn = 4 * h * d * batch * (config.num_encoder_layers * enc_len * enc_len
                              + config.num_decoder_layers * (dec_len * dec_len + dec_len * enc_len))
  return 6 * dense + 3 * attn


def _peak(m: int, k: int, n: int, repeats: int = 5, dtype=jnp.float32) -> float:
  ka, kb = jax.random.split(jax.random.PRNGKey(m + k + n))
  a, b = jax.random.normal(ka, (m, k), dtype), jax.random.normal(kb, (k, n), dtype)  # not zeros/ones
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * m * k * n / best


def measure(args) -> list:
  rows = []
  for name in args.settings.split(','):
    batch, enc_len, dec_len, dropout, pretrain = SETTINGS[name]
    batch = args.batch or batch
    for kv in args.kv.split(','):
      base = preset(args.preset)
      groups = {'mha': base.num_heads, 'mqa': 1}.get(kv) or int(kv[3:])
      config = base.replace(num_kv_heads=groups, dropout_rate=dropout, dtype=args.dtype)
      lr = optimizer.rsqrt_decay(warmup_steps=500) if pretrain else optimizer.constant(1e-2)
      step_fn = TrainStep(config, optimizer.adafactor(), lr, Partitioner.create(config))
      state = step_fn.init(jax.random.PRNGKey(0))
      data = DatasetConfig('synthetic', {'inputs': enc_len, 'targets': dec_len}, batch_size=batch)
      batches = [step_fn.partitioner.shard_batch(b) for b, _ in
                 zip(synthetic_batches(data, batch, vocab_size=config.vocab_size), range(4))]
      t0 = time.perf_counter()
      state, _ = step_fn(state, batches[0])
      jax.block_until_ready(state)
      compile_s = time.perf_counter() - t0
      times = []
      for i in range(args.steps):
        t0 = time.perf_counter()
        state, metrics = step_fn(state, batches[(i + 1) % len(batches)])
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)
      step_s = float(np.median(times))
      flops = model_flops(config, batch, enc_len, dec_len)
      xla_flops = None
      if step_fn._jitted is not None:  # pylint: disable=protected-access
        try:
          cost = step_fn._jitted.lower(state, batches[0]).cost_analysis()  # pylint: disable=protected-access
          cost = cost[0] if isinstance(cost, (list, tuple)) else cost
          xla_flops = float(cost.get('flops', 0.0))
        except Exception:  # pylint: disable=broad-except
          xla_flops = None
      square = 1024 if jax.default_backend() == 'cpu' else 8192  # dispatch-free on a GPU
      peak = _peak(square, square, square, dtype=config.activation_dtype)
      peak_model = _peak(batch * max(enc_len, dec_len), config.emb_dim, config.mlp_dim,
                         dtype=config.activation_dtype)
      row = {'setting': name, 'preset': args.preset, 'kv_heads': groups, 'batch': batch,
             'dtype': args.dtype,
             'inputs_length': enc_len, 'targets_length': dec_len, 'dropout': dropout,
             'step_s': step_s, 'step_s_min': float(min(times)), 'compile_s': compile_s,
             'tokens_per_s': batch * (enc_len + dec_len) / step_s,
             'stated_gflop': flops / 1e9, 'xla_gflop': None if xla_flops is None else xla_flops / 1e9,
             'achieved_gflop_s': flops / step_s / 1e9,
             'matmul_peak_gflop_s': peak / 1e9, 'matmul_peak_model_shape_gflop_s': peak_model / 1e9,
             'fraction_of_peak': flops / step_s / max(peak, peak_model),
             'loadavg': os.getloadavg()[0]}
      rows.append(row)
      print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
            flush=True)
  return rows


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--settings', default='pretrain,finetune')
  p.add_argument('--preset', default='mini')
  p.add_argument('--kv', default='mha')
  p.add_argument('--steps', type=int, default=6)
  p.add_argument('--batch', type=int, default=0, help='override the settings\' batch size')
  p.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'),
                 help='activation dtype (parameters stay float32, as in t5x); the matmul peak is '
                      'measured in it')
  p.add_argument('--baseline', default=None, help='git ref of the library to compare against')
  p.add_argument('--rounds', type=int, default=3)
  p.add_argument('--child-out', default=None, help=argparse.SUPPRESS)
  p.add_argument('--out', default='results/benchmarks/train_throughput')
  args = p.parse_args(argv)
  if args.child_out:
    with open(args.child_out, 'w') as f:
      json.dump(measure(args), f)
    return
  load_before = os.getloadavg()
  if args.baseline:
    rows = ab.alternate(os.path.abspath(__file__), args.baseline,
                        ab.child_argv(list(argv if argv is not None else sys.argv[1:])), args.rounds,
                        key=lambda r: (r['setting'], r['kv_heads']),
                        timed=('step_s', 'tokens_per_s', 'achieved_gflop_s', 'matmul_peak_gflop_s',
                               'matmul_peak_model_shape_gflop_s', 'loadavg'))['rows']
    for r in rows:
      r['speedup_vs_baseline'] = r['baseline_step_s'] / r['step_s']
      r['fraction_of_peak'] = r['achieved_gflop_s'] / max(r['matmul_peak_gflop_s'],
                                                          r['matmul_peak_model_shape_gflop_s'])
  else:
    rows = measure(args)
  results = {'command': ' '.join(['python'] + sys.argv), 'rows': rows, 'baseline': args.baseline,
             'rounds': args.rounds if args.baseline else 1,
             'loadavg_before_after': [load_before, os.getloadavg()], 'machine': machine()}
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  with open(args.out + '.json', 'w') as f:
    json.dump(results, f, indent=2)
  base = args.baseline
  lines = ['# Train step throughput', '', f'Command: `{results["command"]}`', '',
           f'Median step time over {args.steps} steps (after one compile step) per run'
           + (f', then the median over {args.rounds} rounds alternating this code with the library '
              f'at `{base}` ("baseline")' if base else '') + '. Stated FLOPs: 6 x matmul params x '
           'tokens + 3 x attention matmuls (see `benchmarks/train_throughput.py`); peak: measured '
           f'{args.dtype} matmul rate in the same runs (best of square and model-shaped). '
           f'Load average before/after: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} on '
           f'{os.cpu_count()} cores'
           + (' (the machine was shared with other jobs, so absolute rates are low; compare the '
              'columns side by side).' if load_before[0] > 2.5 else ' (no other jobs).'), '',
           '| setting | kv | batch x in/out | dropout | step s |' + (' baseline s | speedup |' if base else '')
           + ' tokens/s | GFLOP (stated / XLA) | GFLOP/s | matmul peak GFLOP/s | of peak |',
           '|---|---|---|---|---|' + ('---|---|' if base else '') + '---|---|---|---|---|']
  for r in rows:
    b = f' {r["baseline_step_s"]:.3f} | {r["speedup_vs_baseline"]:.2f} |' if base else ''
    xla = '-' if r['xla_gflop'] is None else f'{r["xla_gflop"]:.1f}'
    peak = max(r['matmul_peak_gflop_s'], r['matmul_peak_model_shape_gflop_s'])
    what = r.get('preset', 'mini') + ('' if r.get('dtype', 'float32') == 'float32' else ', bf16')
    lines.append(f'| {r["setting"]} ({what}) | {r["kv_heads"]} | {r["batch"]} x {r["inputs_length"]}/'
                 f'{r["targets_length"]} | {r["dropout"]} | {r["step_s"]:.3f} |{b} '
                 f'{r["tokens_per_s"]:.0f} | {r["stated_gflop"]:.1f} / {xla} | '
                 f'{r["achieved_gflop_s"]:.1f} | {peak:.1f} | {r["fraction_of_peak"]:.0%} |')
  write_markdown(args.out + '.md', lines, results['machine'])


if __name__ == '__main__':
  main()
