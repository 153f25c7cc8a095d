"""The layer contract: gqa_spec's modules import only downward, and no import closes a circle.

Layers, bottom to top (ARCHITECTURE.md): models; partitioning, checkpoints (and convert); data;
decoding; evaluation; training; reproduce; the command line (cli, status). `errors`, `progress`,
`rundir`, `rundir_lock`, `atomic` and `console` (process set-up: logging, stderr) are
standard-library-only leaves below everything. Every import statement
counts, the lazy ones inside functions included: a lazy import that hides a circle is a circle.
The graph is read from the source with `ast` (nothing is imported), so the test takes a second.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, List, Set

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'gqa_spec'

LAYERS = (
    ('gqa_spec.errors', 'gqa_spec.progress', 'gqa_spec.rundir', 'gqa_spec.rundir_lock',
     'gqa_spec.atomic', 'gqa_spec.console', 'gqa_spec.arguments', 'gqa_spec.pids'),
    ('gqa_spec.models',),
    ('gqa_spec.partitioning', 'gqa_spec.distributed', 'gqa_spec.checkpoints', 'gqa_spec.convert'),
    ('gqa_spec.data',),
    ('gqa_spec.decoding',),
    ('gqa_spec.evaluation',),
    ('gqa_spec.training',),
    ('gqa_spec.reproduce',),
    ('gqa_spec.status', 'gqa_spec.cli', 'gqa_spec.__main__'),
)


def _module_name(path: pathlib.Path, package: pathlib.Path) -> str:
  parts = path.relative_to(package.parent).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def import_graph(package: pathlib.Path = PACKAGE) -> Dict[str, Set[str]]:
  """Module -> the gqa_spec modules it imports anywhere in its source (functions included)."""
  modules = {_module_name(p, package): p for p in package.rglob('*.py')}
  graph = {}
  for name, path in modules.items():
    is_package = path.name == '__init__.py'
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        if node.level:  # relative: from the module's own package
          base = name.split('.') if is_package else name.split('.')[:-1]
          base = base[:len(base) - node.level + 1]
          source = '.'.join(base + ([node.module] if node.module else []))
        else:
          source = node.module or ''
        # `from pkg import sub` imports the submodule `pkg.sub` when there is one.
        targets = [f'{source}.{a.name}' if f'{source}.{a.name}' in modules else source
                   for a in node.names]
      else:
        continue
      edges.update(t for t in targets if t in modules and t != name)
    graph[name] = edges
  return graph


def layer_of(module: str) -> int:
  for i, members in enumerate(LAYERS):
    if any(module == m or module.startswith(m + '.') for m in members):
      return i
  raise AssertionError(f'{module} belongs to no layer: add it to LAYERS')


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
  return sorted(f'{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})'
                for m, targets in graph.items() if m != 'gqa_spec'
                for t in targets if t != 'gqa_spec' and layer_of(t) > layer_of(m))


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
  """The strongly connected components with more than one module (Tarjan's algorithm)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_every_import_runs_downward():
  assert upward_imports(import_graph()) == []


def test_no_import_circle():
  assert circles(import_graph()) == []


def test_the_contract_catches_what_it_forbids(tmp_path):
  # A lazy upward import and a lazy circle, in a throwaway package shaped like ours.
  pkg = tmp_path / 'gqa_spec'
  (pkg / 'decoding').mkdir(parents=True)
  (pkg / 'training').mkdir()
  for init in (pkg, pkg / 'decoding', pkg / 'training'):
    (init / '__init__.py').write_text('')
  (pkg / 'decoding' / 'loop.py').write_text(
      'def f():\n  from gqa_spec.training import trainer\n')
  (pkg / 'training' / 'trainer.py').write_text('from gqa_spec.decoding import loop\n')
  graph = import_graph(pkg)
  assert graph['gqa_spec.decoding.loop'] == {'gqa_spec.training.trainer'}
  assert upward_imports(graph) == [
      'gqa_spec.decoding.loop (layer 4) imports gqa_spec.training.trainer (layer 6)']
  assert circles(graph) == [['gqa_spec.decoding.loop', 'gqa_spec.training.trainer']]

