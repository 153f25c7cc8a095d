"""Greedy batch-1 decoding: ours (jitted while loop) vs HF transformers' `generate`, same weights.

  python -m benchmarks.hf_decode [--preset large] [--dtype bfloat16 --param-dtype bfloat16] \
      [--max-decode-len 128] [--input-length 64] [--loop-chunk 1] [--out results/benchmarks/hf_decode]

A random-init MHA `--preset` model (HF's T5 has no K/V groups) is exported with our HF writer
(`checkpoints.hf.save_hf`) and loaded as `T5ForConditionalGeneration` in the same dtype, on the
GPU when torch sees one. Both decode `--max-decode-len` tokens greedily from the same input with
EOS suppressed (ours: `eos_id=-1`; HF: `min_new_tokens = max_new_tokens`), so both do the same
number of steps; tokens/s = tokens / median wall time over `--repeats` after a warm-up (ours
excludes the one-time encoder pass and cache allocation). In bfloat16 the two may pick different
tokens after a near-tie; the agreeing prefix length is reported beside the times.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import jax
import numpy as np

from benchmarks import common
from benchmarks.decode_roofline import random_decoder
from gqa_spec.decoding import autoregressive


def hf_generate(config, params, dtype: str, tokens: np.ndarray, steps: int, repeats: int):
  """(median seconds, generated ids) of HF greedy `generate` on the exported weights."""
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


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--preset', default='nano')
  p.add_argument('--max-decode-len', type=int, default=128)
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--loop-chunk', type=int, default=1)
  p.add_argument('--repeats', type=int, default=5)
  p.add_argument('--shaped-setup', action='store_true',
                 help='random normal parameters of the right shapes, no compiled init (minutes '
                      'for 24 unrolled layers on a GPU; decode_roofline.py)')
  common.add_dtype_argument(p)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  load_before = os.getloadavg()
  dec, params = random_decoder(args.preset, None, args.dtype, args.param_dtype,
                               shaped=args.shaped_setup)
  config, steps = dec.model.config, args.max_decode_len
  tokens = np.random.default_rng(0).integers(2, config.vocab_size, (1, args.input_length))
  tokens[0, -1] = 1  # EOS ends the input
  state = dec.init(params, tokens, steps + 1)
  run = lambda: autoregressive.decode(dec, state, jax.random.PRNGKey(0), max_decode_len=steps,
                                      eos_id=-1, loop_chunk=args.loop_chunk)
  ours_ids = np.asarray(run().sequences)[0, 1:].tolist()
  ours = common.median_seconds(run, args.repeats)
  hf_secs, hf_ids, device = hf_generate(config, params, args.dtype, tokens, steps, args.repeats)
  agree = next((i for i, (a, b) in enumerate(zip(ours_ids, hf_ids)) if a != b),
               min(len(ours_ids), len(hf_ids)))
  row = {'preset': args.preset, 'dtype': args.dtype, 'param_dtype': args.param_dtype or 'float32',
         'loop_chunk': args.loop_chunk, 'tokens': steps, 'ours_seconds': ours,
         'ours_tokens_per_s': steps / ours, 'hf_seconds': hf_secs, 'hf_tokens_per_s': steps / hf_secs,
         'speedup_vs_hf': hf_secs / ours, 'agreeing_prefix': agree, 'hf_device': device}
  common.print_row(row)
  results = common.results(__file__, argv, [row], load_before)
  common.write_json(args.out, results)
  lines = [*common.heading('Greedy batch-1 decode: ours vs HF transformers generate',
                           results['command']),
           f'Random-init {args.preset} (MHA), {args.dtype} activations, '
           f'{row["param_dtype"]} parameters (HF: {args.dtype} weights), {args.input_length} input '
           f'tokens, {steps} tokens generated (EOS suppressed), median of {args.repeats}; HF on '
           f'{device}. ' + common.load_note(load_before, os.getloadavg(),
                                            ' (the machine was shared with other jobs).'), '',
           *common.table_head(['ours tok/s', 'HF tok/s', 'ours / HF', 'agreeing prefix']),
           f'| {row["ours_tokens_per_s"]:.1f} | {row["hf_tokens_per_s"]:.1f} | '
           f'{row["speedup_vs_hf"]:.2f} | {agree} of {steps} |']
  common.write_markdown(args.out + '.md', lines, results['machine'])


if __name__ == '__main__':
  main()
