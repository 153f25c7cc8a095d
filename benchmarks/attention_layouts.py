"""Decode cross-attention alone: the library's layout vs the former einsum, interleaved in one process.

  python -m benchmarks.attention_layouts [--batch 16] [--queries 1] [--length 2048] [--rounds 7] \
      [--out results/benchmarks/attention_layouts]

`mini`'s attention shapes (8 query heads, head_dim 32) over `--length` cached keys, for G in
{1, 2, 4, 8}. "library" is `gqa_spec.models.attention.grouped_attention` (keys `[b, G, d, L]`);
"former" is the parent commit's formulation (`[b, q, G, R, d] x [b, G, L, d]` einsums), kept here
only as the benchmark's baseline. Both run in the same process, alternating call by call, so they
share the machine's load; the outputs are checked equal first. Median over rounds of each round's
median of 15 calls; bytes = K + V read per call.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from gqa_spec.models.attention import grouped_attention


def former(query, key, value, mask):
  """The parent commit's grouped attention (keys `[b, G, L, d]`), without bias and dropout."""
  logits = jnp.einsum('bqgrd,bgkd->bgrqk', query, key)  # [b, G, R, q, L]
  logits = jnp.where(mask.reshape(mask.shape[0], 1, 1, *mask.shape[-2:]), logits, -1e10)
  weights = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum('bgrqk,bgkd->bqgrd', weights, value)  # [b, q, G, R, d]


def _median_ms(fn, args, calls: int = 15) -> float:
  # No warm-up: both are compiled by the equality check, and the rounds alternate.
  return common.median_seconds(lambda: fn(*args), calls, warmup=0) * 1e3


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--batch', type=int, default=16)
  p.add_argument('--queries', type=int, default=1)
  p.add_argument('--length', type=int, default=2048)
  p.add_argument('--rounds', type=int, default=7)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  heads, head_dim, b, q, length = 8, 32, args.batch, args.queries, args.length
  load_before = os.getloadavg()
  rows = []
  for groups in (1, 2, 4, 8):
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    query = jax.random.normal(k[0], (b, q, groups, heads // groups, head_dim))
    key = jax.random.normal(k[1], (b, groups, length, head_dim))  # [b, G, L, d]
    value = jax.random.normal(k[2], (b, groups, length, head_dim))
    mask = jnp.ones((b, 1, q, length), bool)
    lib = jax.jit(lambda qq, kk, vv, mm: grouped_attention(qq, kk, vv, mm, None))
    old = jax.jit(former)
    lib_args = (query, jnp.swapaxes(key, 2, 3), value, mask)
    old_args = (query, key, value, mask)
    np.testing.assert_allclose(lib(*lib_args), old(*old_args), rtol=1e-4, atol=1e-5)
    lib_ms, old_ms = [], []
    for _ in range(args.rounds):
      lib_ms.append(_median_ms(lib, lib_args))
      old_ms.append(_median_ms(old, old_args))
    row = {'kv_heads': groups, 'batch': b, 'queries': q, 'length': length,
           'library_ms': float(np.median(lib_ms)), 'former_ms': float(np.median(old_ms)),
           'kv_mib': 2 * key.nbytes / 2 ** 20, 'loadavg': os.getloadavg()[0]}
    row['speedup'] = row['former_ms'] / row['library_ms']
    rows.append(row)
    common.print_row(row)
  results = common.results(__file__, argv, rows, load_before)
  common.write_json(args.out, results)
  lines = [*common.heading('Decode attention: library layout vs the former einsum',
                           results['command']),
           f'8 query heads, head_dim 32, batch {b}, {q} query position(s), {length} keys; both '
           f'formulations in one process, alternating; median over {args.rounds} rounds of 15 '
           'calls. ' + common.load_note(load_before, os.getloadavg(),
                                        ' (the machine was shared with other jobs).'), '',
           '| K/V heads | K+V MiB | library ms | former ms | speedup |', '|---|---|---|---|---|']
  for r in rows:
    lines.append(f'| {r["kv_heads"]} | {r["kv_mib"]:.0f} | {r["library_ms"]:.2f} | '
                 f'{r["former_ms"]:.2f} | {r["speedup"]:.2f} |')
  common.write_markdown(args.out + '.md', lines, results['machine'])


if __name__ == '__main__':
  main()
