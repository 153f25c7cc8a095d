"""What `--gamma auto`'s loop costs an iteration over `speculative.decode` at the same gamma, on a
trained pair and its task's test inputs.

  python -m benchmarks.adaptive_loop_cost --pair NAME TARGET DRAFT TASK --data-dir DIR \
      [--batch 8] [--gammas 1,2] [--temperature 0] [--repeats 9] [--shuffle] [--out ...]

Why: in `adaptive_gamma`'s batch-8 cells the optimal policy sometimes proposes the best fixed gamma
at every call and still runs several percent slower than that gamma's `speculative.decode`
(results/benchmarks/adaptive_gamma_smoke_widened_batch_priced.md). `adaptive_overhead.py`
splits a call's fixed cost from an iteration's on a random-init target with a bigram draft; this
times the same loops on a trained pair with its model draft (`ModelDraft.propose_upto`, the
draft's early stop) at a batch's real lengths. Methods, per gamma, on the first `--batch` test
inputs, in interleaved rounds (order rotated, or `--shuffle`d), medians:
  * speculative: `speculative.decode` at gamma;
  * fixed: `adaptive.decode`, policy 'fixed' at gamma, gamma_max 8 (a loop per verification
    width, the draft's early stop, the adaptive statistics; no choice made);
  * fixed, one width: the same with gamma_max = gamma and `one_width` (one loop; its statistics
    gamma wide);
  * held: `adaptive.decode`, policy 'optimal' held at gamma (the calibration's program: the
    policy's choice made every iteration and not taken).
Greedy decoding is the unit (steps an iteration) and its own row.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import adaptive_gamma, common
from gqa_spec.decoding import adaptive, autoregressive, speculative
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length

GAMMA_MAX = 8


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  L = args.max_decode_len
  args.examples, args.pair_drafts, args.gamma_max = args.batch, 'draft', GAMMA_MAX
  [pair] = adaptive_gamma.pairs_of(args)
  target, params = T5Decoder(pair['target_model']), pair['params']
  draft, dinit = pair['drafts']['draft model']
  enc = jnp.asarray(pair['inputs'][:args.batch])
  tstate = target.init(params, enc, cache_length(L, GAMMA_MAX + 1))
  dstate, plain = dinit(enc), target.init(params, enc, L + 1)
  config, rng = SamplingConfig(temperature=args.temperature), jax.random.PRNGKey(0)
  decode = lambda a, **kw: adaptive.decode(target, tstate, draft, dstate, rng, adaptive=a,
                                           max_decode_len=L, config=config, **kw)
  runs = {('greedy', 0): lambda: autoregressive.decode(target, plain, rng, max_decode_len=L,
                                                       config=config)}
  held_policy = AdaptiveGamma(gamma_max=GAMMA_MAX, cost_ratio=0.02, verify_ratio=1.5,
                              alpha_init=0.85)  # constants only: the program is the policy's
  for g in adaptive_gamma._ints(args.gammas):  # pylint: disable=protected-access
    runs[('speculative', g)] = lambda g=g: speculative.decode(
        target, tstate, draft, dstate, rng, gamma=g, max_decode_len=L, config=config)
    runs[('fixed', g)] = lambda g=g: decode(AdaptiveGamma(gamma_max=GAMMA_MAX, policy='fixed',
                                                          gamma_init=g))
    runs[('fixed, one width', g)] = lambda g=g: decode(AdaptiveGamma(
        gamma_max=g, policy='fixed', gamma_init=g, one_width=True))
    runs[('held', g)] = lambda g=g: decode(held_policy, first_gammas=np.full((args.batch,), g,
                                                                             np.int32),
                                           held=np.ones((), bool))
  iterations = {}
  for key, run in runs.items():
    out = jax.block_until_ready(run())  # compiles
    counted = getattr(out, 'loop_iterations', None)
    iterations[key] = (int(counted) if counted is not None
                       else int(np.max(np.asarray(out.lengths))))  # greedy: its longest row
  times = adaptive_gamma.interleaved(runs, args.repeats, shuffle=args.shuffle)
  step = float(np.median(times[('greedy', 0)])) / iterations[('greedy', 0)]
  rows = []
  for (method, g), ts in times.items():
    per_iter = float(np.median(ts)) / iterations[(method, g)]
    base = (float(np.median(times[('speculative', g)])) / iterations[('speculative', g)]
            if g else per_iter)
    row = {'pair': pair['name'], 'batch': args.batch, 'temperature': args.temperature,
           'method': method, 'gamma': g, 'seconds': float(np.median(ts)),
           'iterations': iterations[(method, g)], 'ms_per_iteration': 1e3 * per_iter,
           'steps_per_iteration': per_iter / step, 'x_speculative_iteration': per_iter / base}
    common.print_row(row)
    rows.append(row)
  return rows


def markdown(result: Dict[str, Any]) -> List[str]:
  rows = result['rows']
  first = rows[0]
  return common.table_report(
      'The adaptive loop against speculative.decode, an iteration', result,
      f'Pair {first["pair"]}, batch {first["batch"]}, T = {first["temperature"]:g}, the first '
      f'{first["batch"]} test inputs; seconds: median of {result["repeats"]} interleaved rounds '
      f'({adaptive_gamma.order_words(result)}) after a compile call; steps/iter.: per iteration '
      'in greedy decoding steps; x spec.: an iteration over speculative.decode\'s at the same gamma (the module docstring '
      'names the methods).',
      ['method', 'gamma', 'seconds', 'iterations', 'ms/iter.', 'steps/iter.', 'x spec.'],
      [(r['method'], r['gamma'] or '', f'{r["seconds"]:.3f}', r['iterations'],
        f'{r["ms_per_iteration"]:.2f}', f'{r["steps_per_iteration"]:.2f}',
        f'{r["x_speculative_iteration"]:.3f}' if r['gamma'] else '') for r in rows]
  ) + common.result_load_note(result)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  adaptive_gamma.add_pair_arguments(p, 'the trained pair and the task whose test inputs it decodes',
                                    required=True)
  p.add_argument('--batch', type=int, default=8)
  p.add_argument('--gammas', default='1,2')
  p.add_argument('--temperature', type=float, default=0.0)
  p.add_argument('--max-decode-len', type=int, default=32)
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--repeats', type=int, default=9)
  adaptive_gamma.add_shuffle_argument(p)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  if len(args.pair) != 1:
    p.error('one --pair')
  before = os.getloadavg()
  rows = measure(args)
  result = common.results(__file__, argv, rows, before, repeats=args.repeats,
                          shuffle=args.shuffle)
  common.write_report(args.out, result, markdown(result))
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
