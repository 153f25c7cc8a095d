"""How `--gamma auto`'s running alpha should remember: the optimal policy simulated at batch 1.

  python -m benchmarks.alpha_memory [--costs 0.008:1.41,1.84,2.10,2.44,2.54,2.54,2.54,2.54] \
      [--lengths 32,128] [--sequences 2000] [--offsets=-0.06,0,0.06] \
      [--out results/benchmarks/alpha_memory]

No model and no timing: a row's proposals are accepted token by token with a known probability
(i.i.d. at a constant alpha, or switching between two alphas every few tokens), and an iteration
at gamma >= 1 costs gamma c + v(gamma) greedy steps, a plain step 1 (`--costs`: c, then
v(1)..v(gamma_max); by default the widened smoke pair's calibration at batch 1, T = 0, the
0.2-noise draft, results/benchmarks/adaptive_gamma_smoke_widened). The policy is the library's:
`adaptive.running_alpha` after each iteration, `adaptive.batch_gamma` for the next length (its
prior, shrinkage and exit rule), greedy betas (1 accepted, 0 rejected); the row starts from a
calibrated alpha, the sequence's true mean acceptance plus `--offsets` (the calibration's error).
Each form of the estimate is scored by its tokens per step over all sequences, against the best
fixed gamma's in the same scenario (the same draws: every form reads the same uniform numbers at
the same token position):
  per call, no prior     the form before: every earlier position's weight times 0.7 once per
                         call, the starting alpha counted as gamma_max positions that fade;
  per position           the library's discount per position (`decay` 0.85), no lasting prior;
  per position + prior   that, with the calibrated alpha counted as `CALIBRATED_PRIOR_WEIGHT`
                         positions that never fade (what `AdaptiveGamma.calibrated` sets).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any, Callable, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from gqa_spec.decoding import adaptive
from gqa_spec.decoding.adaptive import AdaptiveGamma

# name -> acceptance at token position p (`[n]` int32 -> `[n]` float32)
SCENARIOS: Dict[str, Callable[[jax.Array], jax.Array]] = {
    'alpha 0.40': lambda p: jnp.full(p.shape, 0.40),
    'alpha 0.55': lambda p: jnp.full(p.shape, 0.55),
    'alpha 0.64': lambda p: jnp.full(p.shape, 0.64),
    'alpha 0.70': lambda p: jnp.full(p.shape, 0.70),
    'alpha 0.75': lambda p: jnp.full(p.shape, 0.75),
    'alpha 0.85': lambda p: jnp.full(p.shape, 0.85),
    '0.9 / 0.4 every 16': lambda p: jnp.where((p // 16) % 2 == 0, 0.9, 0.4),
    '0.9 / 0.4 every 32': lambda p: jnp.where((p // 32) % 2 == 0, 0.9, 0.4),
    '0.75 / 0.55 every 16': lambda p: jnp.where((p // 16) % 2 == 0, 0.75, 0.55),
}
FORMS = ('per call, no prior', 'per position', 'per position + prior')


def per_call_alpha(alpha, weight, beta, tried, decay=0.7):
  """The earlier estimate: the ratio with every earlier position's weight times `decay` per call."""
  n = jnp.sum(tried, axis=1).astype(jnp.float32)  # [b]
  kept = decay * weight  # [b]
  new_weight = jnp.where(n > 0, kept + n, weight)  # [b]
  total = jnp.sum(jnp.where(tried, beta, 0.0), axis=1)  # [b]
  return jnp.where(n > 0, (kept * alpha + total) / jnp.maximum(new_weight, 1e-6), alpha), new_weight


@functools.partial(jax.jit, static_argnames=('scenario', 'length', 'ad', 'form'))
def simulate(scenario, length: int, uniforms: jax.Array, gamma: jax.Array, ad: AdaptiveGamma,
             form: str) -> jax.Array:
  """`[]` tokens per greedy step over all rows: `uniforms [n, length + gmax]` the draws at each
  token position, `gamma` the fixed length (> 0) or 0 for the policy (`form`)."""
  n, gmax = uniforms.shape[0], ad.gamma_max
  positions = jnp.arange(gmax)  # [gmax]
  v = jnp.asarray((1.0,) + ad.verify_ratio)  # [gmax + 1] v(0) = a plain step
  update = per_call_alpha if form == 'per call, no prior' else (
      lambda a, w, b, t: adaptive.running_alpha(a, w, b, t, ad.decay))
  choose = jax.vmap(lambda a, w: adaptive.batch_gamma(a[None], w[None], jnp.ones((1,), bool), ad))

  def body(_, s):
    pos, cost, alpha, weight, want = s  # [n] each
    live = pos < length
    draw = jnp.take_along_axis(uniforms, pos[:, None] + positions[None], axis=1)  # [n, gmax]
    ok = draw < scenario(pos[:, None] + positions[None])  # [n, gmax]
    ok &= positions[None] < want[:, None]
    k = jnp.argmin(jnp.concatenate([ok, jnp.zeros((n, 1), bool)], axis=1), axis=1)  # accepted
    tried = (positions[None] <= k[:, None]) & (positions[None] < want[:, None]) & live[:, None]
    a, w = update(alpha, weight, ok.astype(jnp.float32), tried)
    nxt = jnp.where(gamma > 0, gamma, jnp.where(want > 0, choose(a, w), 0))
    step = jnp.where(want > 0, want * ad.cost_ratio + v[want], 1.0)  # [n]
    return (jnp.where(live, pos + k + 1, pos), cost + jnp.where(live, step, 0.0),
            jnp.where(live, a, alpha), jnp.where(live, w, weight), jnp.where(live, nxt, want))

  first = jnp.where(gamma > 0, gamma, ad.first_gamma())
  init = (jnp.zeros((n,), jnp.int32), jnp.zeros((n,), jnp.float32),
          jnp.full((n,), ad.alpha_init), jnp.full((n,), float(gmax)),
          jnp.full((n,), first, jnp.int32))
  pos, cost, *_ = jax.lax.fori_loop(0, length, body, init)
  return jnp.sum(jnp.minimum(pos, length)) / jnp.sum(cost)


def settings(form: str, c: float, v: Tuple[float, ...], alpha0: float) -> AdaptiveGamma:
  ad = AdaptiveGamma(gamma_max=len(v), cost_ratio=c, verify_ratio=v, alpha_init=alpha0)
  return dataclasses.replace(ad, prior_weight=adaptive.CALIBRATED_PRIOR_WEIGHT) if (
      form == 'per position + prior') else ad


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  c, v = args.costs.split(':')
  c, v = float(c), tuple(float(x) for x in v.split(','))
  gmax = len(v)
  rows = []
  for length in (int(x) for x in args.lengths.split(',')):
    uniforms = jax.random.uniform(jax.random.PRNGKey(0), (args.sequences, length + gmax))
    for name, scenario in SCENARIOS.items():
      truth = float(jnp.mean(scenario(jnp.arange(length))))
      fixed_ad = settings('per position', c, v, truth)
      fixed = [float(simulate(scenario, length, uniforms, jnp.int32(g), fixed_ad, 'per position'))
               for g in range(1, gmax + 1)]
      best = int(np.argmax(fixed)) + 1
      for offset in (float(x) for x in args.offsets.split(',')):
        alpha0 = min(max(truth + offset, 0.0), 1.0)
        for form in FORMS:
          speed = float(simulate(scenario, length, uniforms, jnp.int32(0),
                                 settings(form, c, v, alpha0), form))
          row = {'length': length, 'scenario': name, 'offset': offset, 'form': form,
                 'tokens_per_step': speed, 'best_fixed_gamma': best,
                 'best_fixed_tokens_per_step': fixed[best - 1], 'x_best_fixed': speed / max(fixed)}
          common.print_row(row)
          rows.append(row)
  return rows


def markdown(result: Dict[str, Any]) -> List[str]:
  rows = result['rows']
  keys = sorted({(r['length'], r['scenario'], r['offset']) for r in rows},
                key=lambda k: (k[0], list(SCENARIOS).index(k[1]), k[2]))
  cells = []
  for length, scenario, offset in keys:
    mine = {r['form']: r for r in rows if (r['length'], r['scenario'], r['offset']) == (
        length, scenario, offset)}
    one = next(iter(mine.values()))
    cells.append((length, scenario, f'{offset:+.2f}',
                  f'gamma={one["best_fixed_gamma"]} ({one["best_fixed_tokens_per_step"]:.3f})',
                  *(f'{mine[f]["x_best_fixed"]:.3f}' for f in FORMS)))
  lines = common.table_report(
      '--gamma auto: how the running alpha remembers (simulated, batch 1)', result,
      'Tokens per greedy step of each form of the estimate over the best fixed gamma\'s, same '
      'draws (the module docstring); calibration error: the starting alpha less the true mean '
      'acceptance.', ['tokens', 'acceptance', 'calibration error', 'best fixed', *FORMS], cells)
  summary = ['', '| form | x best fixed: median | lowest | cells >= 0.95 |', '|---|---|---|---|']
  for f in FORMS:
    x = np.asarray([r['x_best_fixed'] for r in rows if r['form'] == f])
    summary.append(f'| {f} | {np.median(x):.3f} | {x.min():.3f} | {int((x >= 0.95).sum())} of '
                   f'{len(x)} |')
  return lines + summary


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--costs', default='0.008:1.41,1.84,2.10,2.44,2.54,2.54,2.54,2.54',
                      help='c:v(1),...,v(gamma_max) in greedy steps')
  parser.add_argument('--lengths', default='32,128', help='tokens per sequence')
  parser.add_argument('--sequences', type=int, default=2000)
  parser.add_argument('--offsets', default='-0.06,0,0.06',
                      help='the calibrated alpha less the true mean acceptance')
  return common.measure_and_write(__file__, parser, argv, measure, markdown)


if __name__ == '__main__':
  raise SystemExit(main())
