"""Where XLA:CPU's compile time goes: HLO passes vs LLVM code generation, kernel by kernel.

  python -m benchmarks.compile_profile [--sizes small,small@24,xl] [--steps decode]

Each case (T5.1.1 size, `@LAYERS` to override the depth; layout; step, as `benchmarks.compile_time`
builds it: abstract shapes, nothing materialised) is lowered and compiled in a child process with
XLA's own timers on (`TF_CPP_VMODULE=cpu_compiler=1,ir_compiler=1`). From the child's log this reads
the time of the HLO pass pipeline, the whole compile, and every LLVM module XLA:CPU compiles (one per
kernel it emits; compiled on a thread pool, so their sum can exceed the wall time), grouped by kind
(`dot_elemental`: a dot emitted as a loop nest of its own; `fusion`s; copies).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time
from typing import Any, Dict, List

from benchmarks import common

_VMODULE = 'cpu_compiler=1,ir_compiler=1'
_UNITS = {'us': 1e-6, 'ms': 1e-3, 's': 1.0, 'min': 60.0}
_TIME = r'time: ([\d.]+) (us|ms|s|min) '


def _child(size: str, layout: str, step: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top; after the environment is set
  from benchmarks import compile_time  # pylint: disable=g-import-not-at-top
  config = compile_time.config_of(size, layout == 'scanned')
  fn, args = (compile_time.decode_step(config, 64, 64) if step == 'decode'
              else compile_time.train_step(config, 64, 64))
  start = time.perf_counter()
  lowered = jax.jit(fn).lower(*args)
  lowered_at = time.perf_counter()
  lowered.compile()
  print(f'CHILD lower_s={lowered_at - start} compile_s={time.perf_counter() - lowered_at} '
        f'layers={config.num_decoder_layers} emb_dim={config.emb_dim}', flush=True)


def parse(log: str) -> Dict[str, Any]:
  """The step's figures from a child's log (only the log after its last small helper compile)."""
  marker = 'Running HLO passes on [jit__lambda]'
  if marker not in log:
    raise RuntimeError('no XLA timer lines in the child log (did TF_CPP_VMODULE reach it?)')
  head, body = log.rsplit(marker, 1)
  del head
  passes = re.match(r' for CPU ' + _TIME, body)
  whole = re.search(r'Compiling \[jit__lambda\] for CPU using JIT ' + _TIME, body)
  kinds = collections.defaultdict(lambda: [0, 0.0])
  for name, value, unit in re.findall(r'Compiled LLVM module: (\S+) ' + _TIME, body):
    kind = re.sub(r'[._]\d+', '', re.sub(r'_*compute_module_*', '', name))
    kind = re.sub(r'_kernel_module$', '', kind)
    kinds[kind][0] += 1
    kinds[kind][1] += float(value) * _UNITS[unit]
  child = dict(re.findall(r'(\w+)=([\d.]+)', body.split('CHILD', 1)[1].splitlines()[0]))
  top = sorted(kinds.items(), key=lambda kv: -kv[1][1])
  return {'lower_s': float(child['lower_s']), 'compile_s': float(child['compile_s']),
          'layers': int(child['layers']), 'emb_dim': int(child['emb_dim']),
          'hlo_passes_s': float(passes.group(1)) * _UNITS[passes.group(2)],
          'xla_compile_s': float(whole.group(1)) * _UNITS[whole.group(2)],
          'llvm_modules': sum(n for n, _ in kinds.values()),
          'llvm_summed_s': sum(t for _, t in kinds.values()),
          'dot_kernels': kinds['dot_elemental'][0] if 'dot_elemental' in kinds else 0,
          'dot_llvm_s': kinds['dot_elemental'][1] if 'dot_elemental' in kinds else 0.0,
          'top_kinds': [{'kind': k, 'modules': n, 'seconds': t} for k, (n, t) in top[:5]]}


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
  rows = []
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='0', TF_CPP_VMODULE=_VMODULE)
  for size in args.sizes.split(','):
    for step in args.steps.split(','):
      for layout in ('unrolled', 'scanned'):
        result = subprocess.run(
            [sys.executable, '-m', 'benchmarks.compile_profile', '--child', size, layout, step],
            env=env, capture_output=True, text=True, check=False)
        if result.returncode:
          raise RuntimeError(f'{size} {layout} {step}: child failed:\n{result.stderr[-3000:]}')
        row = {'size': size, 'layout': layout, 'step': step,
               **parse(result.stderr + result.stdout)}
        common.print_row({k: v for k, v in row.items() if k != 'top_kinds'})
        rows.append(row)
  return rows


def markdown(result: Dict[str, Any]) -> List[str]:
  lines = common.heading('Compile-time profile: HLO passes vs LLVM code generation',
                         result['command'])
  lines += ['XLA:CPU timers (`TF_CPP_VMODULE=' + _VMODULE + '`) around one lower + compile per '
            'case, abstract T5.1.1 shapes as `benchmarks.compile_time` builds them. LLVM modules '
            'are compiled on a thread pool: their summed seconds can exceed the wall time.', '']
  lines += common.table_head(['size', 'layers', 'd_model', 'step', 'layout', 'lower s',
                              'compile s', 'HLO passes s', 'LLVM modules', 'LLVM summed s',
                              'dot kernels', 'dot kernels LLVM s'])
  for r in result['rows']:
    lines.append(f"| {r['size']} | {r['layers']} | {r['emb_dim']} | {r['step']} | {r['layout']} "
                 f"| {r['lower_s']:.2f} | {r['compile_s']:.2f} | {r['hlo_passes_s']:.2f} | "
                 f"{r['llvm_modules']} | {r['llvm_summed_s']:.2f} | {r['dot_kernels']} | "
                 f"{r['dot_llvm_s']:.2f} |")
  lines += ['', 'Costliest kinds of LLVM module per case:', '']
  lines += common.table_head(['size', 'step', 'layout', 'kind (modules, summed s)'])
  for r in result['rows']:
    kinds = '; '.join(f"{k['kind']} ({k['modules']}, {k['seconds']:.2f})" for k in r['top_kinds'])
    lines.append(f"| {r['size']} | {r['step']} | {r['layout']} | {kinds} |")
  lines += common.result_load_note(result, ': the machine was shared with other jobs, so every '
                                   'time here is inflated; the counts are not.')
  return lines


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ['--child']:
    _child(*argv[1:4])
    return 0
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--sizes', default='small,small@24,xl',
                 help='T5.1.1 presets, comma-separated; NAME@LAYERS overrides the depth')
  p.add_argument('--steps', default='decode', help='decode and/or train, comma-separated')
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  before = os.getloadavg()
  result = common.results(__file__, argv, measure(args), before)
  common.write_report(args.out, result, markdown(result))
  print('\n'.join(markdown(result)))
  return 0


if __name__ == '__main__':
  sys.exit(main())
