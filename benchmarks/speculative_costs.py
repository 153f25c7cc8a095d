"""The speculative loop's fixed costs: c, v(gamma) and the loop's own per-iteration overhead.

  python benchmarks/speculative_costs.py [--batch 1,8] [--gammas 1,2,3,4,5,6,7] \
      [--input-length 64] [--max-decode-len 64] [--baseline REF --rounds 3] \
      [--out results/benchmarks/speculative_costs]

Random-init `mini` target and `nano` draft by default (`--target-preset`, `--draft-preset`; costs do
not depend on the weights). Per batch size:
  target_step_ms   one 1-token target decode call at cache fill max_decode_len / 2
                   (`speedup.step_time`: a jitted loop of calls, rolled back, least disturbed run);
  draft_step_ms    the same for the draft; c = draft_step / target_step;
and per gamma:
  verify_ms        one (gamma + 1)-token target call; v(gamma) = verify / target_step;
  propose_ms       one `ModelDraft.propose` of gamma tokens plus its `commit`
                   (`speedup.propose_time`: a 2-token call, then gamma - 1 1-token calls, sampling);
  iteration_ms     wall time of `speculative.decode` (greedy, EOS never produced: every row runs
                   to max_decode_len) minus its init calls, / its loop iterations (least disturbed
                   of --repeats runs, like the step times);
  overhead_ms      iteration - propose - verify: what the loop itself adds (verification, appends,
                   rollbacks, statistics, the while-loop's bookkeeping), also in target steps.
`--baseline REF` measures the library at git REF beside the working tree's in alternating child
processes (`ab.py`) and reports both. `--profile B,GAMMA` instead writes the per-op profile
(`op_profile.py`) of one `speculative.decode` call at batch B and that gamma to `<out>_profile.*`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab  # pylint: disable=g-import-not-at-top,wrong-import-position
import op_profile  # pylint: disable=g-import-not-at-top,wrong-import-position
from speculative import machine, write_markdown  # pylint: disable=g-import-not-at-top,wrong-import-position

from gqa_spec.decoding import speculative, speedup  # pylint: disable=wrong-import-position
from gqa_spec.decoding.drafts import ModelDraft  # pylint: disable=wrong-import-position
from gqa_spec.decoding.targets import T5Decoder  # pylint: disable=wrong-import-position
from gqa_spec.models.config import preset  # pylint: disable=wrong-import-position
from gqa_spec.models.t5 import Transformer  # pylint: disable=wrong-import-position

TIMED = ('target_step_ms', 'draft_step_ms', 'verify_ms', 'propose_ms', 'iteration_ms',
         'overhead_ms', 'c', 'v', 'overhead_target_steps')


def _params(model: Transformer):
  dummy = jnp.ones((1, 8), jnp.int32)
  return jax.jit(lambda r: model.init(r, dummy, dummy, dummy, enable_dropout=False)['params'])(
      jax.random.PRNGKey(0))


def _models(args):
  """The random-init target and draft named by `--target-preset` / `--draft-preset`, in `--dtype`."""
  return tuple(Transformer(preset(name, dtype=args.dtype))
               for name in (args.target_preset, args.draft_preset))


def measure(args) -> list:
  """One row per (batch, gamma)."""
  target_model, draft_model = _models(args)
  tparams, dparams = _params(target_model), _params(draft_model)
  target, draft = T5Decoder(target_model), ModelDraft.t5(draft_model)
  gammas = [int(g) for g in args.gammas.split(',')]
  length = args.max_decode_len
  rows = []
  for batch in (int(b) for b in args.batch.split(',')):
    rng = np.random.default_rng(0)
    enc = jnp.asarray(rng.integers(2, 8000, size=(batch, args.input_length)), jnp.int32)  # [b, S]
    slots = speculative.target_cache_length(length, max(gammas))
    tstate = target.init(tparams, enc, slots)
    dstate0 = draft.init(dparams, enc, length, max(gammas))
    t_target = speedup.step_time(target, tstate, 1, length // 2)
    t_draft = speedup.step_time(draft.decoder, dstate0, 1, length // 2)
    for gamma in gammas:
      t_verify = speedup.step_time(target, tstate, gamma + 1, length // 2)
      t_propose = speedup.propose_time(draft, dstate0, gamma, batch, length)

      def run(gamma=gamma):
        return speculative.decode(target, target.init(tparams, enc, slots), draft,
                                  draft.init(dparams, enc, length, gamma), jax.random.PRNGKey(1),
                                  gamma=gamma, max_decode_len=length, eos_id=-1)
      iterations = int(run().loop_iterations)
      # The init calls (encoder passes) are timed apart and subtracted. Least disturbed runs, as
      # for the step times (`speedup.step_time` / `propose_time`), so the difference compares like
      # with like on a loaded machine.
      init_secs = speedup.min_time(lambda gamma=gamma: (target.init(tparams, enc, slots),
                                                        draft.init(dparams, enc, length, gamma)),
                                   args.repeats)
      loop_secs = speedup.min_time(run, args.repeats) - init_secs
      t_iter = loop_secs / iterations
      row = {'batch': batch, 'gamma': gamma, 'input_length': args.input_length,
             'target': args.target_preset, 'draft': args.draft_preset, 'dtype': args.dtype,
             'max_decode_len': length, 'loop_iterations': iterations,
             'target_step_ms': t_target * 1e3, 'draft_step_ms': t_draft * 1e3,
             'verify_ms': t_verify * 1e3, 'propose_ms': t_propose * 1e3,
             'iteration_ms': t_iter * 1e3, 'overhead_ms': (t_iter - t_propose - t_verify) * 1e3,
             'c': t_draft / t_target, 'v': t_verify / t_target,
             'overhead_target_steps': (t_iter - t_propose - t_verify) / t_target,
             'loadavg': os.getloadavg()[0]}
      rows.append(row)
      print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
            flush=True)
  return rows


def profile_loop(args) -> None:
  """Writes the per-op profile of one speculative.decode call (see `--profile`)."""
  batch, gamma = (int(x) for x in args.profile.split(','))
  target_model, draft_model = _models(args)
  target, draft = T5Decoder(target_model), ModelDraft.t5(draft_model)
  tparams, dparams = _params(target_model), _params(draft_model)
  rng = np.random.default_rng(0)
  enc = jnp.asarray(rng.integers(2, 8000, size=(batch, args.input_length)), jnp.int32)  # [b, S]
  length = args.max_decode_len
  tstate = target.init(tparams, enc, speculative.target_cache_length(length, gamma))
  dstate = draft.init(dparams, enc, length, gamma)
  load_before = os.getloadavg()
  result = op_profile.profile(
      lambda t, d: speculative.decode(target, t, draft, d, jax.random.PRNGKey(1), gamma=gamma,
                                      max_decode_len=length, eos_id=-1), (tstate, dstate),
      args.repeats)
  command = ' '.join(['python'] + sys.argv)
  load = [load_before, os.getloadavg()]
  result.update({'command': command, 'batch': batch, 'gamma': gamma, 'loadavg_before_after': load})
  out = args.out + '_profile'
  os.makedirs(os.path.dirname(out) or '.', exist_ok=True)
  with open(out + '.json', 'w') as f:
    json.dump(result, f, indent=2)
  note = (f'One `speculative.decode` call: random-init mini target, nano draft, batch {batch}, '
          f'gamma {gamma}, input length {args.input_length}, {length} tokens per row (greedy, no '
          f'EOS; the random draft is almost never accepted, so about {length} loop iterations: '
          f'"calls/run" {length} = once per iteration, {length * (gamma - 1)} = once per draft '
          f'scan step). Load average before/after {load[0][0]:.1f} / {load[1][0]:.1f} on '
          f'{os.cpu_count()} cores' + (' (shared machine: per-thunk times of small ops include '
                                       'preemption; shares of the large ones are what to read).'
                                       if load[0][0] > 2.5 else ' (no other jobs).'))
  with open(out + '.md', 'w') as f:
    f.write('\n'.join(op_profile.markdown('Speculative loop: per-op profile', command, result,
                                          note)) + '\n')


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--batch', default='1,8')
  p.add_argument('--gammas', default='1,2,3,4,5,6,7')
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--max-decode-len', type=int, default=64)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--target-preset', default='mini')
  p.add_argument('--draft-preset', default='nano')
  p.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'),
                 help='activation (and K/V cache) dtype; parameters stay float32')
  p.add_argument('--baseline', default=None, help='git ref of the library to compare against')
  p.add_argument('--rounds', type=int, default=3)
  p.add_argument('--profile', default=None, help='B,GAMMA: write the loop\'s per-op profile')
  p.add_argument('--child-out', default=None, help=argparse.SUPPRESS)
  p.add_argument('--out', default='results/benchmarks/speculative_costs')
  args = p.parse_args(argv)
  if args.profile:
    profile_loop(args)
    return
  if args.child_out:
    with open(args.child_out, 'w') as f:
      json.dump(measure(args), f)
    return
  load_before = os.getloadavg()
  if args.baseline:
    res = ab.alternate(os.path.abspath(__file__), args.baseline,
                       ab.child_argv(list(argv if argv is not None else sys.argv[1:])), args.rounds,
                       key=lambda r: (r['batch'], r['gamma']), timed=TIMED + ('loadavg',))
    rows = res['rows']
    for r in rows:
      r['iteration_speedup'] = r['baseline_iteration_ms'] / r['iteration_ms']
      # Per-round ratios (each new child beside its own baseline child): the load-robust figure.
      r['iteration_ratio_rounds'] = [b / n for b, n in zip(r['baseline_iteration_ms_rounds'],
                                                            r['iteration_ms_rounds'])]
  else:
    rows = measure(args)
  results = {'command': ' '.join(['python'] + sys.argv), 'rows': rows, 'baseline': args.baseline,
             'rounds': args.rounds if args.baseline else 1,
             'loadavg_before_after': [load_before, os.getloadavg()], 'machine': machine()}
  write(results, args)


def write(results, args) -> None:
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  with open(args.out + '.json', 'w') as f:
    json.dump(results, f, indent=2)
  load = results['loadavg_before_after']
  ab_note = (f' Median over {args.rounds} rounds alternating this code with the library at '
             f'`{args.baseline}` ("base"); "iter speedup" = base iteration / new iteration.'
             if args.baseline else '')
  lines = ['# Speculative loop fixed costs: c, v(gamma), per-iteration overhead', '',
           f'Command: `{results["command"]}`', '',
           f'Random-init {args.target_preset} target, {args.draft_preset} draft ({args.dtype} '
           f'activations), input length {args.input_length}, '
           f'{args.max_decode_len} generated tokens per row (greedy, no EOS), step times at cache '
           f'fill {args.max_decode_len // 2}. c = draft step / target step; v = (gamma + 1)-token '
           'verify call / target step; overhead = loop iteration - propose - verify (in ms and in '
           f'target steps).{ab_note} Load average before/after: {load[0][0]:.1f} / {load[1][0]:.1f}'
           f' on {os.cpu_count()} cores' + (' (shared machine: absolute ms are contaminated).'
                                             if load[0][0] > 2.5 else ' (no other jobs).'), '']
  base = bool(args.baseline)
  lines += ['| batch | gamma | target ms | draft ms | c | verify ms | v | propose ms | iter ms |'
            + (' base iter ms | iter speedup |' if base else '') + ' overhead ms | overhead / target step |',
            '|---|---|---|---|---|---|---|---|---|' + ('---|---|' if base else '') + '---|---|']
  for r in results['rows']:
    extra = (f' {r["baseline_iteration_ms"]:.3f} | {r["iteration_speedup"]:.2f} |' if base else '')
    lines.append(f'| {r["batch"]} | {r["gamma"]} | {r["target_step_ms"]:.3f} | '
                 f'{r["draft_step_ms"]:.3f} | {r["c"]:.3f} | {r["verify_ms"]:.3f} | {r["v"]:.2f} | '
                 f'{r["propose_ms"]:.3f} | {r["iteration_ms"]:.3f} |{extra} '
                 f'{r["overhead_ms"]:.3f} | {r["overhead_target_steps"]:.2f} |')
  write_markdown(args.out + '.md', lines, results['machine'])


if __name__ == '__main__':
  main()
