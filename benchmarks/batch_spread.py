"""How much of a batch's speculative speed is the luck of its inputs, and what the batch pricing
predicts of it: iterations per batch of fixed-gamma speculative decoding against
`theory.batch_inflation`'s price, at T = 0 (no timing: counts, the same on every run).

  python -m benchmarks.batch_spread --pair NAME TARGET DRAFT TASK [--pair ...] --data-dir DIR \
      [--splits test] [--examples 72] [--batch 8] [--gammas 1,2,3,4] [--gamma-max 8] \
      [--max-decode-len 32] [--input-length 64] [--out results/benchmarks/batch_spread]

For every batch of `--batch` inputs (the first `--examples` of `--splits`): greedy decoding's row
lengths and iterations (the longest row's length), and at each gamma the iterations of
`speculative.decode`'s batch loop and its acceptance (accepted over tried positions). A batch loop
runs until its slowest row is done, so its iterations, and with them its speed over greedy
decoding (greedy iterations over these, times the iteration's price), move from batch to batch
with the inputs: the spread across batches is what one batch of a benchmark cell reads as speed.
Next to it the price `--gamma auto` decides with, E[iterations] = Eq. 1 inflated by the wait for
the slowest row (`theory.batch_inflation`), from
  own    each batch's own row lengths and its own acceptance at that gamma (the model's error
         where its inputs are known: the mean error is its bias, the rms its spread);
  first  the first batch's lengths and gamma-1 acceptance, for every batch (what the calibration
         reads at batch 8, `calibration.CALIBRATION_POSITIONS`), against the batches' mean;
  two    the first two batches' (`CALIBRATION_POSITIONS` doubled), against the mean;
  all    every batch's lengths and their mean gamma-1 acceptance, against the mean.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from benchmarks.adaptive_gamma import _ints, add_pair_arguments, task_inputs
from gqa_spec.decoding import autoregressive, speculative, theory
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length


def price(alpha: float, gamma: int, lengths: theory.Lengths, gamma_max: int) -> float:
  """The expected iterations of one batch whose rows need `lengths` (one or several batches: their
  mean), at acceptance `alpha` and draft length `gamma`: the longest rows' tokens over Eq. 1's
  tokens a call, inflated by the wait for the slowest row (`theory.batch_inflation`)."""
  inflation = theory.batch_inflation(np.array([alpha]), gamma_max, lengths)[0, gamma]
  longest = sum(max(b) for b in lengths) / len(lengths)
  return float(inflation * longest / theory.expected_tokens(alpha, gamma))


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  L, G, b = args.max_decode_len, args.gamma_max, args.batch
  gammas = _ints(args.gammas)
  if max(gammas) > G:
    raise SystemExit(f'--gammas go up to --gamma-max ({G}), got {max(gammas)}')
  slots = cache_length(L, G + 1)
  rng = jax.random.PRNGKey(0)
  rows = []
  for name, target_path, draft_path, task in args.pair:
    target_model, params = workloads.checkpoint_model(target_path)
    draft_model, dparams = workloads.checkpoint_model(draft_path)
    target, draft = T5Decoder(target_model), ModelDraft.t5(draft_model)
    inputs = task_inputs(task, args.data_dir, args.examples, args.input_length, L, args.splits)
    for i in range(0, args.examples - b + 1, b):
      enc = jnp.asarray(inputs[i:i + b])
      greedy = autoregressive.decode(target, target.init(params, enc, L + 1), rng,
                                     max_decode_len=L)
      row = {'pair': name, 'task': task, 'batch_index': i // b, 'batch': b,
             'lengths': [int(x) for x in greedy.lengths],
             'greedy_iterations': int(greedy.loop_iterations)}
      for g in gammas:
        out = speculative.decode(target, target.init(params, enc, slots), draft,
                                 draft.init(dparams, enc, L, G), rng, gamma=g, max_decode_len=L)
        row[f'gamma={g}'] = {'iterations': int(out.loop_iterations),
                             'acceptance': float(out.beta_sum) / max(float(out.beta_count), 1.0)}
      common.print_row({k: v for k, v in row.items() if k != 'lengths'})
      rows.append(row)
    jax.clear_caches()
  return rows


def summary(rows: List[Dict[str, Any]], gamma_max: int) -> List[Dict[str, Any]]:
  """Per pair and gamma: the iterations' mean and spread across batches, and each price's error."""
  out = []
  for name in dict.fromkeys(r['pair'] for r in rows):
    batches = [r for r in rows if r['pair'] == name]
    lengths = [(tuple(float(x) for x in r['lengths']),) for r in batches]
    alpha1 = [r['gamma=1']['acceptance'] for r in batches if 'gamma=1' in r]
    for key in [k for k in batches[0] if k.startswith('gamma=')]:
      g = int(key.split('=')[1])
      ran = np.array([r[key]['iterations'] for r in batches], np.float64)  # [n]
      speed = np.array([r['greedy_iterations'] for r in batches]) / ran  # [n] before the price
      own = np.array([price(r[key]['acceptance'], g, lengths[j], gamma_max)
                      for j, r in enumerate(batches)]) / ran - 1.0  # [n]
      pooled = lambda n: price(float(np.mean(alpha1[:n])), g, sum(lengths[:n], ()), gamma_max)
      mean = float(np.mean(ran))
      out.append({'pair': name, 'gamma': g, 'batches': len(batches), 'iterations_mean': mean,
                  'iterations_sd': float(np.std(ran, ddof=1)) if len(ran) > 1 else 0.0,
                  'speed_spread': float(np.max(speed) / np.min(speed)),
                  'own_mean_error': float(np.mean(own)),
                  'own_rms_error': float(np.sqrt(np.mean(own ** 2))),
                  **({'first_error': pooled(1) / mean - 1.0,
                      'two_error': pooled(2) / mean - 1.0 if len(batches) > 1 else None,
                      'all_error': pooled(len(batches)) / mean - 1.0} if alpha1 else {})})
  return out


def markdown(result: Dict[str, Any]) -> List[str]:
  pct = lambda x: '' if x is None else f'{100 * x:+.1f}%'
  cells = [(s['pair'], s['gamma'], s['batches'], f'{s["iterations_mean"]:.2f}',
            f'{s["iterations_sd"]:.2f} ({100 * s["iterations_sd"] / s["iterations_mean"]:.1f}%)',
            f'{s["speed_spread"]:.2f}', pct(s['own_mean_error']),
            f'{100 * s["own_rms_error"]:.1f}%', pct(s.get('first_error')),
            pct(s.get('two_error')), pct(s.get('all_error'))) for s in result['summary']]
  return common.table_report(
      'Batch loops: iterations per batch against the batch pricing', result,
      f'Fixed-gamma speculative decoding at T = 0 in batches of {result["batch"]}, each batch '
      'counted once (deterministic). iterations: of the batch loop, mean and standard deviation '
      'across batches; speed spread: the fastest batch\'s greedy iterations over its own, over '
      'the slowest\'s (what a cell of one batch reads as speed before any timing noise); price '
      'error, (priced - ran) / ran: own, each batch priced from its own row lengths and '
      'acceptance (mean: the bias; rms: the spread); first / two / all: one price from the first '
      'batch, the first two, every batch (lengths, and the mean gamma-1 acceptance), against the '
      'mean iterations. The module docstring has the definitions.',
      ['pair', 'gamma', 'batches', 'iterations', 'sd', 'speed spread', 'own: mean error',
       'own: rms', 'first', 'two', 'all'], cells)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_pair_arguments(p, 'a trained pair and the task whose inputs it decodes (repeatable)',
                     required=True)
  p.add_argument('--examples', type=int, default=72, help='inputs, in batches of --batch')
  p.add_argument('--batch', type=int, default=8)
  p.add_argument('--gammas', default='1,2,3,4')
  p.add_argument('--gamma-max', type=int, default=8)
  p.add_argument('--max-decode-len', type=int, default=32)
  p.add_argument('--input-length', type=int, default=64)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  if args.examples < args.batch:
    p.error('--examples must be at least --batch')
  before = os.getloadavg()
  rows = measure(args)
  result = common.results(__file__, argv, rows, before, batch=args.batch,
                          summary=summary(rows, args.gamma_max))
  common.write_report(args.out, result, markdown(result))
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
