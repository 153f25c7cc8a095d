"""Lower + compile time of the decode step and the train step, scanned vs unrolled layers.

  python -m benchmarks.compile_time [--sizes small,large,xl,xxl] [--repeats 1]

A size `NAME@LAYERS` overrides the preset's depth (`small@24`: the small widths, 24 layers), which
separates what depth costs from what width costs.

For each T5.1.1 size and layer layout (`T5Config.scan_layers`) this lowers and compiles, for this
machine, (a) the decode step (`decode_cache.decode_tokens`: one token for a batch of 1 against a
cache of `--cache` slots and `--inputs` encoder positions) and (b) the train step
(`train_step._train_step`, Adafactor, batch 1 of `--inputs`/`--targets` tokens). Everything is
abstract (`jax.ShapeDtypeStruct`s from `jax.eval_shape`): no parameter is materialised, so XXL
shapes compile on a laptop. Lowering (tracing to StableHLO) and XLA compilation are timed apart;
with `--repeats N` each is the median of N fresh compilations (the jit caches are cleared between).
The goals (issue 25): XL scanned <= 1/5 of unrolled for both steps, and the 24-layer sizes'
scanned times <= 1.5x the 8-layer `small`'s.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any, Dict, List

import jax
import jax.numpy as jnp

from benchmarks import common
from gqa_spec.checkpoints import native
from gqa_spec.decoding import memory
from gqa_spec.models import decode_cache
from gqa_spec.models.config import preset
from gqa_spec.models.t5 import Transformer
from gqa_spec.training import optimizer
from gqa_spec.training import train_step as ts

_BATCH_KEYS = ('encoder_input_tokens', 'decoder_input_tokens', 'decoder_target_tokens',
               'decoder_loss_weights', 'encoder_segment_ids', 'decoder_segment_ids',
               'encoder_positions', 'decoder_positions')


def _timed(fn, args) -> Dict[str, float]:
  """Seconds to lower `jax.jit(fn)` at `args` and to compile the lowering."""
  jax.clear_caches()
  start = time.perf_counter()
  lowered = jax.jit(fn).lower(*args)
  lowered_at = time.perf_counter()
  lowered.compile()
  return {'lower_s': lowered_at - start, 'compile_s': time.perf_counter() - lowered_at}


def config_of(size: str, scan: bool):
  """The preset `size` ('NAME' or 'NAME@LAYERS': that depth, encoder and decoder) in a layout."""
  name, _, layers = size.partition('@')
  depth = {'num_encoder_layers': int(layers), 'num_decoder_layers': int(layers)} if layers else {}
  return preset(name, scan_layers=scan, **depth)


def decode_step(config, inputs: int, cache: int):
  model = Transformer(config)
  params = native.abstract_params(config)
  abstract_cache = memory.abstract_cache(config, 1, inputs, cache, params)
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  return (lambda p, c, t: decode_cache.decode_tokens(model, p, c, t)), (params, abstract_cache,
                                                                         tokens)


def train_step(config, inputs: int, targets: int):
  tx = optimizer.adafactor()
  params = native.abstract_params(config)
  state = ts.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                        opt_state=jax.eval_shape(tx.init, params))
  lengths = {'encoder': inputs, 'decoder': targets}
  batch = {k: jax.ShapeDtypeStruct((1, lengths[k.split('_')[0]]),
                                   jnp.float32 if k == 'decoder_loss_weights' else jnp.int32)
           for k in _BATCH_KEYS}
  fn = functools.partial(ts._train_step, config=config, tx=tx,  # pylint: disable=protected-access
                         learning_rate_fn=optimizer.constant(1e-3), z_loss=1e-4,
                         loss_normalizing_factor=None, dropout_seed=0)
  return fn, (state, batch)


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  rows = []
  for size in args.sizes.split(','):
    for scan in (False, True):
      config = config_of(size, scan)
      for step, build in (('decode', lambda c: decode_step(c, args.inputs, args.cache)),
                          ('train', lambda c: train_step(c, args.inputs, args.targets))):
        if step not in args.steps.split(','):
          continue
        fn, fn_args = build(config)
        times = [_timed(fn, fn_args) for _ in range(args.repeats)]
        row = {'size': size, 'layers': config.num_decoder_layers,
               'layout': 'scanned' if scan else 'unrolled', 'step': step,
               **{k: statistics.median(t[k] for t in times) for k in times[0]}}
        row['total_s'] = row['lower_s'] + row['compile_s']
        common.print_row(row)
        rows.append(row)
  return rows


def _total(rows, size, layout, step):
  return next((r['total_s'] for r in rows
               if (r['size'], r['layout'], r['step']) == (size, layout, step)), None)


def markdown(result: Dict[str, Any]) -> List[str]:
  rows = result['rows']
  lines = common.heading('Compile time: scanned vs unrolled layers', result['command'])
  lines += ['Lower (trace to StableHLO) + XLA compile seconds of the decode step (batch 1, one token)',
            'and the Adafactor train step (batch 1), abstract T5.1.1 shapes, on this CPU. Ratio: '
            'unrolled / scanned.', '']
  lines += common.table_head(['size', 'layers', 'step', 'unrolled lower+compile s',
                              'scanned lower+compile s', 'unrolled / scanned'])
  for size in dict.fromkeys(r['size'] for r in rows):
    layers = next(r['layers'] for r in rows if r['size'] == size)
    for step in ('decode', 'train'):
      u, s = _total(rows, size, 'unrolled', step), _total(rows, size, 'scanned', step)
      if u is None or s is None:
        continue
      lines.append(f'| {size} | {layers} | {step} | {u:.2f} | {s:.2f} | {u / s:.1f}x |')
  lines += ['', 'Per row, lowering and compilation apart:', '']
  lines += common.table_head(['size', 'layout', 'step', 'lower s', 'compile s'])
  for r in rows:
    lines.append(f"| {r['size']} | {r['layout']} | {r['step']} | {r['lower_s']:.2f} | "
                 f"{r['compile_s']:.2f} |")
  lines += common.result_load_note(result, ': the machine was shared with other jobs, so every '
                                   'time here is inflated, unrolled and scanned alike.')
  return lines


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--sizes', default='small,xl,large,xxl',
                 help='T5.1.1 presets, comma-separated; NAME@LAYERS overrides the depth')
  p.add_argument('--steps', default='decode,train', help='decode and/or train, comma-separated')
  p.add_argument('--inputs', type=int, default=64, help='encoder positions')
  p.add_argument('--targets', type=int, default=64, help='decoder positions of the train step')
  p.add_argument('--cache', type=int, default=64, help='decode cache slots')
  p.add_argument('--repeats', type=int, default=1)
  return common.measure_and_write(__file__, p, argv, measure, markdown)


if __name__ == '__main__':
  raise SystemExit(main())
