"""`--tree best:auto` against fixed best-first trees and greedy decoding, side by side in one run.

  python -m benchmarks.adaptive_tree --pair NAME TARGET DRAFT TASK ... [--data-dir DIR] \
      [--splits test] [--examples 8] [--pair-drafts draft,bigram] [--batches 1,8] \
      [--temperatures 0,1] \
      [--nodes 2,4,8,16] [--nodes-max 16] [--depth 4] [--max-decode-len 32] [--repeats 7] \
      [--shuffle] [--confirm 0] [--seeds 1] [--out results/benchmarks/adaptive_tree]

The tree counterpart of `benchmarks/adaptive_gamma.py` (same pairs, inputs, interleaved timing and
goals; see its docstring). For each pair, tree draft, batch size and temperature, on the same
inputs: our jitted autoregressive decoding ("greedy decoding": one target call per token), tree
speculative decoding with each fixed best-first tree `best:N,depth:D` (`tree_speculative.decode`),
and `adaptive_tree.decode` with `best:auto:N_max,depth:D` (c and v measured once per pair, batch
size and temperature with `adaptive_tree.measure_costs`, as `generate --tree best:auto...` does on
its first batch;
the seconds that took are recorded). Tree drafts: the pair's draft model grown as a tree
(`TreeModelDraft`) and a bigram fitted on the task's training targets (`NgramTreeDraft`).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, Dict, List

import jax
import numpy as np

from benchmarks import common, workloads
from benchmarks.adaptive_gamma import (_ints, add_confirm_argument, add_pair_arguments,
                                       add_seeds_argument, add_shuffle_argument, batches_of,
                                       goal_lines, goals, measure_cell, order_words, partial_note,
                                       sampling_keys, seeds_words, split_held_out, split_words,
                                       task_inputs, x_best_fixed_cell)
from gqa_spec.data import exported
from gqa_spec.decoding import adaptive_tree, autoregressive, speculative, tree_speculative
from gqa_spec.decoding.adaptive_tree import AdaptiveTree
from gqa_spec.decoding.drafts.ngram import fit_ngram_on_task
from gqa_spec.decoding.drafts.ngram_tree import NgramTreeDraft
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.decoding.tree import TreeShape


def tree_drafts(args, task: str, target_model, draft_path: str) -> Dict[str, Any]:
  """name -> (draft, init(encoder tokens, shape) -> draft state), the pair's tree drafts."""
  L = args.max_decode_len
  out = {}
  names = args.pair_drafts.split(',')
  if 'draft' in names:
    model, dparams = workloads.checkpoint_model(draft_path)
    draft = TreeModelDraft.t5(model)
    out['draft model'] = (draft, lambda enc, shape, d=draft, p=dparams: d.init(p, enc, L, shape))
  if 'bigram' in names:
    vocab = target_model.config.vocab_size
    ngram = fit_ngram_on_task(task, 2).for_model(vocab, task)
    draft = NgramTreeDraft(vocab)
    out['bigram'] = (draft, lambda enc, shape, d=draft, m=ngram: d.init(m, shape))
  return out


def measure(args: argparse.Namespace,
            on_cell: Callable[[List[Dict[str, Any]]], None] = lambda rows: None
            ) -> List[Dict[str, Any]]:
  """Every cell's rows; `on_cell(rows so far)` after each cell."""
  L, D = args.max_decode_len, args.depth
  shapes = {f'best:{n},depth:{D}': TreeShape.parse(f'best:{n},depth:{D}')
            for n in _ints(args.nodes)}
  auto_spec = f'best:auto:{args.nodes_max},depth:{D}'
  rows = []
  for name, target_path, draft_path, task in args.pair:
    target_model, params = workloads.checkpoint_model(target_path)
    target = T5Decoder(target_model)
    inputs = split_held_out(task_inputs(task, args.data_dir,
                                        args.examples * (2 if args.confirm else 1),
                                        args.input_length, L, args.splits),
                            args.examples, args.confirm)
    for draft_name, (draft, dinit) in tree_drafts(args, task, target_model, draft_path).items():
      for batch in _ints(args.batches):
        encs, held = batches_of(inputs['inputs'], batch), batches_of(inputs['held_out'], batch)
        states = lambda encs, dinit=dinit: (
            [target.init(params, enc, L + 1) for enc in encs],
            {spec: ([target.init(params, enc, cache_length(L, s.num_nodes + 1))
                     for enc in encs], [dinit(enc, s) for enc in encs])
             for spec, s in shapes.items()})
        ar_states, fixed = states(encs)
        for temperature in [float(t) for t in args.temperatures.split(',')]:
          config = SamplingConfig(temperature=temperature)
          auto = AdaptiveTree.parse(auto_spec)
          auto_t = [target.init(params, enc, cache_length(L, auto.call_tokens))
                    for enc in encs]
          auto_d = [dinit(enc, auto.shape) for enc in encs]
          t0 = time.perf_counter()
          cal = adaptive_tree.measure_costs(target, auto_t[0], draft, auto_d[0], L, auto,
                                            more=zip(auto_t[1:], auto_d[1:]), config=config)
          calibration = time.perf_counter() - t0
          auto = auto.calibrated(cal)
          if not auto.speculates:  # as `generate` allocates: greedy decoding's cache, no draft
            auto_t = [target.init(params, enc, cache_length(L, auto.call_tokens))
                      for enc in encs]
            auto_d = [None] * len(encs)
          rngs = sampling_keys(args.seeds, temperature)

          def cell_runs(ar_states, fixed, auto_t, auto_d, config=config, auto=auto,
                        draft=draft):
            """The cell's methods on these batches' states (the sweep's calibration)."""
            runs = {'no draft': lambda: [autoregressive.decode(
                target, s, rng, max_decode_len=L, config=config)
                for rng in rngs for s in ar_states]}
            for spec, shape in shapes.items():
              ts, ds = fixed[spec]
              runs[spec] = (lambda shape=shape, ts=ts, ds=ds: [tree_speculative.decode(
                  target, t, draft, d, rng, shape=shape, max_decode_len=L, config=config)
                  for rng in rngs for t, d in zip(ts, ds)])
            runs[auto_spec] = lambda: [adaptive_tree.decode(
                target, t, draft, d, rng, adaptive=auto, max_decode_len=L, config=config)
                for rng in rngs for t, d in zip(auto_t, auto_d)]
            return runs

          runs = cell_runs(ar_states, fixed, auto_t, auto_d)
          held_runs = None
          if held is not None:
            held_t = [target.init(params, enc, cache_length(L, auto.call_tokens))
                      for enc in held]
            held_d = ([dinit(enc, auto.shape) for enc in held] if auto.speculates
                      else [None] * len(held))
            held_runs = cell_runs(*states(held), held_t, held_d)
          key = {'pair': name, 'task': task, 'draft': draft_name, 'batch': batch,
                 'temperature': temperature}

          def extra(method, results, cal=cal, auto=auto, calibration=calibration):
            if method != auto_spec:
              return {}
            nodes = [speculative.tree_nodes_summary(r) for r in results]
            return dict(cost_ratio=cal.cost_ratio, verify_ratio=list(cal.verify_ratio),
                        alpha_init=cal.alpha, accepted_init=list(cal.accepted),
                        speculated=auto.speculates,
                        calibration_seconds=calibration,
                        nodes_histogram=[int(x) for x in np.sum(
                            [n['tree_nodes_histogram'] for n in nodes], axis=0)])

          cell = measure_cell(runs, args.repeats, key, extra, lambda m, s=shapes: m in s,
                              args.shuffle, args.confirm, held_runs)
          rows.extend(cell)
          on_cell(rows)
          jax.clear_caches()  # as adaptive_gamma: LLVM runs out of memory after ~230 programs
  return rows


def markdown(result: Dict[str, Any]) -> List[str]:
  cells = [(r['pair'], r['draft'], r['batch'], r['temperature'], r['method'],
            f'{r["seconds"]:.3f}', r['tokens'], f'{r["tokens_per_call"]:.2f}',
            '' if r.get('acceptance_rate') is None else f'{r["acceptance_rate"]:.2f}',
            f'{r["x_greedy"]:.2f}', x_best_fixed_cell(r),
            '' if r.get('nodes_histogram') is None else str(r['nodes_histogram']),
            '' if r['cost_ratio'] is None else
            f'{r["cost_ratio"]:.3f} / {" ".join(f"{x:.2f}" for x in r["verify_ratio"])} / '
            f'{r["alpha_init"]:.2f}'
            + (f' / {" ".join(f"{x:.2f}" for x in r["accepted_init"])}'
               if r.get('accepted_init') else '') + f' ({r["calibration_seconds"]:.1f} s)')
           for r in result['rows']]
  lines = common.table_report(
      '--tree best:auto against fixed best-first trees and greedy decoding', result,
      'On the trained pairs of the command line (`--pair`), on their tasks\' '
      f'{split_words(result)}; '
      f'{result["examples"]} inputs per cell in batches of the cell\'s size; seconds: all of '
      f'them{seeds_words(result)}, median of {result["repeats"]} interleaved rounds (methods in '
      f'turn, {order_words(result)}) after a compile call; x greedy: tokens/s over the cell\'s '
      'autoregressive decoding; x best fixed: over the fastest fixed tree of the cell (in '
      'brackets: confirmed, see the goals); tokens/call: tokens per target call; acc.: '
      'accepted / proposed (verified) nodes; node histogram: target calls per node count asked '
      '(0..N_max), all rows; c / v / alpha: what the adaptive tree used, measured by '
      '`adaptive_tree.measure_costs` once per pair, batch size and temperature (in the seconds '
      'given, compiles included; not in the timed runs), in steps of autoregressive decoding at '
      'the cell\'s temperature: one of the tree\'s D draft calls, the loop\'s iteration at each '
      'compiled width less its draft calls, and the starting alpha (the top node\'s greedy '
      'agreement with greedy decoding over its output on the first batch, the true prefix fed, '
      'or where the loop was timed, its acceptance at one node per call; where even the first '
      'pays for no tree, the run is greedy decoding from the start), and where the loop was '
      'timed, the prior: draft tokens it accepted per call at each width; no draft (again): greedy '
      'decoding timed a '
      'second time (the A/A control).',
      ['pair', 'draft', 'batch', 'T', 'method', 'seconds', 'tokens', 'tokens/call', 'acc.',
       'x greedy', 'x best fixed', 'node histogram', 'c / v / alpha'], cells)
  lines += goal_lines(result, result['auto_spec'], 'fixed tree') + partial_note(result)
  return lines + common.result_load_note(
      result, ': the machine was shared with other jobs; ratios within a cell were measured '
              'side by side (interleaved), absolute times are not representative.')


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_pair_arguments(
      p, 'a trained pair and the task whose test inputs it decodes (repeatable)', required=True)
  p.add_argument('--examples', type=int, default=8, help='inputs per cell')
  p.add_argument('--pair-drafts', default='draft,bigram',
                 help="tree drafts of each --pair: 'draft' (its DRAFT model), 'bigram'")
  p.add_argument('--batches', default='1,8')
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--nodes', default='2,4,8,16', help='the fixed trees best:N,depth:D')
  p.add_argument('--nodes-max', type=int, default=16, help='N_max of best:auto:N_max,depth:D')
  p.add_argument('--depth', type=int, default=4)
  p.add_argument('--max-decode-len', type=int, default=32)
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--repeats', type=int, default=7)
  add_shuffle_argument(p)
  add_confirm_argument(p)
  add_seeds_argument(p)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  if any(not exported.is_exported(task) for *_, task in args.pair) and not args.data_dir:
    p.error('--pair with a seqio task needs --data-dir (an exported:DIR/TASK task does not)')
  if any(args.examples % b for b in _ints(args.batches)):
    p.error('--examples must be a multiple of every batch size')
  before = os.getloadavg()
  auto_spec = f'best:auto:{args.nodes_max},depth:{args.depth}'
  fixed = [f'best:{n},depth:{args.depth}' for n in _ints(args.nodes)]

  def write(rows, complete):
    result = common.results(__file__, argv, rows, before, repeats=args.repeats,
                            examples=args.examples, auto_spec=auto_spec,
                            goals=goals(rows, auto_spec, lambda m: m in fixed), complete=complete,
                            shuffle=args.shuffle, confirm=args.confirm, seeds=args.seeds,
                            splits=list(args.splits))
    common.write_report(args.out, result, markdown(result))

  # As adaptive_gamma: rewritten after every cell (`complete`: every cell was measured).
  write(measure(args, lambda rows: write(rows, False)), True)
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
