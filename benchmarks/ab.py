"""Before/after measurement on a shared machine: the same benchmark against two versions of gqa_spec.

A benchmark that takes `--baseline REF` measures the library at git `REF` (e.g. the parent commit)
beside the working tree's, in one run: `git archive REF gqa_spec` is unpacked into a temporary
directory (no change to the repository or its worktrees), and child processes of the same
benchmark script, one with each copy of `gqa_spec` first on `PYTHONPATH`, alternate round by round
(new, baseline, then baseline, new, ...: ABBA), so that load from other processes falls on both
alike and a steady drift in it cancels. Each child writes its rows as JSON; the parent takes per-row
medians over rounds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_argv(argv: Sequence[str]) -> List[str]:
  """A benchmark's own arguments minus the A/B ones (`--baseline`, `--rounds`, `--out`, with their
  values, as `--flag value` or `--flag=value`): what every child gets."""
  drop = {'--baseline', '--rounds', '--out'}
  return [a for i, a in enumerate(argv)
          if a not in drop and (i == 0 or argv[i - 1] not in drop)
          and not any(a.startswith(d + '=') for d in drop)]


def checkout(ref: str) -> str:
  """Unpacks `gqa_spec/` at git `ref` into a new temporary directory; returns that directory."""
  sha = subprocess.run(['git', 'rev-parse', '--short', ref], cwd=REPO, check=True,
                       capture_output=True, text=True).stdout.strip()
  out = tempfile.mkdtemp(prefix=f'gqa_spec_{sha}_')
  archive = subprocess.run(['git', 'archive', ref, 'gqa_spec'], cwd=REPO, check=True,
                           capture_output=True).stdout
  subprocess.run(['tar', '-x', '-C', out], input=archive, check=True)
  return out


def run_child(script: str, code_dir: str, argv: Sequence[str]) -> List[Dict[str, Any]]:
  """Runs `script --child-out FILE argv` with `code_dir` first on PYTHONPATH; returns its rows."""
  with tempfile.NamedTemporaryFile(suffix='.json', delete=False) as f:
    path = f.name
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([code_dir, os.environ.get('PYTHONPATH', '')]))
  subprocess.run([sys.executable, script, '--child-out', path, *argv], env=env, check=True)
  with open(path) as f:
    rows = json.load(f)
  os.unlink(path)
  return rows


def alternate(script: str, baseline_ref: str, argv: Sequence[str], rounds: int,
              key: Callable[[Dict[str, Any]], tuple], timed: Sequence[str]) -> Dict[str, Any]:
  """Alternates children of `script` on the working tree and on `baseline_ref`.

  Args:
    script: the benchmark script (its children get `--child-out`).
    baseline_ref: git ref of the baseline library.
    argv: arguments for every child.
    rounds: number of (new, baseline) pairs.
    key: a row's identity (configuration) across children.
    timed: row fields to take medians of over rounds.

  Returns:
    `{'rows': [...]}`: per configuration the new code's row with each timed field replaced by its
    median over rounds, plus `baseline_<field>` medians and the per-round values.
  """
  base_dir = checkout(baseline_ref)
  runs = {'new': [], 'baseline': []}
  try:
    for r in range(rounds):
      order = (('new', REPO), ('baseline', base_dir))
      for which, code_dir in (order if r % 2 == 0 else order[::-1]):  # ABBA: cancels a load trend
        print(f'round {r + 1}/{rounds}: {which}', flush=True)
        runs[which].append({key(row): row for row in run_child(script, code_dir, argv)})
  finally:
    shutil.rmtree(base_dir, ignore_errors=True)
  rows = []
  for k, row in runs['new'][0].items():
    row = dict(row)
    for field in timed:
      new = [run[k][field] for run in runs['new']]
      base = [run[k][field] for run in runs['baseline']]
      row[field], row['baseline_' + field] = float(np.median(new)), float(np.median(base))
      row[field + '_rounds'], row['baseline_' + field + '_rounds'] = new, base
    rows.append(row)
  return {'rows': rows, 'baseline_ref': baseline_ref, 'rounds': rounds}
