"""Per-op profile of one jitted XLA:CPU computation, summarised by op category.

`profile(fn, args)` compiles `fn`, runs it under `jax.profiler.trace` and reads the per-thunk
events of the host trace (`vm.trace.json.gz`, one event per executed HLO instruction or fusion,
named by `args.hlo_op`), summing their wall durations per instruction. Each instruction is put in
one category by what its optimised HLO contains (`categorize`):
  matmul       contains a dot / convolution (a YNNPACK fusion or XLA's own fusion of a dot with
               its elementwise neighbours), or a matmul custom call;
  rng          random bits: `rng-bit-generator` or threefry's shift-and-xor rounds on uint32;
  scatter      a scatter (embedding gradients, one-hot-free updates);
  reduction    a reduce / reduce-window (softmax sums, norms, the loss, Adafactor's factored stats,
               bias gradients summed over the batch), YNNPACK fusions of reductions included;
  copy         data movement only: copy / transpose / (dynamic-)slice / dynamic-update-slice /
               concatenate / pad / gather / broadcast / bitcast;
  control      while / conditional (their bodies' instructions are counted separately; a `call`,
               e.g. XLA:CPU's expansion of `rng-bit-generator`, is categorised by its body);
  elementwise  everything else (fusions of arithmetic).
Durations are per-thunk wall times on the XLA thread; with intra-op threads they can overlap, so
shares are of the summed thunk time, not of the step's wall time (both are reported).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Sequence

import jax

from benchmarks import common

CATEGORIES = ('matmul', 'rng', 'scatter', 'reduction', 'copy', 'control', 'elementwise')
_MOVE = {'copy', 'transpose', 'slice', 'dynamic-slice', 'dynamic-update-slice', 'concatenate',
         'pad', 'gather', 'broadcast', 'bitcast', 'reshape', 'parameter', 'constant', 'tuple',
         'get-tuple-element', 'iota', 'convert', 'copy-start', 'copy-done', 'reverse'}
_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([\w\-]+)\((.*)$')


def parse_hlo(text: str):
  """Optimised HLO text -> ({computation: [(name, opcode, type, rest)]}, {instruction: computation})."""
  comps: Dict[str, List[tuple]] = {}
  owner: Dict[str, str] = {}
  current = None
  for line in text.splitlines():
    head = re.match(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$', line)
    if head and not line.startswith(' '):
      current = head.group(1)
      comps[current] = []
      continue
    m = _INSTR.match(line)
    if m and current is not None:
      name, typ, opcode, rest = m.groups()
      comps[current].append((name, opcode, typ, rest))
      owner[name] = current
  return comps, owner


def _called(rest: str) -> List[str]:
  return re.findall(r'(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)', rest)


def categorize(opcode: str, typ: str, rest: str, comps) -> str:
  """One instruction's category (see the module docstring)."""
  if opcode in ('while', 'conditional'):
    return 'control'
  if opcode == 'custom-call' and re.search(r'custom_call_target="[^"]*(matmul|conv|gemm)', rest,
                                           re.IGNORECASE):
    return 'matmul'
  seen, stack, opcodes = set(), _called(rest), [opcode]
  while stack:
    c = stack.pop()
    if c in seen or c not in comps:
      continue
    seen.add(c)
    for _, op, t, r in comps[c]:
      opcodes.append((op, t))
      stack.extend(_called(r))
  ops = {o if isinstance(o, str) else o[0] for o in opcodes}
  if ops & {'dot', 'convolution'}:
    return 'matmul'
  if 'rng-bit-generator' in ops or 'rng' in ops:
    return 'rng'
  u32_shifts = any(isinstance(o, tuple) and o[0] in ('shift-right-logical', 'shift-left')
                   and 'u32' in o[1] for o in opcodes)
  if u32_shifts and 'xor' in ops:
    return 'rng'
  if 'scatter' in ops:
    return 'scatter'
  if ops & {'reduce', 'reduce-window', 'sort'}:
    return 'reduction'
  if ops <= _MOVE | {'fusion'}:
    return 'copy'
  return 'elementwise'


def profile(fn: Callable, args: Sequence[Any], repeats: int = 5) -> Dict[str, Any]:
  """Per-op and per-category thunk times of `jax.jit(fn)(*args)`, averaged over `repeats` runs."""
  jitted = jax.jit(fn)
  compiled = jitted.lower(*args).compile()
  text = compiled.as_text()
  comps, owner = parse_hlo(text)
  jax.block_until_ready(compiled(*args))
  logdir = tempfile.mkdtemp(prefix='op_profile_')
  try:
    t0 = time.perf_counter()
    with jax.profiler.trace(logdir):
      for _ in range(repeats):
        jax.block_until_ready(compiled(*args))
    wall = (time.perf_counter() - t0) / repeats
    path = glob.glob(os.path.join(logdir, 'plugins', 'profile', '*', '*.trace.json.gz'))[0]
    with gzip.open(path) as f:
      events = json.load(f)['traceEvents']
  finally:  # the trace is read: leave no directory behind
    shutil.rmtree(logdir, ignore_errors=True)
  per_op: Dict[str, float] = collections.defaultdict(float)
  counts: Dict[str, int] = collections.defaultdict(int)
  for e in events:
    op = e.get('args', {}).get('hlo_op')
    if e.get('ph') == 'X' and op and not e['name'].startswith('end:'):
      per_op[op] += e['dur'] / repeats  # microseconds per run
      counts[op] += 1
  index = {name: (opcode, typ, rest) for c in comps.values() for name, opcode, typ, rest in c}
  rows = []
  for op, us in per_op.items():
    opcode, typ, rest = index.get(op, ('?', '', ''))
    cat = categorize(opcode, typ, rest, comps) if op in index else 'elementwise'
    rows.append({'op': op, 'opcode': opcode, 'category': cat, 'us': us,
                 'calls': counts[op] // repeats, 'shape': typ[:80],
                 'computation': owner.get(op, '?')})
  rows.sort(key=lambda r: -r['us'])
  # Control instructions' time includes their bodies': leave them out of the category sums.
  leaf = [r for r in rows if r['category'] != 'control']
  total = sum(r['us'] for r in leaf)
  by_cat = {c: sum(r['us'] for r in leaf if r['category'] == c) for c in CATEGORIES if c != 'control'}
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  control = sum(r['us'] for r in rows if r['category'] == 'control')
  return {'wall_ms': wall * 1e3, 'thunk_total_ms': total / 1e3, 'control_ms': control / 1e3,
          'by_category_ms': {c: v / 1e3 for c, v in by_cat.items()},
          'by_category_share': {c: v / total for c, v in by_cat.items()} if total else {},
          'xla_flops': cost.get('flops'), 'xla_bytes_accessed': cost.get('bytes accessed'),
          'num_ops': len(rows), 'top_ops': rows[:300]}


def markdown(title: str, command: str, result: Dict[str, Any], note: str = '') -> List[str]:
  """Markdown lines: category table and the top ops."""
  lines = common.heading(title, command)
  if note:
    lines += [note, '']
  lines += [f'Wall time per run: {result["wall_ms"]:.2f} ms; summed thunk time '
            f'{result["thunk_total_ms"]:.2f} ms (thunks on the XLA threads; see '
            '`benchmarks/op_profile.py` for the categories), besides '
            f'{result["control_ms"]:.2f} ms of while/conditional thunks that contain listed ones.',
            '',
            '| category | ms | share |', '|---|---|---|']
  for c, v in sorted(result['by_category_ms'].items(), key=lambda kv: -kv[1]):
    lines.append(f'| {c} | {v:.2f} | {result["by_category_share"].get(c, 0):.1%} |')
  lines += ['', '| op | opcode | category | us | calls/run | output |', '|---|---|---|---|---|---|']
  def row(r):
    return (f'| {r["op"]} | {r["opcode"]} | {r["category"]} | {r["us"]:.0f} | {r["calls"]} '
            f'| `{r["shape"]}` |')
  lines += [row(r) for r in result['top_ops'][:20]]
  lines += ['', 'Largest non-matmul ops (control instructions excluded: their bodies are listed):',
            '', '| op | opcode | category | us | calls/run | output |', '|---|---|---|---|---|---|']
  lines += [row(r) for r in result['top_ops']
            if r['category'] not in ('matmul', 'control')][:20]
  return lines
