"""`--gamma auto` against every fixed gamma and against greedy decoding, side by side in one run.

  python -m benchmarks.adaptive_gamma [--target CKPT --draft CKPT] [--drafts bigram,perturbed] \
      [--batches 1,8] [--temperatures 0,1] [--gammas 1,2,3,4,5,6,7,8] [--gamma-max 8] \
      [--max-decode-len 32] [--input-length 32] [--repeats 3] [--out results/benchmarks/adaptive_gamma]

For each draft, batch size and temperature, on the same synthetic inputs (one batch): our jitted
autoregressive decoding, speculative decoding at each fixed gamma, and `adaptive.decode` with the
`optimal` policy (c and v measured once per draft and batch with `adaptive.measure_costs`, as
`generate --gamma auto` does) and the `heuristic` policy. Each time is the median of `--repeats`
calls after a warm-up (compile) call; `x greedy` is tokens per second over greedy's in the same
cell (sampling runs generate different numbers of tokens); `auto / best fixed` compares with the
fastest fixed gamma of the cell, found by this very sweep (the sweep a user would have to run).

Without `--target`, the pair is `workloads.demo_pair` (UNTRAINED, and the output says so): a
random-init `mini` target with drafts `bigram` (fitted on the target's own greedy outputs for other
inputs: c small, alpha moderate) and `perturbed` (the target's weights + noise: alpha high, c ~ 1).
A trained pair is what the issue's goals are about; pass it with --target/--draft.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from gqa_spec.decoding import adaptive, autoregressive, speculative
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.drafts import ModelDraft, NgramDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder


def _ints(text: str) -> List[int]:
  return [int(x) for x in text.split(',') if x]


def drafts_of(args, target_model, params) -> Dict[str, Any]:
  """name -> (draft, init(encoder tokens) -> draft state), and whether the pair is the demo's."""
  gmax = max(args.gamma_max, max(_ints(args.gammas)))
  L = args.max_decode_len
  if args.target:
    model, dparams = workloads.checkpoint_model(args.draft)
    draft = ModelDraft.t5(model)
    return {'checkpoint': (draft, lambda enc: draft.init(dparams, enc, L, gmax))}
  _, _, model_drafts = workloads.demo_pair(args.perturb)
  out = {}
  for name in args.drafts.split(','):
    if name == 'bigram':
      vocab = target_model.config.vocab_size
      table = NgramDraft(vocab).init(
          workloads.output_bigram(target_model, params, args.input_length, L))
      out[name] = (NgramDraft(vocab), lambda enc, t=table: t)
    else:
      model, dparams = model_drafts[name]
      draft = ModelDraft.t5(model)
      out[name] = (draft, lambda enc, d=draft, p=dparams: d.init(p, enc, L, gmax))
  return out


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  if args.target:
    target_model, params = workloads.checkpoint_model(args.target)
  else:
    target_model, params, _ = workloads.demo_pair(args.perturb)
  target = T5Decoder(target_model)
  L, gmax = args.max_decode_len, args.gamma_max
  gammas = _ints(args.gammas)
  slots = speculative.target_cache_length(L, max(gmax, max(gammas)))
  rows = []
  for draft_name, (draft, dinit) in drafts_of(args, target_model, params).items():
    for batch in _ints(args.batches):
      enc = jnp.asarray(workloads.synthetic_inputs(batch, args.input_length,
                                                   target_model.config.vocab_size, seed=0))
      tstate = target.init(params, enc, slots)
      ar_state = target.init(params, enc, L + 1)
      dstate = dinit(enc)
      c, v = adaptive.measure_costs(target, tstate, draft, dstate, L, gmax)
      for temperature in [float(t) for t in args.temperatures.split(',')]:
        config = SamplingConfig(temperature=temperature)
        rng = jax.random.PRNGKey(0)
        runs = {'no draft': lambda: autoregressive.decode(
            target, ar_state, rng, max_decode_len=L, config=config)}
        for g in gammas:
          runs[f'gamma={g}'] = (lambda g=g: speculative.decode(
              target, tstate, draft, dstate, rng, gamma=g, max_decode_len=L, config=config))
        for policy in ('optimal', 'heuristic'):
          auto = AdaptiveGamma(gamma_max=gmax, policy=policy,
                               cost_ratio=c if policy == 'optimal' else 0.0,
                               verify_ratio=v if policy == 'optimal' else 1.0)
          runs[f'auto:{policy}'] = (lambda a=auto: adaptive.decode(
              target, tstate, draft, dstate, rng, adaptive=a, max_decode_len=L, config=config))
        cell = []
        for method, fn in runs.items():
          result = jax.block_until_ready(fn())
          seconds = common.median_seconds(fn, args.repeats)
          tokens = int(np.sum(np.asarray(result.lengths)))
          calls = int(np.sum(np.asarray(result.target_calls))) if hasattr(
              result, 'target_calls') else tokens
          row = {'draft': draft_name, 'batch': batch, 'temperature': temperature,
                 'method': method, 'seconds': seconds, 'tokens': tokens,
                 'tokens_per_second': tokens / seconds, 'tokens_per_call': tokens / max(calls, 1),
                 'cost_ratio': c if method == 'auto:optimal' else None,
                 'verify_ratio': v if method == 'auto:optimal' else None}
          if method.startswith('auto'):
            summary = speculative.summarize(result)
            row.update(gamma_histogram=summary['gamma_histogram'],
                       draft_steps=summary['draft_steps'],
                       draft_steps_saved=summary['draft_steps_saved'])
          cell.append(row)
        base = cell[0]['tokens_per_second']
        best_fixed = max(r['tokens_per_second'] for r in cell if r['method'].startswith('gamma='))
        for r in cell:
          r['x_greedy'] = r['tokens_per_second'] / base
          r['x_best_fixed'] = r['tokens_per_second'] / best_fixed
          common.print_row({k: v for k, v in r.items() if not isinstance(v, list)})
        rows.extend(cell)
  return rows


def markdown(result: Dict[str, Any]) -> List[str]:
  cells = [(r['draft'], r['batch'], r['temperature'], r['method'], f'{r["seconds"]:.3f}',
            r['tokens'], f'{r["tokens_per_call"]:.2f}', f'{r["x_greedy"]:.2f}',
            f'{r["x_best_fixed"]:.2f}',
            '' if r.get('gamma_histogram') is None else
            f'{r["gamma_histogram"]} (saved {r["draft_steps_saved"]})',
            '' if r['cost_ratio'] is None else f'{r["cost_ratio"]:.3f} / {r["verify_ratio"]:.2f}')
           for r in result['rows']]
  pair = ('the built-in UNTRAINED demo pair (`workloads.demo_pair`)' if not result['trained']
          else 'the trained pair of the command line')
  lines = common.table_report(
      '--gamma auto against fixed gamma and greedy decoding', result,
      f'On {pair}; one batch of synthetic inputs per cell; seconds: median of {result["repeats"]} '
      'calls after a compile call; x greedy: tokens/s over the cell\'s autoregressive decoding; '
      'x best fixed: over the fastest fixed gamma of the cell; gamma histogram: target calls per '
      'draft length (0..gamma_max), all rows; saved: draft decode calls saved against gamma_max '
      'per iteration; c / v: the measured draft cost ratio and verification cost ratio the optimal '
      'policy used (`adaptive.measure_costs`).',
      ['draft', 'batch', 'T', 'method', 'seconds', 'tokens', 'tokens/call', 'x greedy',
       'x best fixed', 'gamma histogram', 'c / v'], cells)
  return lines + common.result_load_note(
      result, ': the machine was shared with other jobs; ratios within a cell were measured '
              'side by side, absolute times are not representative.')


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--target')
  p.add_argument('--draft', help='draft checkpoint (with --target)')
  p.add_argument('--drafts', default='bigram,perturbed', help='demo pair drafts: bigram,perturbed,nano')
  p.add_argument('--perturb', type=float, default=0.05)
  p.add_argument('--batches', default='1,8')
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--gammas', default='1,2,3,4,5,6,7,8')
  p.add_argument('--gamma-max', type=int, default=8)
  p.add_argument('--max-decode-len', type=int, default=32)
  p.add_argument('--input-length', type=int, default=32)
  p.add_argument('--repeats', type=int, default=3)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  if bool(args.target) != bool(args.draft):
    p.error('--target and --draft go together')
  before = os.getloadavg()
  rows = measure(args)
  result = common.results(__file__, argv, rows, before, trained=bool(args.target),
                          repeats=args.repeats)
  common.write_report(args.out, result, markdown(result))
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
