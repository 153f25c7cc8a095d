"""Speculative vs autoregressive decoding, measured side by side, against Leviathan et al.'s Theorem 8.

  python -m benchmarks.speculative [--target CKPT --draft CKPT] [--task TASK] \
      [--gammas 1,2,4,8] [--temperatures 0,1] [--hf] [--out results/benchmarks/speculative]

For each draft, temperature and gamma: alpha (Corollary 6, the mean acceptance probability over the
positions the loop tried, i.e. on the target's own generations), tokens per target call (bonus
token counted), c(gamma) = draft step time / target step time and v(gamma) = target time for
gamma + 1 tokens / for 1 token (both timed here, with jitted loops of calls), the measured walltime
speedup over our jitted autoregressive decoding (same inputs, same batch, median of repeats), and
the predictions: Theorem 8 with the measured alpha and c, and Theorem 8 with verification cost
v(gamma) (Theorem 8 assumes v = 1). `--hf` adds HF transformers as a peer on the same weights:
greedy `generate` and assisted generation with the model draft (wall time, token equality).

Without `--target`, the pair is `workloads.demo_pair` and the output says so: a random-init `mini` target
(MHA, so HF T5 holds the same weights) with drafts (a) the target's weights perturbed (alpha high,
c ~ 1: no speedup expected), (b) a random-init `nano` (c small, alpha ~ 0), (c) a bigram fitted on
the target's own greedy outputs for other inputs and (d) copy. A trained CPU-scale pair (training
issue) is what the issue's targets are about; pass it with --target/--draft/--task.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, List

import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from gqa_spec.decoding import speedup
from gqa_spec.decoding.drafts import CopyDraft, ModelDraft, NgramDraft
from gqa_spec.decoding.targets import T5Decoder


def task_inputs(task: str, n: int, length: int) -> np.ndarray:
  from gqa_spec.data import batches as pipeline  # pylint: disable=g-import-not-at-top
  ds = pipeline.get_dataset(task, 'validation', {'inputs': length, 'targets': 8}, pack=False)
  rows = [ex['encoder_input_tokens'] for ex in ds.take(n).as_numpy_iterator()]
  return np.stack(rows).astype(np.int32)


def hf_model(config, params):
  """The same weights as an HF `T5ForConditionalGeneration` (through our HF export)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import hf  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as d:
    hf.save_hf(os.path.join(d, 'hf'), config, params)
    return transformers.T5ForConditionalGeneration.from_pretrained(os.path.join(d, 'hf')).eval()


def run_hf(args, target_cfg, target_params, draft_entry, inputs, ours_greedy: List[List[int]]):
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count() or 1)
  tgt = hf_model(target_cfg, target_params)
  kw = dict(max_new_tokens=args.max_decode_len, do_sample=False, num_beams=1, eos_token_id=1,
            pad_token_id=0, decoder_start_token_id=0)
  out: Dict[str, Any] = {}

  def generate(**extra):
    res = []
    for row in inputs:
      ids = torch.from_numpy(row[None][:, :int((row > 0).sum())].astype(np.int64))
      with torch.no_grad():
        res.append(tgt.generate(ids, attention_mask=torch.ones_like(ids), **kw, **extra)[0].tolist())
    return res

  def timed(**extra):
    res = generate(**extra)  # warm; greedy, so every run's tokens are these
    secs = common.median_seconds(lambda: generate(**extra), args.repeats, warmup=0)
    toks = [r[1:] for r in res]  # HF pads finished rows only in batches; batch 1 here
    toks = [t[:t.index(1)] if 1 in t else t for t in toks]
    return secs, toks

  secs, toks = timed()
  out['hf_greedy'] = {'seconds': secs, 'tokens_equal_ours': toks == ours_greedy}
  if draft_entry is not None:
    dmodel, dparams = draft_entry
    assistant = hf_model(dmodel.config, dparams)
    secs, toks = timed(assistant_model=assistant)
    out['hf_assisted'] = {'seconds': secs, 'tokens_equal_ours': toks == ours_greedy}
  secs, toks = timed(prompt_lookup_num_tokens=4)
  out['hf_prompt_lookup'] = {'seconds': secs, 'tokens_equal_ours': toks == ours_greedy}
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--target')
  p.add_argument('--draft', help='draft checkpoint (default: the built-in pair, see --help)')
  p.add_argument('--task')
  p.add_argument('--num-examples', type=int, default=4)
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--batch-size', type=int, default=1)
  p.add_argument('--max-decode-len', type=int, default=48)
  p.add_argument('--gammas', default='1,2,4,8')
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--drafts', help='default perturbed,nano,bigram,copy (built-in pair) or '
                 'model,bigram,copy (with --draft) or bigram,copy')
  p.add_argument('--perturb', type=float, default=0.05, help='relative noise of the perturbed draft')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--hf', action='store_true')
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)

  if args.target:
    target_model, params = workloads.checkpoint_model(args.target)
    model_drafts = {}
    if args.draft:
      model_drafts['model'] = workloads.checkpoint_model(args.draft)
    pair = f'target {args.target}, draft {args.draft}'
  else:
    target_model, params, model_drafts = workloads.demo_pair(args.perturb)
    pair = (f'BUILT-IN DEMO PAIR (untrained): random-init mini target; drafts: target weights + '
            f'{args.perturb} x std Gaussian noise ("perturbed"), random-init nano ("nano"), bigram '
            'on the target\'s own greedy outputs for other inputs ("bigram"), prompt lookup ("copy")')
  if args.drafts is None:
    args.drafts = ','.join(list(model_drafts) + ['bigram', 'copy'])
  cfg = target_model.config
  if args.task:
    inputs = task_inputs(args.task, args.num_examples, args.input_length)
  else:
    inputs = workloads.synthetic_inputs(args.num_examples, args.input_length, cfg.vocab_size, seed=0)
  target = T5Decoder(target_model)
  L, B = args.max_decode_len, args.batch_size
  gammas = [int(g) for g in args.gammas.split(',')]
  temps = [float(t) for t in args.temperatures.split(',')]
  batches = [jnp.asarray(inputs[i:i + B]) for i in range(0, len(inputs), B)]
  drafts: Dict[str, Any] = {}
  for name in args.drafts.split(','):
    if name in model_drafts:
      dm, dp = model_drafts[name]
      d = ModelDraft.t5(dm)
      drafts[name] = (d, lambda enc, d=d, dp=dp: d.init(dp, enc, L, max(gammas)))
    elif name == 'bigram':
      table = NgramDraft(cfg.vocab_size).init(
          workloads.output_bigram(target_model, params, args.input_length, L))
      drafts[name] = (NgramDraft(cfg.vocab_size), lambda enc, t=table: t)
    elif name == 'copy':
      drafts[name] = (CopyDraft(cfg.vocab_size), lambda enc: enc)

  grid = speedup.measure_grid(target, params, drafts, batches, max_decode_len=L, gammas=gammas,
                              temperatures=temps, repeats=args.repeats)
  ours_greedy = grid['autoregressive'].get('0.0', {}).get('outputs')
  for r in grid['rows']:
    common.print_row(r)
  results: Dict[str, Any] = {'pair': pair, 'command': common.command(__file__, argv),
                             'batch_size': B, 'num_examples': len(inputs), 'max_decode_len': L,
                             'rows': grid['rows'],
                             'target_step_seconds': grid['target_step_seconds'],
                             'autoregressive': {t: {k: v for k, v in a.items() if k != 'outputs'}
                                                for t, a in grid['autoregressive'].items()}}
  if args.hf and ours_greedy is not None:
    entry = model_drafts.get('model') or model_drafts.get('nano')
    results['hf'] = run_hf(args, cfg, params, entry, inputs, ours_greedy)
    results['hf']['assistant'] = 'model' if 'model' in model_drafts else 'nano'
    results['hf']['ours_greedy_seconds'] = results['autoregressive']['0.0']['seconds']
    print(json.dumps(results['hf']), flush=True)
  results['machine'] = common.machine()
  write(results, args.out)


def write(results: Dict[str, Any], out: str) -> None:
  common.write_json(out, results)
  lines = ['# Speculative decoding benchmark', '', f'Pair: {results["pair"]}', '',
           f'Command: `{results["command"]}`', '',
           f'Batch {results["batch_size"]}, {results["num_examples"]} inputs, max decode length '
           f'{results["max_decode_len"]}. Speedups: per-token time of our jitted autoregressive '
           'decoding / per-token time of speculative decoding, median of repeats. Thm 8: '
           'Leviathan et al. with measured alpha and c; "+v": with verification costing v(gamma) '
           'target steps.', '',
           '| draft | T | gamma | alpha | tok/call | c | v | measured | Thm 8 | Thm 8+v | meas/Thm8 | = AR |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r in results['rows']:
    lines.append(f'| {r["draft"]} | {r["temperature"]:g} | {r["gamma"]} | {r["alpha"]:.3f} | '
                 f'{r["tokens_per_call"]:.2f} | {r["c"]:.3f} | {r["verify_ratio_v"]:.2f} | '
                 f'{r["speedup_measured"]:.2f}x | {r["speedup_thm8"]:.2f}x | '
                 f'{r["speedup_thm8_with_v"]:.2f}x | {r["measured_over_thm8"]:.2f} | '
                 f'{r["tokens_equal_autoregressive"]} |')
  if 'hf' in results:
    h = results['hf']
    lines += ['', '## HF transformers peer (same weights, batch 1, torch CPU)', '',
              f'- ours greedy (jitted AR): {h["ours_greedy_seconds"]:.3f} s',
              f'- HF greedy generate: {h["hf_greedy"]["seconds"]:.3f} s, tokens equal ours: '
              f'{h["hf_greedy"]["tokens_equal_ours"]}']
    if 'hf_assisted' in h:
      lines.append(f'- HF assisted generation (assistant = {h["assistant"]}): '
                   f'{h["hf_assisted"]["seconds"]:.3f} s, tokens equal: '
                   f'{h["hf_assisted"]["tokens_equal_ours"]}')
    lines.append(f'- HF prompt lookup (4 tokens): {h["hf_prompt_lookup"]["seconds"]:.3f} s, tokens '
                 f'equal: {h["hf_prompt_lookup"]["tokens_equal_ours"]}')
  common.write_markdown(out + '.md', lines, results['machine'])


if __name__ == '__main__':
  main()
