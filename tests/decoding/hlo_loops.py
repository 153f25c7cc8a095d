"""The while loops of an optimised HLO module's text, for tests that guard a compiled program's
property (no whole-cache copy inside a decoding loop's body): the loops, the kernels of one
iteration by opcode, and the `copy` instructions of given shapes. (From the former
`benchmarks/loop_kernels.py` and `benchmarks/op_profile.py`.)"""

from __future__ import annotations

import collections
import re
from typing import Any, Dict, List

FREE = {'parameter', 'get-tuple-element', 'tuple', 'constant', 'bitcast', 'after-all',
        'opt-barrier', 'domain'}
_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([\w\-]+)\((.*)$')


def parse_hlo(text: str) -> Dict[str, List[tuple]]:
  """Optimised HLO text -> {computation: [(name, opcode, type, rest)]}."""
  comps: Dict[str, List[tuple]] = {}
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
  return comps


def _attribute(rest: str, name: str) -> List[str]:
  """The computations an instruction names in `name=%c` or `name={%a, %b}`."""
  m = re.search(name + r'=\{([^}]*)\}', rest) or re.search(name + r'=(%?[\w.\-]+)', rest)
  return [c.strip().lstrip('%') for c in m.group(1).split(',')] if m else []


def _branches(rest: str) -> List[str]:
  return (_attribute(rest, 'branch_computations') + _attribute(rest, 'true_computation')
          + _attribute(rest, 'false_computation'))


def kernels(comps, computation: str) -> collections.Counter:
  """Kernel instructions of one run of `computation` by opcode: a conditional's branch with the
  most, what a call applies; a nested loop counts as one control instruction."""
  out = collections.Counter()
  for _, opcode, _, rest in comps.get(computation, []):
    if opcode in FREE:
      continue
    if opcode in ('conditional', 'while'):
      out['control'] += 1
      if opcode == 'conditional':
        branches = [kernels(comps, b) for b in _branches(rest)]
        if branches:
          out.update(max(branches, key=lambda c: sum(c.values())))
    elif opcode == 'call':
      for c in _attribute(rest, 'to_apply'):
        out.update(kernels(comps, c))
    else:
      out[opcode] += 1
  return out


def cache_copies(comps, computation: str, shapes) -> int:
  """`copy` instructions of one run of `computation` whose type (layout dropped) is in `shapes`:
  there, in what it calls, in a conditional's branch with the most; a nested loop's body is its
  own."""
  count = 0
  for _, opcode, typ, rest in comps.get(computation, []):
    if opcode == 'copy' and typ.split('{')[0] in shapes:
      count += 1
    elif opcode == 'conditional':
      count += max((cache_copies(comps, b, shapes) for b in _branches(rest)), default=0)
    elif opcode != 'while':
      count += sum(cache_copies(comps, c, shapes) for c in _attribute(rest, 'calls')
                   + _attribute(rest, 'to_apply'))
  return count


def _entry(hlo: str) -> str:
  return re.search(r'^ENTRY\s+%?([\w.\-]+)', hlo, re.MULTILINE).group(1)


def entry_copies(hlo: str, shapes) -> int:
  """`cache_copies` of the entry computation: the copies made once a call, outside every loop."""
  return cache_copies(parse_hlo(hlo), _entry(hlo), shapes)


def loops(hlo: str, shapes=frozenset()) -> List[Dict[str, Any]]:
  """Every while loop: its body's name, depth, its kernels per iteration (total and by opcode)
  and its copies of arrays of `shapes`."""
  comps = parse_hlo(hlo)
  rows: List[Dict[str, Any]] = []

  def visit(computation: str, depth: int, seen: frozenset) -> None:
    for _, opcode, _, rest in comps.get(computation, []):
      called = (_branches(rest) + _attribute(rest, 'to_apply')
                if opcode in ('conditional', 'call') else [])
      if opcode == 'while':
        body = _attribute(rest, 'body')[0]
        count = kernels(comps, body)
        rows.append({'body': body, 'depth': depth, 'kernels': sum(count.values()),
                     'by_opcode': dict(count), 'cache_copies': cache_copies(comps, body, shapes)})
        called = [body]
      for c in called:
        if c not in seen:
          visit(c, depth + (opcode == 'while'), seen | {c})

  entry = _entry(hlo)
  visit(entry, 0, frozenset({entry}))
  return rows
