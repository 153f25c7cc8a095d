"""How many kernels one iteration of each decoding loop launches, read from the compiled program.

  python -m benchmarks.loop_kernels [--preset mini] [--batch 1] [--gamma 8] [--length 32] \
      [--methods greedy,speculative,fixed,onewidth,held,heuristic] \
      [--out results/benchmarks/loop_kernels]

Why: on an H200 greedy decoding's step at this size is launch-bound (166 us a step, ~20x the time
to read the decoder's weights), and the adaptive loop held at gamma 8 costs 34-47 us an iteration
more than `speculative.decode` (results/gpu/adaptive_2026-11-28b). A launch-bound loop's time
follows the number of kernels it launches, which the optimised HLO states: this counts them,
without timing anything, for the methods of `benchmarks/adaptive_overhead.py` (its `methods`: each
method's jitted decoding program, compiled for the arguments it is called with, `compiled_text`).

For every while loop of a program (in program order; a loop nested in another's body is listed
after it, with its trip count where XLA states one), the instructions of its body that run as
kernels, by `op_profile.categorize`'s category: every instruction but parameters, tuples and
their elements, constants and bitcasts; a fusion or a library call (cuBLAS, YNNPACK) is one
kernel. A `conditional` counts as one control instruction plus the largest of its branches
(`lax.switch` runs one); a nested `while` as one control instruction (its own body is its own
row). On XLA:GPU a while loop's predicate and a conditional's index are read by the host, each a
synchronisation. Counts differ between backends (XLA:CPU fuses differently); read the device's.

Beside the kernels, `cache copies`: the `copy` instructions of one iteration whose shape is a
self-attention K or V cache of the target, each a read and a write of a whole cache array (in the
body, the fusions and calls it runs, and a conditional's branch with the most). At T5.1.1-XXL,
batch 8 and 512 slots in bf16 with 64 K/V heads one such array is ~34 MB. The adaptive
loop's `lax.switch` over widths once had a copy of every layer's K and V in each branch (the
loops per width removed it); on this CPU greedy decoding's batch-1 step still copies each 4 times (XLA:CPU runs the
cache's write twice, for the loop's output and for the attention's unit-batch view of it).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
from typing import Any, Dict, List

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp

from benchmarks import adaptive_overhead, common, op_profile, workloads
from gqa_spec.decoding.drafts import NgramDraft
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models.config import preset
from gqa_spec.models.t5 import Transformer

FREE = {'parameter', 'get-tuple-element', 'tuple', 'constant', 'bitcast', 'after-all',
        'opt-barrier', 'domain'}


def _attribute(rest: str, name: str) -> List[str]:
  """The computations an instruction names in `name=%c` or `name={%a, %b}`."""
  m = re.search(name + r'=\{([^}]*)\}', rest) or re.search(name + r'=(%?[\w.\-]+)', rest)
  return [c.strip().lstrip('%') for c in m.group(1).split(',')] if m else []


def kernels(comps, computation: str) -> collections.Counter:
  """Kernel instructions of one run of `computation`, by category (module docstring)."""
  out = collections.Counter()
  for _, opcode, typ, rest in comps.get(computation, []):
    if opcode in FREE:
      continue
    if opcode == 'conditional':
      out['control'] += 1
      branches = [kernels(comps, b) for b in _attribute(rest, 'branch_computations')]
      branches += [kernels(comps, b) for b in _attribute(rest, 'true_computation')
                   + _attribute(rest, 'false_computation')]
      if branches:
        out.update(max(branches, key=lambda c: sum(c.values())))
    elif opcode == 'while':
      out['control'] += 1
    elif opcode == 'call':
      for c in _attribute(rest, 'to_apply'):
        out.update(kernels(comps, c))
    else:
      out[op_profile.categorize(opcode, typ, rest, comps)] += 1
  return out


def cache_copies(comps, computation: str, shapes) -> int:
  """`copy` instructions of one run of `computation` whose type (layout dropped) is in `shapes`,
  such as 'f32[1,8,41,32]': there, in what it calls, in a conditional's branch with the most; a
  nested loop's body is its own row."""
  count = 0
  for _, opcode, typ, rest in comps.get(computation, []):
    if opcode == 'copy' and typ.split('{')[0] in shapes:
      count += 1
    elif opcode == 'conditional':
      count += max((cache_copies(comps, b, shapes) for b in _attribute(rest, 'branch_computations')
                    + _attribute(rest, 'true_computation') + _attribute(rest, 'false_computation')),
                   default=0)
    elif opcode != 'while':
      count += sum(cache_copies(comps, c, shapes) for c in _attribute(rest, 'calls')
                   + _attribute(rest, 'to_apply'))
  return count


def _entry(hlo: str) -> str:
  return re.search(r'^ENTRY\s+%?([\w.\-]+)', hlo, re.MULTILINE).group(1)


def entry_copies(hlo: str, shapes) -> int:
  """`cache_copies` of the optimised `hlo` text's entry computation: the copies made once a call,
  outside every loop."""
  comps, _ = op_profile.parse_hlo(hlo)
  return cache_copies(comps, _entry(hlo), shapes)


def loops(hlo: str, shapes=frozenset()) -> List[Dict[str, Any]]:
  """Every while loop of the optimised `hlo` text: its body's name, depth, XLA's known trip count
  (None where not stated), its kernels per iteration, total and by category, and its copies of
  arrays of `shapes` (`cache_copies`)."""
  comps, _ = op_profile.parse_hlo(hlo)
  entry = _entry(hlo)
  rows: List[Dict[str, Any]] = []

  def visit(computation: str, depth: int, seen: frozenset) -> None:
    for _, opcode, _, rest in comps.get(computation, []):
      called = (_attribute(rest, 'branch_computations') + _attribute(rest, 'true_computation')
                + _attribute(rest, 'false_computation') + _attribute(rest, 'to_apply')
                if opcode in ('conditional', 'call') else [])
      if opcode == 'while':
        body = _attribute(rest, 'body')[0]
        trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
        count = kernels(comps, body)
        rows.append({'body': body, 'depth': depth, 'trip_count': int(trip.group(1)) if trip
                     else None, 'kernels': sum(count.values()), 'by_category': dict(count),
                     'cache_copies': cache_copies(comps, body, shapes)})
        called = [body]
      for c in called:
        if c not in seen:
          visit(c, depth + (opcode == 'while'), seen | {c})

  visit(entry, 0, frozenset({entry}))
  return rows


def measure(args) -> List[Dict[str, Any]]:
  model = Transformer(preset(args.preset))
  params = workloads.random_params(model)
  target = T5Decoder(model)
  vocab = model.config.vocab_size
  enc = jnp.asarray(workloads.synthetic_inputs(args.batch, args.input_length, vocab, seed=0))
  tstate = target.init(params, enc, args.length + args.gamma + 1)
  draft = NgramDraft(vocab)
  dstate = draft.init(workloads.output_bigram(model, params, args.input_length, args.length))
  rows = []
  shapes = {f'{leaf.dtype.name.replace("float", "f")}'
            f'[{",".join(map(str, leaf.shape))}]'
            for path, leaf in jax.tree_util.tree_flatten_with_path(tstate.cache)[0]
            if 'self_attention' in jax.tree_util.keystr(path)}  # e.g. f32[1,8,32,41]
  every = adaptive_overhead.methods(target, tstate, draft, dstate, args.batch, args.gamma)
  for key in args.methods.split(','):
    name, run = every[key]
    for i, loop in enumerate(loops(compiled_text(lambda run=run: run(args.length)), shapes)):
      rows.append({'method': name, 'loop': i, **loop})
      common.print_row({k: v for k, v in rows[-1].items() if k != 'by_category'})
  return rows


def compiled_text(call) -> str:
  """The optimised HLO of the jitted program `call()` runs: its top-level jitted call with the
  largest body (the decoding loop's; helpers such as a key split are smaller), compiled for the
  arguments it is given there (traced arguments stay arguments, so nothing is folded that the
  running program does not fold)."""
  closed = jax.make_jaxpr(call)()
  eqns = [e for e in closed.jaxpr.eqns if e.primitive.name in ('jit', 'pjit')]
  eqn = max(eqns, key=lambda e: len(e.params['jaxpr'].jaxpr.eqns))
  avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
  program = jax.jit(jax_core.jaxpr_as_fun(eqn.params['jaxpr']))
  return program.lower(*avals).compile().as_text()


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--preset', default='mini', help='the random-init target (models/presets.py)')
  p.add_argument('--batch', type=int, default=1)
  p.add_argument('--gamma', type=int, default=8)
  p.add_argument('--length', type=int, default=32, help='tokens decoded (max_decode_len)')
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--methods', default=','.join(adaptive_overhead.METHODS),
                 help=f'comma-separated, of {",".join(adaptive_overhead.METHODS)}')
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  unknown = set(args.methods.split(',')) - set(adaptive_overhead.METHODS)
  if unknown:
    p.error(f'--methods: unknown {",".join(sorted(unknown))}; choose from '
            f'{",".join(adaptive_overhead.METHODS)}')
  load_before = os.getloadavg()
  rows = measure(args)
  results = common.results(__file__, argv, rows, load_before, batch=args.batch, gamma=args.gamma,
                           preset=args.preset, xla_flags=os.environ.get('XLA_FLAGS', ''))
  common.write_json(args.out, results)
  cats = op_profile.CATEGORIES
  lines = [*common.heading('Kernels launched per iteration of each decoding loop',
                           results['command']),
           f'Backend {jax.default_backend()}, XLA_FLAGS `{results["xla_flags"] or "(none)"}`. '
           f'Random-init `{args.preset}` target, bigram draft, batch {args.batch}, gamma '
           f'{args.gamma}, {args.length} tokens. Per loop body: the instructions that run as '
           f'kernels (a conditional: one control instruction and its largest branch; a nested '
           f'loop: one control instruction and a row of its own), from the compiled HLO; cache '
           f'copies: copies of a whole self-attention K or V cache array per iteration.', '',
           *common.table_head(['method', 'loop', 'depth', 'trip count', 'kernels', *cats,
                               'cache copies'])]
  for r in rows:
    lines.append(f'| {r["method"]} | {r["loop"]} | {r["depth"]} | {r["trip_count"] or ""} | '
                 f'{r["kernels"]} | ' + ' | '.join(str(r['by_category'].get(c, 0)) for c in cats)
                 + f' | {r["cache_copies"]} |')
  common.write_markdown(args.out + '.md', lines, results['machine'])


if __name__ == '__main__':
  main()
