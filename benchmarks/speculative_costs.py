"""The speculative loop's fixed costs: c, v(gamma) and the loop's own per-iteration overhead.

  python -m benchmarks.speculative_costs [--batch 1,8] [--gammas 1,2,3,4,5,6,7] \
      [--input-length 64] [--max-decode-len 64] [--baseline REF --rounds 3] \
      [--out results/benchmarks/speculative_costs]

Random-init `mini` target and `nano` draft by default (`--target-preset`, `--draft-preset`; costs do
not depend on the weights). Per batch size:
  target_step_ms   one 1-token target decode call at cache fill max_decode_len / 2
                   (`timing.step_time`: a jitted loop of calls, rolled back, least disturbed run);
  draft_step_ms    the same for the draft; c = draft_step / target_step;
and per gamma:
  verify_ms        one (gamma + 1)-token target call; v(gamma) = verify / target_step;
  propose_ms       one `ModelDraft.propose` of gamma tokens plus its `commit`
                   (`timing.propose_time`: a 2-token call, then gamma - 1 1-token calls, sampling);
  iteration_ms     wall time of `speculative.decode` (greedy, EOS never produced: every row runs
                   to max_decode_len) minus its init calls, / its loop iterations (least disturbed
                   of --repeats runs, like the step times);
  overhead_ms      iteration - propose - verify: what the loop itself adds (verification, appends,
                   rollbacks, statistics, the while-loop's bookkeeping), also in target steps.
`--baseline REF` measures the library at git REF beside the working tree's in alternating child
processes (`common.py`'s A/B protocol) and reports both. `--profile B,GAMMA` instead writes the per-op profile
(`op_profile.py`) of one `speculative.decode` call at batch B and that gamma to `<out>_profile.*`.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, op_profile, workloads
from gqa_spec.decoding import speculative, timing
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.models.config import preset
from gqa_spec.models.t5 import Transformer

TIMED = ('target_step_ms', 'draft_step_ms', 'verify_ms', 'propose_ms', 'iteration_ms',
         'overhead_ms', 'c', 'v', 'overhead_target_steps')


def _draft_layers(args) -> list:
  """`--draft-layers` as a list: None (the draft preset's own depth) or a layer count, per entry."""
  return [None if d == 'all' else int(d) for d in args.draft_layers.split(',')]


def _init(args):
  init = workloads.shaped_random_params if args.shaped_setup else workloads.random_params
  return lambda model: init(model, dtype=args.param_dtype)


def _draft(args, layers):
  """`(draft, draft params)`: `--draft-preset` with `layers` encoder and decoder layers (None: its
  own), in `--dtype`, parameters cast to `--param-dtype`."""
  depth = {} if layers is None else dict(num_encoder_layers=layers, num_decoder_layers=layers)
  draft_model = Transformer(preset(args.draft_preset, dtype=args.dtype, **depth))
  return ModelDraft.t5(draft_model), _init(args)(draft_model)


def _setup(args, batch: int):
  """The random-init target named by `--target-preset` (in `--dtype`, parameters cast to
  `--param-dtype`) and the first `--draft-layers` draft, as `(target, target params, draft, draft
  params, encoder tokens [batch, --input-length])`."""
  target_model = Transformer(preset(args.target_preset, dtype=args.dtype))
  rng = np.random.default_rng(0)
  enc = jnp.asarray(rng.integers(2, 8000, size=(batch, args.input_length)), jnp.int32)  # [b, S]
  return (T5Decoder(target_model), _init(args)(target_model),
          *_draft(args, _draft_layers(args)[0]), enc)


def measure(args) -> list:
  """One row per (batch, draft depth, gamma); the target's costs are measured once per batch."""
  gammas = [int(g) for g in args.gammas.split(',')]
  length = args.max_decode_len
  rows = []
  for batch in (int(b) for b in args.batch.split(',')):
    target, tparams, draft, dparams, enc = _setup(args, batch)
    slots = cache_length(length, max(gammas) + 1)
    tstate = target.init(tparams, enc, slots)
    t_target = timing.step_time(target, tstate, 1, length // 2)
    t_verify = {g: timing.step_time(target, tstate, g + 1, length // 2) for g in gammas}
    for i, layers in enumerate(_draft_layers(args)):
      if i:
        draft, dparams = _draft(args, layers)
      rows += _draft_rows(args, batch, layers, gammas, target, tparams, draft, dparams, enc,
                          t_target, t_verify)
  return rows


def _draft_rows(args, batch, layers, gammas, target, tparams, draft, dparams, enc, t_target,
                t_verify) -> list:
  """The rows of one draft: its step, and per gamma its proposal and the loop's iteration."""
  length = args.max_decode_len
  slots = cache_length(length, max(gammas) + 1)
  rows = []
  dstate0 = draft.init(dparams, enc, length, max(gammas))
  t_draft = timing.step_time(draft.decoder, dstate0, 1, length // 2)
  for gamma in gammas:
    t_propose = timing.propose_time(draft, dstate0, gamma, batch, length)

    def run(gamma=gamma):
      return speculative.decode(target, target.init(tparams, enc, slots), draft,
                                draft.init(dparams, enc, length, gamma), jax.random.PRNGKey(1),
                                gamma=gamma, max_decode_len=length, eos_id=-1)
    iterations = int(run().loop_iterations)
    # The init calls (encoder passes) are timed apart and subtracted. Least disturbed runs, as
    # for the step times (`timing.step_time` / `propose_time`), so the difference compares like
    # with like on a loaded machine.
    init_secs = common.best_seconds(lambda gamma=gamma: (target.init(tparams, enc, slots),
                                                      draft.init(dparams, enc, length, gamma)),
                                 args.repeats)
    loop_secs = common.best_seconds(run, args.repeats) - init_secs
    t_iter = loop_secs / iterations
    row = {'batch': batch, 'gamma': gamma, 'input_length': args.input_length,
           'target': args.target_preset, 'draft': args.draft_preset,
           'draft_layers': layers, 'dtype': args.dtype,
           'param_dtype': args.param_dtype or 'float32',
           'max_decode_len': length, 'loop_iterations': iterations,
           'target_step_ms': t_target * 1e3, 'draft_step_ms': t_draft * 1e3,
           'verify_ms': t_verify[gamma] * 1e3, 'propose_ms': t_propose * 1e3,
           'iteration_ms': t_iter * 1e3, 'overhead_ms': (t_iter - t_propose - t_verify[gamma]) * 1e3,
           'c': t_draft / t_target, 'v': t_verify[gamma] / t_target,
           'overhead_target_steps': (t_iter - t_propose - t_verify[gamma]) / t_target,
           'loadavg': os.getloadavg()[0]}
    rows.append(row)
    common.print_row(row)
  return rows


def profile_loop(args, argv) -> None:
  """Writes the per-op profile of one speculative.decode call (see `--profile`)."""
  batch, gamma = (int(x) for x in args.profile.split(','))
  target, tparams, draft, dparams, enc = _setup(args, batch)
  length = args.max_decode_len
  tstate = target.init(tparams, enc, cache_length(length, gamma + 1))
  dstate = draft.init(dparams, enc, length, gamma)
  load_before = os.getloadavg()
  result = op_profile.profile(
      lambda t, d: speculative.decode(target, t, draft, d, jax.random.PRNGKey(1), gamma=gamma,
                                      max_decode_len=length, eos_id=-1), (tstate, dstate),
      args.repeats)
  command = common.command(__file__, argv)
  load = [load_before, os.getloadavg()]
  result.update({'command': command, 'batch': batch, 'gamma': gamma, 'loadavg_before_after': load})
  out = args.out + '_profile'
  common.write_json(out, result)
  note = (f'One `speculative.decode` call: random-init {args.target_preset} target, '
          f'{args.draft_preset} draft, batch {batch}, '
          f'gamma {gamma}, input length {args.input_length}, {length} tokens per row (greedy, no '
          f'EOS; the random draft is almost never accepted, so about {length} loop iterations: '
          f'"calls/run" {length} = once per iteration, {length * (gamma - 1)} = once per draft '
          f'scan step). ' + common.load_note(*load, ' (shared machine: per-thunk times of small ops '
                                                'include preemption; shares of the large ones are '
                                                'what to read).', ' (no other jobs).'))
  common.write_lines(out + '.md', op_profile.markdown('Speculative loop: per-op profile', command,
                                                      result, note))


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--batch', default='1,8')
  p.add_argument('--gammas', default='1,2,3,4,5,6,7')
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--max-decode-len', type=int, default=64)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--shaped-setup', action='store_true',
                 help='random normal parameters of the right shapes, no compiled init')
  p.add_argument('--target-preset', default='mini')
  p.add_argument('--draft-preset', default='nano')
  p.add_argument('--draft-layers', default='all',
                 help='the draft preset with this many encoder and decoder layers (e.g. a 2-layer '
                      'small: --draft-preset small --draft-layers 2); a comma list measures each '
                      "against the same target ('all': the preset's own depth)")
  common.add_dtype_argument(p)
  common.add_ab_arguments(p)
  p.add_argument('--profile', default=None, help='B,GAMMA: write the loop\'s per-op profile')
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  if args.profile:
    profile_loop(args, argv)
    return
  load_before = os.getloadavg()
  rows = common.rows(__file__, args, argv, measure,
                     key=lambda r: (r['batch'], str(r['draft_layers']), r['gamma']),
                     timed=TIMED + ('loadavg',))
  if rows is None:  # an A/B child: its rows are written
    return
  if args.baseline:
    for r in rows:
      r['iteration_speedup'] = r['baseline_iteration_ms'] / r['iteration_ms']
      # Per-round ratios (each new child beside its own baseline child): the load-robust figure.
      r['iteration_ratio_rounds'] = [b / n for b, n in zip(r['baseline_iteration_ms_rounds'],
                                                            r['iteration_ms_rounds'])]
  results = common.results(__file__, argv, rows, load_before, **common.ab_fields(args))
  write(results, args)


def write(results, args) -> None:
  common.write_json(args.out, results)
  load = results['loadavg_before_after']
  ab_note = (f' Median over {args.rounds} rounds alternating this code with the library at '
             f'`{args.baseline}` ("base"); "iter speedup" = base iteration / new iteration.'
             if args.baseline else '')
  lines = [*common.heading('Speculative loop fixed costs: c, v(gamma), per-iteration overhead',
                           results['command']),
           f'Random-init {args.target_preset} target, {args.draft_preset} draft ({args.dtype} '
           f'activations), input length {args.input_length}, '
           f'{args.max_decode_len} generated tokens per row (greedy, no EOS), step times at cache '
           f'fill {args.max_decode_len // 2}. c = draft step / target step; v = (gamma + 1)-token '
           'verify call / target step; overhead = loop iteration - propose - verify (in ms and in '
           f'target steps).{ab_note} '
           + common.load_note(*load, ' (shared machine: absolute ms are contaminated).',
                              ' (no other jobs).'), '']
  base = bool(args.baseline)
  lines += common.table_head(
      ['batch', 'draft layers', 'gamma', 'target ms', 'draft ms', 'c', 'verify ms', 'v', 'propose ms', 'iter ms']
      + (['base iter ms', 'iter speedup'] if base else []) + ['overhead ms', 'overhead / target step'])
  for r in results['rows']:
    extra = (f' {r["baseline_iteration_ms"]:.3f} | {r["iteration_speedup"]:.2f} |' if base else '')
    depth = 'all' if r.get('draft_layers') is None else r['draft_layers']
    lines.append(f'| {r["batch"]} | {depth} | {r["gamma"]} | {r["target_step_ms"]:.3f} | '
                 f'{r["draft_step_ms"]:.3f} | {r["c"]:.3f} | {r["verify_ms"]:.3f} | {r["v"]:.2f} | '
                 f'{r["propose_ms"]:.3f} | {r["iteration_ms"]:.3f} |{extra} '
                 f'{r["overhead_ms"]:.3f} | {r["overhead_target_steps"]:.2f} |')
  common.write_markdown(args.out + '.md', lines, results['machine'])


if __name__ == '__main__':
  main()
