"""Token trees and staged speculation beside chain speculation and autoregressive decoding.

  python -m benchmarks.tree_staged [--target CKPT --draft CKPT] [--batch-sizes 1,8] \
      [--temperatures 0,1] [--gamma 4] [--trees 'topk:4,2,2;best:16,depth:4'] [--stage2-gamma 3] \
      [--staged-trees 'topk:4,1,1'] \
      [--num-examples 8] [--max-decode-len 32] [--repeats 3] [--out results/benchmarks/tree_staged]

For every (temperature, batch size) the methods run interleaved on the same batches (one repeat
of each in turn, medians over repeats, after one untimed compiling run): autoregressive, chain
speculation with gamma, each tree, staged speculation (chain gamma; a bigram fitted on the
draft's own greedy outputs for other inputs speculates the draft, `--stage2-gamma` per draft call)
and each of `--staged-trees` plain and staged (the tree draft feeds `--stage2-gamma` bigram tokens
after every expanded node and skips a level whose nodes, in every row, the bigram guessed: the same
trees as the plain row in fewer draft calls; only single-child levels can be skipped, hence
`topk:4,1,1` rather than `topk:4,2,2`).
Reported: tokens per target call, tokens/s, speedup over autoregressive and over the chain, token
identity with autoregressive at temperature 0, and parameter bytes read per generated token
(Spector & Re Table 1's form: each decode call reads its model's parameters once per batch;
K/V and activations not counted; staged rows count their measured draft calls, `draft_calls`),
with Theorem 8's prediction for the chain row.

Without --target the pair is the built-in UNTRAINED demo (`workloads.demo_pair`): a random
mini target and its weights + noise as the draft (same size: c ~ 1, so no wall-time speedup is
possible; tokens per call and bytes per token are the meaningful columns).
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Dict, List

import jax
import jax.numpy as jnp

from benchmarks import common, workloads
from gqa_spec.decoding import autoregressive, speculative, theory, timing, tree_speculative
from gqa_spec.decoding.drafts import ModelDraft, StagedDraft, TreeModelDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.decoding.tree import TreeShape


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--target')
  p.add_argument('--draft')
  p.add_argument('--num-examples', type=int, default=8)
  p.add_argument('--input-length', type=int, default=32)
  p.add_argument('--batch-sizes', default='1,8')
  p.add_argument('--max-decode-len', type=int, default=32)
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--gamma', type=int, default=4)
  p.add_argument('--trees', default='topk:4,2,2;best:16,depth:4')
  p.add_argument('--stage2-gamma', type=int, default=3)
  p.add_argument('--staged-trees', default='topk:4,1,1')
  p.add_argument('--perturb', type=float, default=0.05)
  p.add_argument('--repeats', type=int, default=3)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)

  if args.target:
    target_model, params = workloads.checkpoint_model(args.target)
    draft_model, dparams = workloads.checkpoint_model(args.draft)
    pair = f'target {args.target}, draft {args.draft}'
  else:
    target_model, params, drafts = workloads.demo_pair(args.perturb)
    draft_model, dparams = drafts['perturbed']
    pair = (f'BUILT-IN DEMO PAIR (untrained): random-init mini target, draft = its weights + '
            f'{args.perturb} x std noise (same size: c ~ 1)')
  cfg = target_model.config
  L, gamma, g2 = args.max_decode_len, args.gamma, args.stage2_gamma
  inputs = workloads.synthetic_inputs(args.num_examples, args.input_length, cfg.vocab_size, 0)
  target = T5Decoder(target_model)
  # The second stage's bigram: fitted on the draft's own greedy outputs for other inputs.
  draft_dec = T5Decoder(draft_model)
  successor = workloads.output_bigram(draft_model, dparams, args.input_length, L).successor()
  staged_shapes = [TreeShape.parse(s) for s in args.staged_trees.split(';') if s]
  shapes = [TreeShape.parse(s) for s in args.trees.split(';')]
  shapes += [s for s in staged_shapes if s not in shapes]
  chain, staged = ModelDraft.t5(draft_model), StagedDraft.t5(draft_model, g2)
  tree_draft, staged_tree = TreeModelDraft.t5(draft_model), TreeModelDraft.t5(draft_model, g2)
  bytes_t, bytes_d = workloads.tree_bytes(params), workloads.tree_bytes(dparams)

  def methods(config):
    """name -> (run(enc) -> result, draft calls per loop iteration; None: the result counts them
    (`draft_calls`) or there is no draft)."""
    out = {'autoregressive': (lambda enc: autoregressive.decode(
        target, target.init(params, enc, L + 1), jax.random.PRNGKey(1), max_decode_len=L,
        config=config), None)}
    slots = cache_length(L, gamma + 1)
    out[f'chain gamma={gamma}'] = (lambda enc: speculative.decode(
        target, target.init(params, enc, slots), chain, chain.init(dparams, enc, L, gamma),
        jax.random.PRNGKey(1), gamma=gamma, max_decode_len=L, config=config), gamma)
    for shape in shapes:
      out[f'tree {shape.describe()}'] = (lambda enc, shape=shape: tree_speculative.decode(
          target, target.init(params, enc, cache_length(L, shape.num_nodes + 1)),
          tree_draft, tree_draft.init(dparams, enc, L, shape), jax.random.PRNGKey(1),
          shape=shape, max_decode_len=L, config=config), shape.depth)
    for shape in staged_shapes:
      out[f'staged tree {shape.describe()}, bigram {g2}/node'] = (
          lambda enc, shape=shape: tree_speculative.decode(
              target, target.init(params, enc, cache_length(L, shape.num_nodes + 1)),
              staged_tree, staged_tree.init(dparams, enc, L, shape, successor),
              jax.random.PRNGKey(1), shape=shape, max_decode_len=L, config=config), None)
    out[f'staged gamma={gamma}, bigram {g2}/call'] = (lambda enc: speculative.decode(
        target, target.init(params, enc, slots), staged,
        staged.init(dparams, enc, L, gamma, successor), jax.random.PRNGKey(1), gamma=gamma,
        max_decode_len=L, config=config), None)
    return out

  rows: List[Dict[str, Any]] = []
  for temp in [float(t) for t in args.temperatures.split(',')]:
    config = SamplingConfig(temperature=temp)
    for batch in [int(b) for b in args.batch_sizes.split(',')]:
      batches = [jnp.asarray(inputs[i:i + batch]) for i in range(0, len(inputs), batch)]
      ms = methods(config)
      runs = {name: (lambda fn=fn: [fn(enc) for enc in batches]) for name, (fn, _) in ms.items()}
      results = {name: jax.block_until_ready(run()) for name, run in runs.items()}  # compile
      times = {name: [] for name in runs}
      for _ in range(args.repeats):  # interleaved: every method once per repeat
        for name, run in runs.items():
          times[name].append(common.seconds(run))
      ar_lists = sum((autoregressive.strip(r.sequences, r.lengths)
                      for r in results['autoregressive']), [])
      base = {}
      for name, res in results.items():
        secs = statistics.median(times[name])
        tokens = sum(int(r.lengths.sum()) for r in res)
        iters = sum(int(r.loop_iterations) for r in res)  # batched target calls
        calls = sum(int(r.target_calls.sum()) for r in res)  # per row, active rows only
        per_iter = ms[name][1]
        draft_calls = (sum(int(r.draft_calls) for r in res)  # batched draft calls, if counted
                       if getattr(res[0], 'draft_calls', None) is not None else None)
        if per_iter is not None:
          draft_calls = per_iter * iters
        draft_bytes = None if draft_calls is None else bytes_d * draft_calls / tokens
        row = {'method': name, 'temperature': temp, 'batch_size': batch, 'tokens': tokens,
               'target_calls_per_row_sum': calls, 'tokens_per_target_call': tokens / calls,
               'seconds': secs, 'tokens_per_second': tokens / secs,
               'target_param_bytes_per_token': bytes_t * iters / tokens,
               'draft_param_bytes_per_token': 0 if name == 'autoregressive' else draft_bytes,
               'draft_calls': draft_calls, 'loop_iterations': iters,
               'tokens_equal_autoregressive': (sum((autoregressive.strip(r.sequences, r.lengths)
                                                    for r in res), []) == ar_lists)
                                              if temp == 0 else None}
        if name == 'autoregressive':
          base['ar'] = row
        elif name.startswith('chain'):
          base['chain'] = row
          alpha = (sum(float(r.beta_sum) for r in res)
                   / max(sum(float(r.beta_count) for r in res), 1.0))
          row['alpha'] = alpha
        rows.append(row)
      tstate = target.init(params, batches[0], L + gamma + 2)
      t1 = timing.step_time(target, tstate, 1, L // 2)
      c = timing.step_time(draft_dec, draft_dec.init(dparams, batches[0], L + gamma + 2), 1,
                            L // 2) / t1
      for row in rows[-len(results):]:
        row['speedup_over_autoregressive'] = row['tokens_per_second'] / base['ar']['tokens_per_second']
        row['speedup_over_chain'] = row['tokens_per_second'] / base['chain']['tokens_per_second']
        if 'alpha' in row:
          row['c'] = c
          row['speedup_thm8'] = theory.walltime_improvement(min(row['alpha'], 0.999), gamma, c)
        common.print_row(row)
      # Written after every (temperature, batch) group: a cut-short run keeps what it measured.
      write({'pair': pair, 'command': common.command(__file__, argv), 'rows': rows,
             'num_examples': len(inputs), 'max_decode_len': L,
             'loadavg_after': os.getloadavg(), 'machine': common.machine()}, args.out)


def write(results: Dict[str, Any], out: str) -> None:
  common.write_json(out, results)
  lines = ['# Token trees and staged speculation vs chain speculation', '',
           f'Pair: {results["pair"]}', '', f'Command: `{results["command"]}`', '',
           f'{results["num_examples"]} inputs, max decode length {results["max_decode_len"]}; '
           'methods interleaved in one run, median of repeats. The CPU was SHARED with other '
           f'jobs (load average after the run: {results["loadavg_after"]}); timings are noisy. '
           'Bytes: parameters read per generated token (Spector & Re Table 1\'s form; K/V not '
           'counted; draft calls: batched draft decode calls, measured for staged rows).', '',
           '| method | T | batch | tok/call | tok/s | vs AR | vs chain | target MB/tok | '
           'draft MB/tok | draft calls / iteration | = AR | Thm 8 |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|']
  mb = lambda x: '-' if x is None else f'{x / 1e6:.2f}'
  for r in results['rows']:
    thm = f'{r["speedup_thm8"]:.2f}x (alpha {r["alpha"]:.2f}, c {r["c"]:.2f})' if 'alpha' in r else ''
    calls = ('-' if r.get('draft_calls') is None
             else f'{r["draft_calls"] / max(r["loop_iterations"], 1):.2f}')
    lines.append(f'| {r["method"]} | {r["temperature"]:g} | {r["batch_size"]} | '
                 f'{r["tokens_per_target_call"]:.2f} | {r["tokens_per_second"]:.1f} | '
                 f'{r["speedup_over_autoregressive"]:.2f}x | {r["speedup_over_chain"]:.2f}x | '
                 f'{mb(r["target_param_bytes_per_token"])} | {mb(r["draft_param_bytes_per_token"])} '
                 f'| {calls} | {r["tokens_equal_autoregressive"]} | {thm} |')
  common.write_lines(out + '.md', lines)


if __name__ == '__main__':
  main()
