"""What a target call of k tokens per row costs against a one-token call, and why (XLA:CPU).

  python -m benchmarks.verify_width CHECKPOINT [--batches 1,8] [--tokens 1,2,3,5,9] \
      [--fill 16] [--repeats 20] [--out results/benchmarks/verify_width]

Speculative decoding pays when verifying gamma + 1 tokens costs about one target step (v(gamma)
near 1), as where a call is bound by reading the weights. For each batch size and token count k,
one `tokens_to_logits` call of the native checkpoint's decoder at cache fill `--fill` (encoder
inputs: random tokens, 64 long): its wall time (`timing.step_time`: a jitted loop of calls, the
fastest of 5 runs) and its ratio to the one-token call, and, from one per-op profile
(`op_profile.profile`), the summed time of its matmul thunks, the rate at which those read the
decoder's weights, and how XLA emitted its matmuls: as YNNPACK fusions (`__ynn_fusion`) or as
XLA's own dots. The measured memory bandwidth (`common.bandwidth`) is the limit beside them.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, op_profile, workloads
from gqa_spec.decoding import timing
from gqa_spec.decoding.targets import T5Decoder


def measure(args, model, params) -> list:
  """One row per (batch, k)."""
  target = T5Decoder(model)
  weights = workloads.tree_bytes(params['decoder'])
  rows = []
  for batch in (int(b) for b in args.batches.split(',')):
    enc = jnp.asarray(np.random.default_rng(0).integers(2, 8000, size=(batch, 64)), jnp.int32)
    tokens = [int(k) for k in args.tokens.split(',')]
    state = target.init(params, enc, args.fill + max(tokens) + 1)
    one = None
    for k in tokens:
      seconds = timing.step_time(target, state, k, args.fill, iters=args.repeats)
      one = seconds if k == 1 else one
      call = jax.jit(lambda s, k=k: target.tokens_to_logits(
          target.rollback(s, jnp.full((batch,), args.fill, jnp.int32)),
          jnp.full((batch, k), 5, jnp.int32))[0])
      prof = op_profile.profile(call, (state,))
      ynn, dots = _matmul_emitters(call.lower(state).compile().as_text())
      matmul = prof['by_category_ms']['matmul']
      row = {'batch': batch, 'tokens': k, 'call_ms': seconds * 1e3,
             'x_one_token': seconds / one if one else None, 'matmul_thunks_ms': matmul,
             'weights_gb_per_s': weights / (matmul / 1e3) / 1e9 if matmul else None,
             'ynn_fusions': ynn, 'xla_dots': dots}
      common.print_row(row)
      rows.append(row)
  return rows


def _matmul_emitters(hlo: str):
  """(YNNPACK fusions holding a dot, dots outside them) in optimised HLO text."""
  comps, _ = op_profile.parse_hlo(hlo)
  called = op_profile._called  # pylint: disable=protected-access
  ynn = {c for instrs in comps.values() for _, op, _, rest in instrs
         if op == 'fusion' and '__ynn_fusion' in rest for c in called(rest)}
  has_dot = lambda c: any(op == 'dot' for _, op, _, _ in comps.get(c, []))
  return (sum(1 for c in ynn if has_dot(c)),
          sum(1 for c, instrs in comps.items() if c not in ynn for _, op, _, _ in instrs
              if op == 'dot'))


def markdown(result) -> list:
  return common.table_report(
      'Target calls of k tokens against one-token calls (XLA:CPU)', result,
      f'Decoder weights {result["decoder_mib"]:.0f} MiB; measured memory bandwidth '
      f'{result["bandwidth_gb_per_s"]:.1f} GB/s, so reading them once takes '
      f'{result["bound_ms"]:.2f} ms. call ms: one `tokens_to_logits` call of k tokens a row '
      '(fastest of 5 runs of a loop of calls); x 1 token: over the one-token call; matmul ms: '
      'its matmul thunks, summed over XLA\'s threads (one per-op profile; with two threads at '
      'work the sum can exceed the call); weights GB/s: the decoder weights over that time; '
      'YNNPACK / XLA dots: how the optimised HLO emits its matmuls (`__ynn_fusion` fusions, dots '
      'outside them).',
      ['batch', 'k', 'call ms', 'x 1 token', 'matmul ms', 'weights GB/s', 'YNNPACK fusions',
       'XLA dots'],
      [[r['batch'], r['tokens'], f'{r["call_ms"]:.2f}', f'{r["x_one_token"]:.2f}',
        f'{r["matmul_thunks_ms"]:.2f}', f'{r["weights_gb_per_s"]:.1f}', r['ynn_fusions'],
        r['xla_dots']] for r in result['rows']]) + common.result_load_note(result)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('checkpoint', help='a native checkpoint directory (the target)')
  p.add_argument('--batches', default='1,8')
  p.add_argument('--tokens', default='1,2,3,5,9', help='k, tokens per row of a call (1 first)')
  p.add_argument('--fill', type=int, default=16, help='cache fill the calls append at')
  p.add_argument('--repeats', type=int, default=20, help='calls per timed loop')
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  if not args.tokens.startswith('1,'):
    raise SystemExit('--tokens must start with 1 (the one-token call the others are read against)')
  before = os.getloadavg()
  model, params = workloads.checkpoint_model(args.checkpoint)
  rows = measure(args, model, params)
  mib = workloads.tree_bytes(params['decoder']) / 2**20
  bandwidth = common.bandwidth()
  result = common.results(__file__, argv, rows, before, decoder_mib=mib,
                          bandwidth_gb_per_s=bandwidth / 1e9,
                          bound_ms=mib * 2**20 / bandwidth * 1e3)
  common.write_report(args.out, result, markdown(result))


if __name__ == '__main__':
  main()
