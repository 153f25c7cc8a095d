"""Does `--gamma auto` need tuning? `--gamma auto` against every fixed gamma and against greedy
decoding, side by side in one run.

  python -m benchmarks.adaptive [--pair NAME TARGET DRAFT TASK ... --data-dir DIR] \
      [--splits test] [--examples 8] [--drafts bigram,perturbed] [--batches 1,8] \
      [--temperatures 0,1] \
      [--gammas 1,2,3,4,5,6,7,8] [--gamma-max 8] [--max-decode-len 32] [--input-length 64] \
      [--repeats 7] [--shuffle] [--confirm 0] [--seeds 1] [--out PATH] [--force]

For each pair (or demo draft), batch size and temperature, on the same inputs: our jitted
autoregressive decoding ("greedy decoding" in the goals, whatever the temperature: one target call
per token), speculative decoding at each fixed gamma, and `adaptive.decode` with the `optimal`
policy (c and v measured once per pair, batch size and temperature with `cost_calibration.measure_costs`,
as `generate --gamma auto` does on its first batch; the seconds that took are recorded) and the
`heuristic` policy. A cell decodes `--examples` inputs in batches of its batch size. After one
compile call each, the methods run in turn, `--repeats` rounds, the order rotated every round (so
that a change in the machine's load falls on all alike; `--shuffle`: a new random order every
round, so that no method always follows the same one); each time is the median over the rounds. `x
greedy` is tokens per second over autoregressive decoding's in the same cell (sampling runs generate
different numbers of tokens); `x best fixed` is over the fastest fixed gamma of the cell, found by
this very sweep (the sweep a user would have to run). That figure is the largest of several noisy
medians, so it flatters the fixed gamma; `--confirm R` times the adaptive methods and the gamma the
sweep chose again, on the next `--examples` test inputs (held out from the sweep), R rounds of
their own, and reads the goal on the median of their per-round ratios (`x_best_fixed_confirmed`).
Every cell also times greedy decoding a second
time, `no draft (again)`, half-way round the rotation from the first (neither runs right after the
other), an A/A control: its `x greedy` is what timing one program twice gives there, the noise the
0.97x goal is read against (the goals table marks a miss no larger than that distance from 1.0).

`--pair NAME TARGET DRAFT TASK` (repeatable): a trained target and draft (native checkpoints) and
the seqio task whose first `--examples` test inputs they decode (`--splits test,validation`: the
validation split's after the test split's, where a cell needs more batches than the test split
holds; a batch-8 cell of one batch reads that batch's luck);
`--data-dir` is the prepared DDTP
data directory the tasks read (a reproduction's `<work>/data`). The smoke reproduction's pairs:
`<work>/models/finetune/<task>/mha_g4/best` and `.../draft/best`. Each pair is measured with
its draft model and with a bigram fitted on its task's training targets (`--pair-drafts`; also
`copy`, prompt lookup in the input), the drafts of the reproduction's chain tables. Without
`--pair`, the pair is
`workloads.demo_pair` (UNTRAINED, and the output says so) on synthetic inputs: a random-init
`mini` target with drafts `bigram` (fitted on the target's own greedy outputs for other inputs: c
small, alpha moderate) and `perturbed` (the target's weights + noise: alpha high, c ~ 1).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from gqa_spec.decoding import adaptive, autoregressive, cost_calibration, speculative
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.drafts import CopyDraft, ModelDraft, NgramDraft
from gqa_spec.decoding.drafts.ngram import fit_ngram_on_task
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length


def _ints(text: str) -> List[int]:
  return [int(x) for x in text.split(',') if x]


def drafts_of(args, target_model, params) -> Dict[str, Any]:
  """The demo pair's drafts: name -> (draft, init(encoder tokens) -> draft state)."""
  gmax = max(args.gamma_max, max(_ints(args.gammas)))
  L = args.max_decode_len
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


def add_pair_arguments(p: argparse.ArgumentParser, what: str, required: bool = False) -> None:
  """`--pair NAME TARGET DRAFT TASK` (repeatable; `what`: its help) and `--data-dir`."""
  p.add_argument('--pair', nargs=4, action='append', required=required,
                 metavar=('NAME', 'TARGET', 'DRAFT', 'TASK'), help=what)
  p.add_argument('--data-dir', help='the prepared DDTP data directory (with --pair; not needed '
                 'for exported:DIR/TASK tasks)')
  p.add_argument('--splits', default='test', type=lambda text: tuple(text.split(',')),
                 help="the splits whose inputs the pairs decode, in turn (default test; e.g. "
                      "test,validation: more batches than the test split holds, neither of them "
                      "trained on)")


def pairs_of(args) -> List[Dict[str, Any]]:
  """Each pair to measure: name, target model and params, drafts (name -> (draft, init(enc))),
  inputs `[examples, S]`."""
  gmax = max(args.gamma_max, max(_ints(args.gammas)))
  L = args.max_decode_len
  confirm = args.confirm
  out = []
  if args.pair:
    for name, target_path, draft_path, task in args.pair:
      target_model, params = workloads.checkpoint_model(target_path)
      model, dparams = workloads.checkpoint_model(draft_path)
      draft = ModelDraft.t5(model)
      inputs = workloads.task_inputs(task, args.data_dir, args.examples * (2 if confirm else 1),
                           args.input_length, L, args.splits)
      drafts = {'draft model': (draft, lambda enc, d=draft, p=dparams: d.init(p, enc, L, gmax))}
      if 'bigram' in args.pair_drafts.split(','):
        ngram = NgramDraft(target_model.config.vocab_size)
        table = ngram.init(fit_ngram_on_task(task, 2))
        drafts['bigram'] = (ngram, lambda enc, t=table: t)
      if 'copy' in args.pair_drafts.split(','):
        copy = CopyDraft(target_model.config.vocab_size)
        drafts['copy'] = (copy, copy.init)
      drafts = {k: v for k, v in drafts.items()
                if k.split()[0] in args.pair_drafts.split(',')}
      out.append({'name': name, 'task': task, 'target_model': target_model, 'params': params,
                  'drafts': drafts, **split_held_out(inputs, args.examples, confirm)})
    return out
  target_model, params, _ = workloads.demo_pair(args.perturb)
  inputs = workloads.synthetic_inputs(args.examples * (2 if confirm else 1),
                                      args.input_length, target_model.config.vocab_size, seed=0)
  out.append({'name': 'demo (untrained)', 'task': 'synthetic', 'target_model': target_model,
              'params': params, 'drafts': drafts_of(args, target_model, params),
              **split_held_out(inputs, args.examples, confirm)})
  return out


def split_held_out(inputs: np.ndarray, examples: int, confirm: int) -> Dict[str, Any]:
  """`inputs`: the sweep's first `examples`; with `confirm` rounds, `held_out`: the next as many
  (the confirmation rounds' inputs), else None."""
  return {'inputs': inputs[:examples],
          'held_out': inputs[examples:2 * examples] if confirm else None}


def batches_of(inputs: Optional[np.ndarray], batch: int) -> Optional[List[jax.Array]]:
  """`inputs` `[n, S]` as `[batch, S]` device arrays (None: None)."""
  if inputs is None:
    return None
  return [jnp.asarray(inputs[i:i + batch]) for i in range(0, len(inputs) - batch + 1, batch)]


def add_shuffle_argument(p: argparse.ArgumentParser) -> None:
  p.add_argument('--shuffle', action='store_true',
                 help="a new random order of a cell's methods every round (seeded; default: the "
                      'order rotated)')


def add_seeds_argument(p: argparse.ArgumentParser) -> None:
  p.add_argument('--seeds', type=int, default=1,
                 help='at T > 0, decode every batch with this many random keys (seconds and '
                      'tokens summed): the methods sample different outputs, and over 8 inputs '
                      "their token counts differ by up to ~25%%, which tokens/s reads as speed "
                      '(default 1; T = 0 always 1)')


def sampling_keys(seeds: int, temperature: float) -> List[jax.Array]:
  """The random keys a cell decodes every batch with: `seeds` of them at T > 0, one at T = 0
  (greedy: every key gives the same output)."""
  if seeds < 1:
    raise SystemExit(f'--seeds must be >= 1, got {seeds}')
  return [jax.random.PRNGKey(s) for s in range(seeds if temperature > 0 else 1)]


def seeds_words(result: Dict[str, Any]) -> str:
  """How a report's cells sampled: '' for one key, else the words to put after 'all of them'."""
  seeds = result.get('seeds') or 1
  return '' if seeds == 1 else f' (at T > 0 each input decoded with {seeds} random keys)'


def add_confirm_argument(p: argparse.ArgumentParser) -> None:
  p.add_argument('--confirm', type=int, default=0, metavar='ROUNDS',
                 help="after each cell's sweep, time its adaptive methods and its fastest fixed "
                      'one again, on the next --examples test inputs (held out from the sweep), '
                      'in ROUNDS rounds of their own (the goal against the best fixed is read on '
                      'these; default 0: none)')


def split_words(result: Dict[str, Any]) -> str:
  """Which inputs a report's cells decoded: 'test inputs', or e.g. 'test then validation inputs'
  (`--splits`)."""
  return ' then '.join(result.get('splits') or ['test']) + ' inputs'


def order_words(result: Dict[str, Any]) -> str:
  """How a report's rounds ordered the methods."""
  return 'a new random order every round' if result.get('shuffle') else 'order rotated'


def measure(args: argparse.Namespace,
            on_cell: Callable[[List[Dict[str, Any]]], None] = lambda rows: None
            ) -> List[Dict[str, Any]]:
  """Every cell's rows; `on_cell(rows so far)` after each cell."""
  L, gmax = args.max_decode_len, args.gamma_max
  gammas = _ints(args.gammas)
  slots = cache_length(L, max(gmax, max(gammas)) + 1)
  policies = ['optimal', 'heuristic']
  rows = []
  for pair in pairs_of(args):
    target, params = T5Decoder(pair['target_model']), pair['params']
    for draft_name, (draft, dinit) in pair['drafts'].items():
      for batch in _ints(args.batches):
        encs, held = batches_of(pair['inputs'], batch), batches_of(pair['held_out'], batch)
        states = lambda encs: ([target.init(params, enc, slots) for enc in encs],
                               [target.init(params, enc, L + 1) for enc in encs],
                               [dinit(enc) for enc in encs])
        tstates, ar_states, dstates = states(encs)
        for temperature in [float(t) for t in args.temperatures.split(',')]:
          config = SamplingConfig(temperature=temperature)
          cals = {}  # policy -> (calibration, its seconds)
          for policy in policies:
            if policy.startswith('optimal'):
              t0 = time.perf_counter()
              cals[policy] = (cost_calibration.measure_costs(
                  target, tstates[0], draft, dstates[0], L, gmax,
                  more=zip(tstates[1:], dstates[1:]), config=config),
                              time.perf_counter() - t0)
          cal = cals['optimal'][0]
          rngs = sampling_keys(args.seeds, temperature)

          def cell_runs(encs, tstates, ar_states, dstates, config=config, cals=cals):
            """The cell's methods on these batches (the calibrations of the sweep's first)."""
            runs = {'no draft': lambda: [autoregressive.decode(
                target, s, rng, max_decode_len=L, config=config)
                for rng in rngs for s in ar_states]}
            for g in gammas:
              runs[f'gamma={g}'] = (lambda g=g: [speculative.decode(
                  target, t, draft, d, rng, gamma=g, max_decode_len=L, config=config)
                  for rng in rngs for t, d in zip(tstates, dstates)])
            for policy in policies:
              auto = AdaptiveGamma(gamma_max=gmax, policy=policy)
              auto = auto.calibrated(cals[policy][0]) if policy in cals else auto
              auto_states = (tstates if cache_length(L, auto.call_tokens) == slots else
                             [target.init(params, enc, cache_length(L, auto.call_tokens))
                              for enc in encs])  # as `generate --gamma auto` allocates
              auto_dstates = dstates if auto.speculates else [None] * len(dstates)
              runs[f'auto:{policy}'] = (lambda a=auto, ts=auto_states, ds=auto_dstates: [
                  adaptive.decode(target, t, draft, d, rng, adaptive=a, max_decode_len=L,
                                  config=config) for rng in rngs for t, d in zip(ts, ds)])
            return runs

          runs = cell_runs(encs, tstates, ar_states, dstates)
          held_runs = None if held is None else cell_runs(held, *states(held))
          key = {'pair': pair['name'], 'task': pair['task'], 'draft': draft_name,
                 'batch': batch, 'temperature': temperature}

          def extra(method, results, cal=cal, cals=cals):
            if method.startswith('gamma='):  # what the calibration priced this iteration at
              g = int(method.split('=')[1])
              return ({'calibrated_iteration_steps': g * cal.cost_ratio + cal.verify_ratio[g - 1]}
                      if g <= gmax else {})
            if method.startswith('no draft'):
              return {}
            summaries = [speculative.summarize(r) for r in results]
            out = dict(gamma_histogram=[int(x) for x in np.sum(
                [s['gamma_histogram'] for s in summaries], axis=0)],
                       draft_steps_saved=sum(s['draft_steps_saved'] for s in summaries))
            if method.split(':')[1] in cals:
              c, seconds = cals[method.split(':')[1]]
              out.update(cost_ratio=c.cost_ratio, verify_ratio=c.verify_ratio,
                         alpha_init=c.alpha, calibration_seconds=seconds,
                         lengths=[list(b) for b in c.lengths])
            return out

          cell = measure_cell(runs, args.repeats, key, extra,
                              lambda m: m.startswith('gamma='), args.shuffle, args.confirm,
                              held_runs)
          rows.extend(cell)
          on_cell(rows)
          # Free the cell's compiled programs: a run of hundreds of them ran out of memory for
          # LLVM's code ("Cannot allocate memory", then a segfault) after 231 rows.
          jax.clear_caches()
  return rows


# Greedy decoding timed a second time in every cell, as one more method: its `x greedy` is what
# timing one program twice gives on this machine (an A/A control), the noise a ratio to greedy
# decoding is read against.
GREEDY_AGAIN = 'no draft (again)'


def measure_cell(runs: Dict[str, Callable[[], Any]], repeats: int, key: Dict[str, Any],
                 extra: Callable[[str, List[Any]], Dict[str, Any]],
                 is_fixed: Callable[[str], bool], shuffle: bool = False,
                 confirm: int = 0, held_runs: Optional[Dict[str, Callable[[], Any]]] = None
                 ) -> List[Dict[str, Any]]:
  """One cell's rows: each method of `runs` (the first is greedy decoding), and the first again
  (`GREEDY_AGAIN`), timed `interleaved`, its tokens, tokens per target call, acceptance and
  `extra(method, results)`, `key` (the cell's pair, draft, batch, temperature) in every row, and
  the speed over greedy decoding and over the fastest method that `is_fixed`. Printed as they are
  measured. `shuffle`: `interleaved`'s. `confirm` > 0: the adaptive methods (neither fixed nor
  greedy decoding) and the sweep's fastest fixed method are timed again in `confirm` fresh rounds
  of their own (`confirm_against_best_fixed`), their rows' `x_best_fixed_confirmed`; on other
  inputs where `held_runs` gives the same methods on them."""
  load = os.getloadavg()[0]
  runs = {**runs, GREEDY_AGAIN: next(iter(runs.values()))}
  # The control is timed half-way round from greedy decoding, so that neither of the two runs
  # right after the other (the rotation puts the last method before the first).
  names = list(runs)[:-1]
  order = names[:len(names) // 2 + 1] + [GREEDY_AGAIN] + names[len(names) // 2 + 1:]
  times = common.interleaved(runs, repeats, order, shuffle)
  cell = []
  for method, fn in runs.items():
    results = fn()
    seconds = float(np.median(times[method]))
    tokens = sum(int(np.sum(np.asarray(r.lengths))) for r in results)
    calls = sum(int(np.sum(np.asarray(r.target_calls))) if hasattr(r, 'target_calls')
                else int(np.max(np.asarray(r.lengths))) * r.lengths.shape[0] for r in results)
    iterations = sum(int(r.loop_iterations) for r in results)  # of the batch loops, all batches
    row = dict(key, method=method, seconds=seconds, seconds_rounds=times[method], tokens=tokens,
               tokens_per_second=tokens / seconds, tokens_per_call=tokens / max(calls, 1),
               loop_iterations=iterations, load_before=load, cost_ratio=None, verify_ratio=None)
    row.update(extra(method, results))
    if not method.startswith('no draft'):
      accepted = sum(int(np.sum(np.asarray(r.accepted))) for r in results)
      proposed = sum(int(np.sum(np.asarray(r.proposed))) for r in results)
      row['acceptance_rate'] = accepted / max(proposed, 1)
    cell.append(row)
  base = cell[0]['tokens_per_second']
  step = cell[0]['seconds'] / max(cell[0]['loop_iterations'], 1)  # a greedy decoding step
  best = max((r for r in cell if is_fixed(r['method'])), key=lambda r: r['tokens_per_second'])
  for r in cell:
    r['x_greedy'] = r['tokens_per_second'] / base
    r['x_best_fixed'] = r['tokens_per_second'] / best['tokens_per_second']
    r['iteration_steps'] = r['seconds'] / max(r['loop_iterations'], 1) / step
  if confirm > 0:
    adaptive_rows = [r for r in cell if not is_fixed(r['method'])
                     and not r['method'].startswith('no draft')]
    confirm_against_best_fixed(runs if held_runs is None else held_runs, best, adaptive_rows,
                               confirm, shuffle, held_out=held_runs is not None)
  for r in cell:
    common.print_row({k: v for k, v in r.items() if not isinstance(v, (list, tuple))})
  return cell


def confirm_against_best_fixed(runs: Dict[str, Callable[[], Any]], best: Dict[str, Any],
                               adaptive_rows: List[Dict[str, Any]], repeats: int,
                               shuffle: bool, held_out: bool = False) -> None:
  """Times the adaptive methods against the sweep's fastest fixed method (`best`'s row) again, in
  `repeats` rounds of their own (`runs`: the methods, on the sweep's inputs or with `held_out` on
  others), and sets each adaptive row's `x_best_fixed_confirmed`: the median over the rounds of
  its tokens/s over the fixed method's in the same round (`confirm_ratios`; the tokens each made
  there, `confirm_tokens`).

  Why: the sweep's fastest fixed method is the largest of several noisy figures, so its figure is
  biased fast, twice: its time (on this CPU neighbouring gammas differed by up to 16% in one run,
  more than their true difference) and, on the sweep's own inputs, its tokens per call (at T = 0
  the draft's misses sit at fixed positions of the few outputs, and a gamma whose windows happen
  to line up with them gains there: on the widened smoke pair at batch 1, gamma 8 made 4.69
  tokens a call where the acceptance of gammas 4 to 7, 0.81, predicts 4.47). Fresh rounds after
  the choice remove the first; other inputs (`--confirm`: the test inputs after the sweep's), the
  second, as a user who swept and then decodes new inputs sees it. Paired: both run in every
  round."""
  names = [best['method']] + [r['method'] for r in adaptive_rows]
  times = common.interleaved({m: runs[m] for m in names}, repeats, shuffle=shuffle)
  tokens = {m: sum(int(np.sum(np.asarray(x.lengths))) for x in runs[m]()) for m in names}
  for r in adaptive_rows:
    m, b = r['method'], best['method']
    ratios = [(tokens[m] / mine) / (tokens[b] / theirs)
              for mine, theirs in zip(times[m], times[b])]
    r.update(x_best_fixed_confirmed=float(np.median(ratios)), confirm_ratios=ratios,
             confirmed_best_fixed=b, confirm_tokens={m: tokens[m], b: tokens[b]},
             confirm_held_out=held_out)


def goals(rows: List[Dict[str, Any]], auto: str = 'auto:optimal',
          is_fixed: Callable[[str], bool] = lambda m: m.startswith('gamma=')
          ) -> List[Dict[str, Any]]:
  """Per cell, the `auto` row against the issue's goals: >= 0.97x greedy decoding and >= 0.95x
  the best fixed method (`is_fixed`: a fixed gamma, or a fixed tree). With the cell's A/A control
  (`GREEDY_AGAIN`'s x greedy, None in runs before it was measured): `within_noise` where a miss
  of the first goal is no larger than greedy decoding's own distance from 1.0 in that cell. Where
  the cell confirmed its adaptive methods (`confirm_against_best_fixed`), the second goal is read
  on the confirmed ratio (the sweep's is kept beside it)."""
  out = []
  cell_of = lambda x: tuple(x[k] for k in ('pair', 'draft', 'batch', 'temperature'))
  again = {cell_of(x): x['x_greedy'] for x in rows if x['method'] == GREEDY_AGAIN}
  for r in rows:
    if r['method'] != auto:
      continue
    best = max((x for x in rows if is_fixed(x['method']) and cell_of(x) == cell_of(r)),
               key=lambda x: x['tokens_per_second'])
    aa = again.get(cell_of(r))
    confirmed = r.get('x_best_fixed_confirmed')
    out.append({k: r[k] for k in ('pair', 'draft', 'batch', 'temperature', 'x_greedy',
                                  'x_best_fixed')} | {
        'best_fixed': best['method'], 'best_fixed_x_greedy': best['x_greedy'],
        'x_best_fixed_confirmed': confirmed, 'greedy_goal': r['x_greedy'] >= 0.97,
        'best_fixed_goal': (r['x_best_fixed'] if confirmed is None else confirmed) >= 0.95,
        'greedy_again_x_greedy': aa,
        'within_noise': None if aa is None else r['x_greedy'] >= 0.97 - abs(1.0 - aa)})
  return out


def goal_lines(result: Dict[str, Any], auto: str, fixed: str, pair_column: bool = True
               ) -> List[str]:
  """The goals table of `goals`' rows (`result['goals']`), `fixed` naming the fixed methods."""
  def greedy_goal(g):
    if g['greedy_goal']:
      return 'met'
    return '**missed**' + (' (within the A/A noise)' if g.get('within_noise') else '')

  aa = lambda g: ('' if g.get('greedy_again_x_greedy') is None
                  else f'{g["greedy_again_x_greedy"]:.3f}')
  confirmed = lambda g: ('' if g.get('x_best_fixed_confirmed') is None
                         else f'{g["x_best_fixed_confirmed"]:.3f}')
  rows = [(*((g['pair'], g['draft']) if pair_column else (g['draft'],)), g['batch'],
           g['temperature'], f'{g["x_greedy"]:.3f}', aa(g), greedy_goal(g),
           f'{g["best_fixed"]} ({g["best_fixed_x_greedy"]:.2f}x greedy)',
           f'{g["x_best_fixed"]:.3f}', confirmed(g),
           'met' if g['best_fixed_goal'] else '**missed**')
          for g in result['goals']]
  rounds = result.get('confirm') or 0
  return ['', f'## Goals (`{auto}`, no tuning)', '',
          f'Never below 0.97x greedy decoding; within 5% of the best {fixed} (>= 0.95x), or '
          'better. A/A: greedy decoding timed again in the same rounds, over itself: a miss of '
          'the first goal by no more than that distance from 1.0 is within what timing one '
          'program twice gives in that cell. x best fixed: in the sweep, over the fastest fixed '
          'method\'s median (biased fast: the largest of several noisy medians); '
          + (f'confirmed: {auto} and that {fixed} timed again after the sweep chose it, on the '
             f'next {result.get("examples", "")} {split_words(result)} (held out from the sweep: '
             f'the choice\'s luck on the sweep\'s own inputs does not carry over), {rounds} rounds of '
             'their own, the median of their per-round ratios; the goal is read on it.'
             if rounds else 'no confirmation rounds in this run (`--confirm`).'),
          ''] + common.table(
      [*(('pair', 'draft') if pair_column else ('draft',)), 'batch', 'T', 'x greedy', 'A/A',
       '>= 0.97', 'best fixed', 'x best fixed', 'confirmed', '>= 0.95'], rows)


def partial_note(result: Dict[str, Any]) -> List[str]:
  """A line saying the run stopped before its last cell, where it did (`complete` false)."""
  if result.get('complete', True):
    return []
  return ['', f'**Partial**: the run stopped after the cells above ({len(result["rows"])} rows); '
              'the command asks for more.']


def _iteration_cost(r: Dict[str, Any]) -> str:
  """A row's measured seconds per loop iteration in greedy steps, and the calibration's price."""
  if r.get('iteration_steps') is None:  # a result written before the column
    return ''
  out = f'{r["iteration_steps"]:.2f}'
  if r.get('calibrated_iteration_steps') is not None:
    out += f' ({r["calibrated_iteration_steps"]:.2f})'
  return out


def x_best_fixed_cell(r: Dict[str, Any]) -> str:
  """A row's speed over the sweep's fastest fixed method, and in brackets the confirmed one."""
  out = f'{r["x_best_fixed"]:.2f}'
  if r.get('x_best_fixed_confirmed') is not None:
    out += f' ({r["x_best_fixed_confirmed"]:.2f})'
  return out


def markdown(result: Dict[str, Any]) -> List[str]:
  trained = result['trained']
  length = lambda r: (f' / L {np.mean([max(b) for b in r["lengths"]]):.0f}' if r.get('lengths')
                      else f' / L {r["output_length"]:.0f}' if r.get('output_length') else '')
  cells = [(*((r['pair'], r['draft']) if trained else (r['draft'],)), r['batch'],
            r['temperature'], r['method'],
            f'{r["seconds"]:.3f}', r['tokens'], f'{r["tokens_per_call"]:.2f}',
            _iteration_cost(r),
            '' if r.get('acceptance_rate') is None else f'{r["acceptance_rate"]:.2f}',
            f'{r["x_greedy"]:.2f}', x_best_fixed_cell(r),
            '' if r.get('gamma_histogram') is None else
            f'{r["gamma_histogram"]} (saved {r["draft_steps_saved"]})',
            '' if r['cost_ratio'] is None else
            f'{r["cost_ratio"]:.3f} / {" ".join(f"{v:.2f}" for v in r["verify_ratio"])} / '
            f'{r["alpha_init"]:.2f}{length(r)} ({r["calibration_seconds"]:.1f} s)')
           for r in result['rows']]
  pair = ('the trained pairs of the command line (`--pair`), on their tasks\' '
          f'{split_words(result)}'
          if trained else 'the built-in UNTRAINED demo pair (`workloads.demo_pair`) on synthetic '
          'inputs')
  lines = common.table_report(
      '--gamma auto against fixed gamma and greedy decoding', result,
      f'On {pair}; {result["examples"]} inputs per cell in batches of the cell\'s size; seconds: '
      f'all of them{seeds_words(result)}, median of {result["repeats"]} interleaved rounds '
      f'(methods in turn, {order_words(result)}) after a compile call; x greedy: tokens/s over the '
      'cell\'s autoregressive decoding; x best fixed: over the fastest fixed gamma of the cell '
      '(in brackets: confirmed, see the goals); acc.: accepted / proposed draft tokens; gamma '
      'histogram: target calls per draft length (0..gamma_max), all rows; saved: draft decode '
      'calls saved against gamma_max per iteration; c / v / alpha: what the optimal policy '
      'used, measured by `cost_calibration.measure_costs` once per pair, batch size and temperature '
      '(in the seconds given, compiles included; not in the timed runs): the draft cost ratio '
      'and the iteration cost ratios v(1)..v(gamma_max), in steps of autoregressive decoding at '
      'the cell\'s temperature, and the starting alpha (the draft\'s greedy one-token '
      'acceptance over greedy decoding\'s output, or where the calibration timed the loop, the '
      'loop\'s own acceptance at gamma 1), and where given (/ L) the mean longest row of the '
      'calibration batches whose rows\' greedy output lengths its batch pricing used (tokens; '
      '`theory.batch_inflation`); no draft (again): greedy decoding timed a second time '
      '(the A/A control); steps/iter.: seconds per iteration of the batch loop in greedy '
      'decoding steps (its seconds per iteration), measured, and for a fixed gamma in brackets '
      'what the calibration priced it at (gamma c + v(gamma)).',
      [*(('pair', 'draft') if trained else ('draft',)), 'batch', 'T', 'method', 'seconds', 'tokens',
       'tokens/call', 'steps/iter.', 'acc.', 'x greedy', 'x best fixed', 'gamma histogram',
       'c / v / alpha'],
      cells)
  lines += goal_lines(result, 'auto:optimal', 'fixed gamma', pair_column=trained)
  lines += partial_note(result)
  return lines + common.result_load_note(
      result, ': the machine was shared with other jobs; ratios within a cell were measured '
              'side by side (interleaved), absolute times are not representative.')


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_pair_arguments(p, 'a trained pair and the task whose test inputs it decodes (repeatable)')
  p.add_argument('--examples', type=int, default=8, help='inputs per cell')
  p.add_argument('--pair-drafts', default='draft,bigram',
                 help="drafts of each --pair: 'draft' (its DRAFT model), 'bigram' (fitted on its "
                      "task's training targets), 'copy' (prompt lookup in the input)")
  p.add_argument('--drafts', default='bigram,perturbed',
                 help='demo pair drafts: bigram,perturbed,nano')
  p.add_argument('--perturb', type=float, default=0.05)
  p.add_argument('--batches', default='1,8')
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--gammas', default='1,2,3,4,5,6,7,8')
  p.add_argument('--gamma-max', type=int, default=8)
  p.add_argument('--max-decode-len', type=int, default=32)
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--repeats', type=int, default=7)
  add_shuffle_argument(p)
  add_confirm_argument(p)
  add_seeds_argument(p)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  if args.data_dir and not args.pair:
    p.error('--data-dir goes with --pair')
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if any(not exported.is_exported(task) for *_, task in args.pair or ()) and not args.data_dir:
    p.error('--pair with a seqio task needs --data-dir (an exported:DIR/TASK task does not)')
  if any(args.examples % b for b in _ints(args.batches)):
    p.error('--examples must be a multiple of every batch size')
  before = os.getloadavg()

  def write(rows, complete):
    result = common.results(__file__, argv, rows, before, trained=bool(args.pair),
                            repeats=args.repeats, examples=args.examples, goals=goals(rows),
                            complete=complete, shuffle=args.shuffle, confirm=args.confirm,
                            seeds=args.seeds, splits=list(args.splits))
    common.write_report(args.out, result, markdown(result), args.force, partial=not complete)

  # Rewritten after every cell, so that a run cut short (a device call's clock, a kill) keeps what
  # it measured; `complete` says whether every cell was.
  write(measure(args, lambda rows: write(rows, False)), True)
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
