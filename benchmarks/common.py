"""What every benchmark shares: the machine and its limits, timing, writers, the A/B protocol.

Benchmarks run as modules from the repository root (`python -m benchmarks.NAME ...`).

* Machine: `machine()` describes it (lscpu head, JAX, devices, device kind, load average);
  `bandwidth()` and `matmul_rate()` probe its memory bandwidth and matmul rate, the limits a
  measured time is read against.
* Timing: `seconds()` of one call, `timed_runs()` after untimed warm-up calls, `median_seconds()` /
  `best_seconds()` over repeats. Every timed call is followed by `jax.block_until_ready`, so the
  asynchronous dispatch does not end the clock early.
* Options: `add_dtype_argument()` (`--dtype`, `--param-dtype`), `add_out_argument()` (`--out`,
  `--force`).
* Where results go: `--out PATH` writes PATH.json and PATH.md; without it a benchmark writes under
  `run_dir()` (`runs/benchmarks/`, or `$GQA_SPEC_BENCH_DIR`), never into the committed `results/`.
  `write_report` refuses to replace a result file that holds more rows than the new one (a smaller
  or cut-short run) unless `--force`: it says so in one line, keeps the new result under
  `run_dir()/refused/` and the benchmark exits 1.
* Writers: `command()` (the command line to record), `results()` (the JSON), `ab_fields()`,
  `heading()`, `table_head()`, `print_row()`, `write_json()`, `write_markdown()` (ending with the
  machine section), `write_lines()`, `write_report()`, `load_note()`.
* Side by side: `interleaved()` times several methods in rounds, the order rotated each round.
* A/B (`--baseline REF --rounds N`): the same benchmark against two versions of gqa_spec on a shared
  machine. `git archive REF gqa_spec` is unpacked into a temporary directory (no change to the
  repository or its worktrees), and child processes of the benchmark (`--child-out FILE`), one with
  each copy of `gqa_spec` first on `PYTHONPATH`, alternate round by round (new, baseline, then
  baseline, new, ...: ABBA), so that load from other processes falls on both alike and a steady
  drift in it cancels. Each child writes its rows as JSON; the parent takes per-row medians over
  rounds. A benchmark adds the options with `add_ab_arguments` and gets its rows from `rows()`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec import atomic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A 1-minute load average above this (on the 2-core machines the CPU results come from) means other
# jobs shared the machine: the writers say so beside the timings.
SHARED_LOAD = 2.5


# ----------------------------------------------------------------------------- machine and limits


def machine() -> Dict[str, Any]:
  """The machine a benchmark ran on, for its JSON `machine` key and markdown machine section."""
  try:
    lscpu = subprocess.run(['lscpu'], capture_output=True, text=True, check=False).stdout
  except OSError:
    lscpu = ''
  return {'lscpu_head': lscpu.splitlines()[:12], 'python': platform.python_version(),
          'jax': jax.__version__, 'devices': [str(d) for d in jax.devices()],
          'device_kind': jax.devices()[0].device_kind,
          'note': 'Load average (1 / 5 / 15 min) when written: %.1f / %.1f / %.1f on %d cores%s.'
                  % (*os.getloadavg(), os.cpu_count(),
                     ' (other jobs were running: timings are noisy)'
                     if os.getloadavg()[1] > SHARED_LOAD else '')}


def bandwidth_mib() -> int:
  """Size of the bandwidth probe: 256 MiB on CPU, 2 GiB on an accelerator (so that the read and not
  the dispatch dominates the timing)."""
  return 256 if jax.default_backend() == 'cpu' else 2048


def bandwidth(repeats: int = 5) -> float:
  """Bytes/s of a jitted sum over `bandwidth_mib()` MiB of float32 (least disturbed run)."""
  x = jnp.ones((bandwidth_mib() * 2 ** 20 // 4,), jnp.float32)
  f = jax.jit(jnp.sum)
  return x.nbytes / best_seconds(lambda: f(x), repeats)


def matmul_rate(m: int, k: int, n: int, repeats: int = 5, dtype=jnp.float32) -> float:
  """FLOP/s of a jitted `[m, k] x [k, n]` product in `dtype` (least disturbed run)."""
  ka, kb = jax.random.split(jax.random.PRNGKey(m + k + n))
  # Random operands, not zeros or ones (which a backend may special-case).
  a, b = jax.random.normal(ka, (m, k), dtype), jax.random.normal(kb, (k, n), dtype)  # [m, k], [k, n]
  f = jax.jit(lambda x, y: x @ y)
  return 2 * m * k * n / best_seconds(lambda: f(a, b), repeats)


# ----------------------------------------------------------------------------- timing


def seconds(fn: Callable[[], Any]) -> float:
  """Wall seconds of one `fn()`, until its results are ready."""
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def timed_runs(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> List[float]:
  """Seconds of `repeats` runs of `fn()` after `warmup` untimed ones (the first compiles)."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  return [seconds(fn) for _ in range(repeats)]


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
  """Median of `timed_runs`: the figure to report on a machine whose load varies."""
  return float(np.median(timed_runs(fn, repeats, warmup)))


def best_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
  """Least disturbed of `timed_runs`: a hardware probe's figure (its rate cannot be exceeded)."""
  return min(timed_runs(fn, repeats, warmup))


# ----------------------------------------------------------------------------- writers


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
  """`--dtype`: the models' activation (and so K/V cache) dtype; `--param-dtype`: the parameters',
  cast once after init (`gqa_spec.checkpoints.param_dtype`; default float32, as t5x trains)."""
  parser.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'),
                      help='activation (and so K/V cache) dtype')
  parser.add_argument('--param-dtype', default=None, choices=('float32', 'bfloat16'),
                      help='cast the floating parameters to this dtype once (default: float32)')


def table_head(columns: Sequence[str]) -> List[str]:
  """A markdown table's header and separator lines."""
  return ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> List[str]:
  """A markdown table: `table_head(columns)` and one line per row of (formatted) cells."""
  return table_head(columns) + ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]


def table_report(title: str, result: Dict[str, Any], description: str, columns: Sequence[str],
                 cells: Sequence[Sequence[Any]]) -> List[str]:
  """A benchmark's markdown of one table: `heading`, a description paragraph, `table`."""
  return heading(title, result['command']) + [description, ''] + table(columns, cells)


def result_load_note(result: Dict[str, Any],
                     shared: str = ': the machine was shared with other jobs.') -> List[str]:
  """A blank line and `load_note` of a result's `loadavg_before_after`: a markdown's last lines."""
  before, after = result['loadavg_before_after']
  return ['', load_note(before, after, shared)]


def run_dir() -> str:
  """Where a benchmark writes without `--out`: `$GQA_SPEC_BENCH_DIR`, else `runs/benchmarks`
  (git-ignored; committed results are written only when `--out` names them)."""
  return os.environ.get('GQA_SPEC_BENCH_DIR') or os.path.join('runs', 'benchmarks')


def add_out_argument(parser: argparse.ArgumentParser, file: str) -> None:
  """`--out PATH` (no extension: the benchmark writes PATH.json and PATH.md), by default
  `run_dir()/NAME` for the benchmark module at `file`; `--force`: replace a result file that
  holds more rows."""
  name = os.path.splitext(os.path.basename(file))[0]
  parser.add_argument('--out', default=os.path.join(run_dir(), name),
                      help='output path without extension (writes OUT.json and OUT.md; default '
                           f'{os.path.join(run_dir(), name)})')
  parser.add_argument('--force', action='store_true',
                      help='replace OUT.json even where it holds more rows than this run')


class Refused(Exception):
  """A write that would replace a result file holding more rows than the new result."""


def rows_in(path: str) -> Optional[int]:
  """The number of rows of the result file `path` (None: no such file, or not a result)."""
  try:
    with open(path) as f:
      old = json.load(f)
  except (OSError, ValueError):
    return None
  return len(old['rows']) if isinstance(old, dict) and isinstance(old.get('rows'), list) else None


def check_replace(out: str, result: Any, force: bool = False) -> None:
  """Raises `Refused` where `out + '.json'` holds more rows than `result` and not `force`."""
  old = rows_in(out + '.json')
  new = len(result['rows']) if isinstance(result, dict) and 'rows' in result else None
  if not force and old is not None and new is not None and new < old:
    raise Refused(f'{out}.json holds {old} rows and this run {new}: not replaced (--force '
                  'replaces it, --out writes elsewhere)')


def command(file: str, argv: Optional[Sequence[str]] = None) -> str:
  """The command line that runs the benchmark module at `file` with `argv` (default: this one's)."""
  name = os.path.splitext(os.path.basename(file))[0]
  # Quoted for a shell: a tree list such as 'topk:4,2,2;best:16' stays one argument.
  return ' '.join(['python -m benchmarks.' + name,
                   shlex.join(sys.argv[1:] if argv is None else argv)]).rstrip()


def results(file: str, argv: Optional[Sequence[str]], rows: List[Dict[str, Any]],
            load_before: Sequence[float], **fields) -> Dict[str, Any]:
  """A benchmark's JSON: its `command`, `fields`, its `rows`, `loadavg_before_after` (the load
  average before it measured and now) and the `machine`."""
  return {'command': command(file, argv), **fields, 'rows': rows,
          'loadavg_before_after': [list(load_before), list(os.getloadavg())], 'machine': machine()}


def ab_fields(args: argparse.Namespace) -> Dict[str, Any]:
  """The JSON fields of the A/B options: `baseline` (a git ref or None) and `rounds`."""
  return {'baseline': args.baseline, 'rounds': args.rounds if args.baseline else 1}


def heading(title: str, command_line: str) -> List[str]:
  """A benchmark's markdown opening: its title and the command that made it."""
  return [f'# {title}', '', f'Command: `{command_line}`', '']


def load_note(before: Sequence[float], after: Sequence[float], shared: str,
              quiet: str = '.') -> str:
  """`Load average before/after: B / A on N cores` and `shared` or `quiet` by the load before."""
  return (f'Load average before/after: {before[0]:.1f} / {after[0]:.1f} on {os.cpu_count()} cores'
          + (shared if before[0] > SHARED_LOAD else quiet))


def print_row(row: Dict[str, Any]) -> None:
  """Prints a measured row as one JSON line (floats to 4 decimals), as it is measured."""
  print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
        flush=True)


def write_json(out: str, results: Any, indent: int = 2) -> None:
  """Writes `results` to `out + '.json'`, making `out`'s directory."""
  os.makedirs(os.path.dirname(out) or '.', exist_ok=True)
  with atomic.open_for_write(out + '.json') as f:  # whole or not at all (rewritten per cell)
    json.dump(results, f, indent=indent, default=float)


def write_lines(path: str, lines: Sequence[str]) -> None:
  """Writes markdown `lines` to `path`, one a line."""
  with atomic.open_for_write(path) as f:  # whole or not at all
    f.write('\n'.join(lines) + '\n')


def write_report(out: str, result: Dict[str, Any], lines: List[str], force: bool = False,
                 partial: bool = False) -> None:
  """Writes a benchmark's `result` to `out + '.json'` and its markdown `lines` to `out + '.md'`.

  Where `out.json` holds more rows than `result` (`check_replace`) and not `force`: with `partial`
  (a run's intermediate write, rewritten after each cell) nothing is written; otherwise the result
  goes to `run_dir()/refused/` instead and `SystemExit` says so in one line (exit status 1)."""
  try:
    check_replace(out, result, force)
  except Refused as e:
    if partial:
      return
    kept = os.path.join(run_dir(), 'refused', os.path.basename(out))
    write_json(kept, result)
    write_markdown(kept + '.md', lines, result['machine'])
    print(f'benchmarks: error: {e}; this run\'s result is in {kept}.json', file=sys.stderr)
    raise SystemExit(1) from None
  write_json(out, result)
  write_markdown(out + '.md', lines, result['machine'])


def write_markdown(path: str, lines: List[str], machine_info: Dict[str, Any]) -> None:
  """Writes a benchmark's markdown `lines` to `path`, ending with the machine section."""
  write_lines(path, lines + ['', '## Machine', '',
                             f'JAX {machine_info["jax"]} on {", ".join(machine_info["devices"])} '
                             f'({machine_info.get("device_kind", "?")}).', '',
                             '```', *machine_info['lscpu_head'], '```', machine_info['note']])


def interleaved(runs: Dict[str, Callable[[], Any]], repeats: int,
                order: Sequence[str] = (), shuffle: bool = False) -> Dict[str, List[float]]:
  """Seconds of each run, `repeats` rounds after one untimed (compile) call each, the methods in
  turn (in `order`, default `runs`') with the order rotated every round, or with `shuffle` in a
  new random order every round (seeded), so that a change in the machine's load falls on all
  alike and no method always follows the same one."""
  names = list(order or runs)
  for name in names:
    jax.block_until_ready(runs[name]())
  times = {name: [] for name in names}
  orders = np.random.default_rng(0)
  for r in range(repeats):
    for name in ([names[i] for i in orders.permutation(len(names))] if shuffle else
                 names[r % len(names):] + names[:r % len(names)]):
      times[name].append(seconds(runs[name]))
  return times


# ----------------------------------------------------------------------------- A/B protocol


def add_ab_arguments(parser: argparse.ArgumentParser) -> None:
  """`--baseline REF`, `--rounds N` and the children's hidden `--child-out FILE`."""
  parser.add_argument('--baseline', default=None, help='git ref of the library to compare against')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--child-out', default=None, help=argparse.SUPPRESS)


def rows(file: str, args: argparse.Namespace, argv: Optional[Sequence[str]],
         measure: Callable[[argparse.Namespace], List[Dict[str, Any]]],
         key: Callable[[Dict[str, Any]], tuple], timed: Sequence[str]) -> Optional[List[Dict]]:
  """The rows of the benchmark module at `file` as its A/B options ask.

  Args:
    file: the benchmark module's `__file__` (its children run it with `--child-out`).
    args: its parsed arguments (with `add_ab_arguments`'s).
    argv: its argument list (None: `sys.argv[1:]`).
    measure: its measurement: args -> rows.
    key: a row's identity (configuration) across children.
    timed: row fields to take medians of over rounds.

  Returns:
    None in a child (which has written its rows to `--child-out`); `measure(args)` without
    `--baseline`; with it, the rows of `alternate`.
  """
  if args.child_out:
    with open(args.child_out, 'w') as f:
      json.dump(measure(args), f)
    return None
  if not args.baseline:
    return measure(args)
  argv = list(sys.argv[1:] if argv is None else argv)
  return alternate(file, args.baseline, child_argv(argv), args.rounds, key, timed)['rows']


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


def child_command(file: str, out: str, argv: Sequence[str]) -> List[str]:
  """The child's command line. `-P` keeps the working directory off `sys.path`, so the `gqa_spec`
  first on PYTHONPATH is the one imported even when run from the repository root."""
  name = os.path.splitext(os.path.basename(file))[0]
  return [sys.executable, '-P', '-m', 'benchmarks.' + name, '--child-out', out, *argv]


def child_env(code_dir: str) -> Dict[str, str]:
  """The child's environment: `code_dir` first on PYTHONPATH (its `gqa_spec`), then the repository
  (the `benchmarks` package)."""
  return dict(os.environ, PYTHONPATH=os.pathsep.join([code_dir, REPO,
                                                      os.environ.get('PYTHONPATH', '')]))


def run_child(file: str, code_dir: str, argv: Sequence[str]) -> List[Dict[str, Any]]:
  """Runs the benchmark at `file` as a child with `code_dir`'s `gqa_spec`; returns its rows."""
  with tempfile.NamedTemporaryFile(suffix='.json', delete=False) as f:
    path = f.name
  subprocess.run(child_command(file, path, argv), env=child_env(code_dir), check=True)
  with open(path) as f:
    out = json.load(f)
  os.unlink(path)
  return out


def alternate(file: str, baseline_ref: str, argv: Sequence[str], rounds: int,
              key: Callable[[Dict[str, Any]], tuple], timed: Sequence[str]) -> Dict[str, Any]:
  """Alternates children of the benchmark at `file` on the working tree and on `baseline_ref`.

  Args:
    file: the benchmark module's `__file__`.
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
        runs[which].append({key(row): row for row in run_child(file, code_dir, argv)})
  finally:
    shutil.rmtree(base_dir, ignore_errors=True)
  out = []
  for k, row in runs['new'][0].items():
    row = dict(row)
    for field in timed:
      new = [run[k][field] for run in runs['new']]
      base = [run[k][field] for run in runs['baseline']]
      row[field], row['baseline_' + field] = float(np.median(new)), float(np.median(base))
      row[field + '_rounds'], row['baseline_' + field + '_rounds'] = new, base
    out.append(row)
  return {'rows': out, 'baseline_ref': baseline_ref, 'rounds': rounds}
