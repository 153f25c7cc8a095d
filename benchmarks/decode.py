"""How fast is our decoding? The per-token step time of our jitted autoregressive decoding against
the memory-bandwidth bound and, with `--hf`, against HF transformers' `generate` on the same weights.

  python -m benchmarks.decode [--presets nano,mini] [--kv mha,gqa2,mqa] [--batch 1,8] \
      [--input-length 64] [--hf] [--baseline REF --rounds 3] [--out PATH] [--force]

`--hf` adds, per preset, greedy batch-1 decoding of `--hf-tokens` tokens by ours and by HF's
`generate` (`T5ForConditionalGeneration` loaded from our HF export of the same random MHA weights,
in `--dtype`, on the GPU when torch sees one), EOS suppressed on both sides (ours `eos_id=-1`, HF
`min_new_tokens`), so both do the same number of steps: tokens/s over the median of `--repeats`
after a warm-up (ours without the one-time encoder pass), and the length of the prefix on which
the two agree (bfloat16 near-ties may differ).

`--input-length` takes a list (e.g. `64,2048`: the long-input setting). `--baseline REF` also
measures the library at git REF (e.g. HEAD~1) in alternating child processes (`common.py`) and reports
both step times side by side.

`--layouts unrolled,scanned` times each model in both layer layouts side by side (`T5Config.scan_layers`;
decoding uses unrolled unless told, `gqa_spec.models.layout.for_decoding`). `--shaped-setup` skips
compiling the model's init and encoder (minutes for 24 unrolled layers on a GPU): parameters are
random normal leaves of the model's shapes and the cache is filled with random K/V (index 0, every
encoder position visible); a decode step's time does not depend on the values, only on the shapes.
Each row records `setup_s` (parameters and cache) and `compile_s` (the first, compiling run).

`--dtype bfloat16 --param-dtype bfloat16` decodes with bfloat16 activations and parameters cast once
(`gqa_spec.checkpoints.param_dtype`; the float32 logits kernel stays float32); `--loop-chunk K` runs
K steps per while-loop iteration (`autoregressive.decode`).

Bound per step = bytes read per decode step / measured bandwidth, where the bytes are the
decoder's parameters (the logits kernel included; the encoder is not read while decoding) plus the
self-attention K/V cache (this implementation attends over the whole allocated cache, masked, so
all of it is read) plus the cached cross-attention K/V; bandwidth is measured here by a jitted
reduction over a float32 array of 256 MiB (2 GiB on an accelerator). Step time = wall time of a jitted while-loop decode of
`--steps` tokens / steps (EOS suppressed by decoding to max length, random-init weights). Every row
of the batch holds the same input, encoded once and copied (the decode step does not care, and a
2048-token encoder pass at batch 16 would need GiBs of attention logits).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from gqa_spec.decoding import autoregressive
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models import decode_cache
from gqa_spec.models.config import preset
from gqa_spec.models.t5 import Transformer


def cross_kv_bytes(cache) -> int:
  total = 0
  for name, layer in cache['decoder'].items():
    if (name == 'layers' or name.startswith('layers_')) and 'encoder_decoder_attention' in layer:
      total += workloads.tree_bytes(layer['encoder_decoder_attention'])
  return total


def random_decoder(name: str, groups: Optional[int], dtype: str,
                   param_dtype: Optional[str] = None, layout: str = 'unrolled',
                   shaped: bool = False):
  """(T5Decoder, random params) of preset `name` with `groups` K/V heads (None: the preset's),
  `dtype` activations, parameters cast to `param_dtype` (None: float32), in `layout`; `shaped`:
  random normal leaves (`workloads.shaped_random_params`) instead of the model's compiled init."""
  config = preset(name).replace(dtype=dtype, scan_layers=layout == 'scanned')
  if groups is not None:
    config = config.replace(num_kv_heads=groups)
  model = Transformer(config)
  if shaped:
    return T5Decoder(model), workloads.shaped_random_params(model, dtype=param_dtype)
  return T5Decoder(model), workloads.random_params(model, dtype=param_dtype)


def decode_state(dec, params, length: int, batch: int, steps: int, shaped: bool = False):
  """The state after encoding one `length`-token input, copied to `batch` rows; `shaped`: a
  state of the same shapes with random K/V, index 0 and every encoder position visible (no
  encoder compile)."""
  enc = jnp.full((1, length), 7, jnp.int32).at[:, -1].set(1)  # [1, length]
  if not shaped:
    return dec.reorder(dec.init(params, enc, steps + 1), jnp.zeros((batch,), jnp.int32))
  shape = jax.eval_shape(lambda p: dec.init(p, jnp.zeros((batch, length), jnp.int32), steps + 1),
                         params)
  return workloads.shaped_random_state(shape, params)


def measure(args) -> list:
  """Rows of step time and bound for every (preset, G, input length, batch)."""
  bw = common.bandwidth()
  print(f'measured bandwidth: {bw / 1e9:.2f} GB/s', flush=True)
  rows = []
  for name in args.presets.split(','):
    for kv in args.kv.split(','):
      for layout in args.layouts.split(','):
        rows += _measure_model(args, name, kv, layout, bw)
  return rows


def _measure_model(args, name: str, kv: str, layout: str, bw: float) -> list:
  """The rows of one model (preset, K/V grouping, layout) over input lengths and batches."""
  rows = []
  groups = workloads.kv_heads(preset(name), kv)
  t0 = time.perf_counter()
  dec, params = random_decoder(name, groups, args.dtype, args.param_dtype, layout,
                               args.shaped_setup)
  jax.block_until_ready(params)
  params_s = time.perf_counter() - t0
  for length in (int(n) for n in args.input_length.split(',')):
    for batch in (int(b) for b in args.batch.split(',')):
      t0 = time.perf_counter()
      state = jax.block_until_ready(decode_state(dec, params, length, batch, args.steps,
                                                 args.shaped_setup))
      setup_s = params_s + time.perf_counter() - t0
      params_s = 0.0  # counted once, in the model's first row
      run = lambda: autoregressive.decode(dec, state, jax.random.PRNGKey(0),
                                          max_decode_len=args.steps, eos_id=-1,
                                          loop_chunk=args.loop_chunk)
      compile_s = common.seconds(run)
      step = common.median_seconds(run, args.repeats, warmup=0) / args.steps
      param_bytes = workloads.tree_bytes(params['decoder'])
      self_kv = decode_cache.self_attention_kv_bytes(state.cache)
      cross_kv = cross_kv_bytes(state.cache)
      bound = (param_bytes + self_kv + cross_kv) / bw
      row = {'kind': 'step', 'preset': name, 'kv_heads': groups, 'input_length': length, 'batch': batch,
             'layout': layout, 'setup_s': setup_s, 'compile_s': compile_s,
             'dtype': args.dtype, 'param_dtype': args.param_dtype or 'float32',
             'loop_chunk': args.loop_chunk, 'step_ms': step * 1e3, 'bound_ms': bound * 1e3, 'ratio_to_bound': step / bound,
             'bandwidth_gb_s': bw / 1e9, 'decoder_param_mib': param_bytes / 2 ** 20,
             'self_kv_mib': self_kv / 2 ** 20, 'cross_kv_mib': cross_kv / 2 ** 20,
             'loadavg': os.getloadavg()[0]}
      rows.append(row)
      common.print_row(row)
  return rows


def hf_generate(config, params, dtype: str, tokens: np.ndarray, steps: int, repeats: int):
  """(median seconds, generated ids, device) of HF greedy `generate` on the exported weights."""
  import tempfile  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import hf  # pylint: disable=g-import-not-at-top
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  with tempfile.TemporaryDirectory() as d:
    hf.save_hf(os.path.join(d, 'hf'), config.replace(param_dtype='float32'),
               jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params))
    model = transformers.T5ForConditionalGeneration.from_pretrained(
        os.path.join(d, 'hf'), torch_dtype=getattr(torch, dtype)).to(device).eval()
  ids = torch.from_numpy(tokens.astype(np.int64)).to(device)  # [1, S]
  kw = dict(max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1,
            eos_token_id=1, pad_token_id=0, decoder_start_token_id=0)

  def run():
    with torch.no_grad():
      out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    if device == 'cuda':
      torch.cuda.synchronize()
    return out

  out = run()  # warm-up
  return common.median_seconds(run, repeats, warmup=0), out[0, 1:].tolist(), device


def measure_hf(args, name: str) -> dict:
  """Greedy batch-1 tokens/s of ours and of HF `generate`, random-init MHA `name`."""
  dec, params = random_decoder(name, None, args.dtype, args.param_dtype, shaped=args.shaped_setup)
  config, steps = dec.model.config, args.hf_tokens
  length = int(args.input_length.split(',')[0])
  tokens = np.random.default_rng(0).integers(2, config.vocab_size, (1, length))
  tokens[0, -1] = 1  # EOS ends the input
  state = dec.init(params, tokens, steps + 1)
  run = lambda: autoregressive.decode(dec, state, jax.random.PRNGKey(0), max_decode_len=steps,
                                      eos_id=-1, loop_chunk=args.loop_chunk)
  ours_ids = np.asarray(run().sequences)[0, 1:].tolist()
  ours = common.median_seconds(run, args.repeats)
  hf_secs, hf_ids, device = hf_generate(config, params, args.dtype, tokens, steps, args.repeats)
  agree = next((i for i, (a, b) in enumerate(zip(ours_ids, hf_ids)) if a != b),
               min(len(ours_ids), len(hf_ids)))
  row = {'kind': 'hf', 'preset': name, 'dtype': args.dtype,
         'param_dtype': args.param_dtype or 'float32', 'input_length': length, 'tokens': steps,
         'ours_seconds': ours, 'ours_tokens_per_s': steps / ours, 'hf_seconds': hf_secs,
         'hf_tokens_per_s': steps / hf_secs, 'speedup_vs_hf': hf_secs / ours,
         'agreeing_prefix': agree, 'hf_device': device}
  common.print_row(row)
  return row


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--presets', default='nano,mini')
  p.add_argument('--kv', default='mha,gqa2,mqa')
  p.add_argument('--batch', default='1,8')
  p.add_argument('--layouts', default='unrolled',
                 help='layer layouts to time each model in: unrolled, scanned or both (comma list)')
  p.add_argument('--shaped-setup', action='store_true',
                 help='random parameters and cache of the right shapes, no init/encoder compile')
  p.add_argument('--input-length', default='64')
  p.add_argument('--steps', type=int, default=64)
  common.add_dtype_argument(p)
  p.add_argument('--repeats', type=int, default=5)
  p.add_argument('--loop-chunk', type=int, default=1,
                 help='decode steps per while-loop iteration (autoregressive.decode loop_chunk)')
  common.add_ab_arguments(p)
  p.add_argument('--hf', action='store_true',
                 help="also greedy batch-1 tokens/s against HF transformers' generate, per preset")
  p.add_argument('--hf-tokens', type=int, default=128, help='tokens each side generates (--hf)')
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  load_before = os.getloadavg()
  rows = common.rows(__file__, args, argv, measure,
                     key=lambda r: (r['preset'], r['kv_heads'], r['layout'], r['input_length'],
                                    r['batch']),
                     timed=('step_ms', 'bandwidth_gb_s', 'loadavg', 'setup_s', 'compile_s'))
  if rows is None:  # an A/B child: its rows are written
    return
  hf_rows = [measure_hf(args, name) for name in args.presets.split(',')] if args.hf else []
  if args.baseline:
    for r in rows:
      r['bound_ms'] = r['bound_ms'] * r['bandwidth_gb_s_rounds'][0] / r['bandwidth_gb_s']
      r['ratio_to_bound'] = r['step_ms'] / r['bound_ms']
      r['speedup_vs_baseline'] = r['baseline_step_ms'] / r['step_ms']
  bw = float(np.median([r['bandwidth_gb_s'] for r in rows]))
  results = common.results(__file__, argv, rows + hf_rows, load_before, bandwidth_gb_s=bw,
                           steps=args.steps, input_lengths=args.input_length,
                           **common.ab_fields(args))
  lines = [*common.heading('Autoregressive decode step vs memory-bandwidth bound',
                           results['command']),
           f'Measured bandwidth (jitted sum over {common.bandwidth_mib()} MiB, median over runs): '
           f'{bw:.2f} GB/s. '
           'Bound = (decoder params + self K/V cache (whole allocation) + cross K/V) / bandwidth. '
           f'Random-init weights, {args.steps} decode steps, median of {args.repeats} per run'
           + (f', then median over {args.rounds} rounds alternating this code with the library at '
              f'`{args.baseline}` ("baseline")' if args.baseline else '') + '. '
           + common.load_note(load_before, os.getloadavg(),
                              ' (the machine was shared with other jobs).'), '',
           *common.table_head(
               ['preset', 'kv heads', 'layout', 'input', 'batch', 'step ms']
               + (['baseline ms', 'speedup'] if args.baseline else [])
               + ['bound ms', 'step/bound', 'dec params MiB', 'self KV MiB', 'cross KV MiB'])]
  for r in rows:
    base = (f' {r["baseline_step_ms"]:.3f} | {r["speedup_vs_baseline"]:.2f} |'
            if args.baseline else '')
    dtype = '' if r.get('dtype', 'float32') == 'float32' else f' ({r["dtype"]}'
    if r.get('param_dtype', 'float32') != 'float32':
      dtype += f', {r["param_dtype"]} params' if dtype else f' ({r["param_dtype"]} params'
    dtype += ')' if dtype else ''
    lines.append(f'| {r["preset"]}{dtype} | {r["kv_heads"]} | {r.get("layout", "unrolled")} | '
                 f'{r["input_length"]} | {r["batch"]} | '
                 f'{r["step_ms"]:.3f} |{base} {r["bound_ms"]:.3f} | {r["ratio_to_bound"]:.1f} | '
                 f'{r["decoder_param_mib"]:.2f} | {r["self_kv_mib"]:.3f} | {r["cross_kv_mib"]:.3f} |')
  cache = ('the CPU caches' if jax.default_backend() == 'cpu'
           else "the GPU's L2 (50 MB on an H100)")
  lines += ['', f'Caveat: parameters and caches that fit in {cache} are not '
            're-read from DRAM every step, so a DRAM-bandwidth bound understates what is achievable '
            'for them; the bound is meaningful for weights well beyond the last-level cache.']
  if hf_rows:
    lines += ['', "## Greedy batch 1: ours vs HF transformers' generate", '',
              f'Random-init MHA weights exported to HF, {args.dtype} activations; '
              f'{args.hf_tokens} tokens generated (EOS suppressed), median of {args.repeats}.', '',
              *common.table(['preset', 'HF device', 'ours tok/s', 'HF tok/s', 'ours / HF',
                             'agreeing prefix'],
                            [(r['preset'], r['hf_device'], f'{r["ours_tokens_per_s"]:.1f}',
                              f'{r["hf_tokens_per_s"]:.1f}', f'{r["speedup_vs_hf"]:.2f}',
                              f'{r["agreeing_prefix"]} of {r["tokens"]}') for r in hf_rows])]
  common.write_report(args.out, results, lines, args.force)


if __name__ == '__main__':
  main()
