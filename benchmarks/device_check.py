"""The accelerator evidence as one clock-bounded call: `benchmarks/device_check.sh bench`
(`study`: the gpu reproduction in one call, `benchmarks/device_study.py`).

  python -m benchmarks.device_check bench [--out DIR] [--budget SECONDS] [--size full|nano]

Runs the parts of `PARTS` in order, each a benchmark module in a child process whose time limit is
what is left of `--budget` (wall seconds from this command's start, default 330, so that with the
machine's start and the transfers a call stays within 6 minutes), minus `RESERVE` for writing. A
part the clock cuts keeps the rows it printed (every benchmark prints each JSON row the moment it
is measured), a part with too little time left is skipped, and the summary says which. After every
part `summary.{json,md}` are rewritten, so a call killed from outside still leaves them; at the
end every part's JSON/Markdown and log are packed into `device_check_bench.tar.gz` (a device call
brings back at most 8 files). The summary table, printed last, holds each goal of the accelerator
issue beside its figure:

  decode      batch-1 decode, bf16 weights cast once, 2048 input tokens, XXL / large / XL shapes at
              G = H, 8, 1 (XXL first: GQA Figure 6) in the layout decoding uses (unrolled,
              `models.layout.DECODE_LAYOUT`): ms/step against the bandwidth bound (goal <= 1.3x)
  layouts     (only with --parts layouts) the same step, large at G = 8, unrolled and scanned side
              by side: which layout is faster (unrolled, 2026-11-26, H200: 2.13 vs 2.30 ms)
  hf          greedy batch-1 tokens/s against HF transformers' `generate`, T5.1.1-large, same
              weights (goal >= 2x)
  costs       c and v(gamma) for a T5.1.1-large target with a T5.1.1-small draft and a 2-layer one
              (one process: the target's steps are measured once)
  train       the train step, T5.1.1-base (batch 128) and -large (batch 64), finetune shapes, bf16,
              scanned, remat 'minimal': tokens/s and the fraction of the measured bf16 matmul rate
              (goal >= 40%)

`--size nano` runs a part at nano size (seconds on a CPU); `tests/scripts/test_device_check.py`
runs one in the suite, a clock cut with a fake part, and the budget check: the default parts'
estimates, the reserve and `START_S` fit the 6 minutes a call may take (`CALL_LIMIT_S`), and no
estimate is below the seconds the part took in the committed run.

Estimates (`Part.estimate_s`, seconds with the process start, compiles and writing included) are
the seconds each part took on an H200 on 2026-11-26 (`results/gpu/device_check_2026-11-26/`):
decode 93, train 41, train_large 38 from the driver's own summary; hf 56 s at 128 tokens, a warm-up
and 2 timed runs (by hand in call 4; the part now decodes 64 tokens: 50 estimated); costs 62 s per
draft when each ran in its own process (call 5), 95 estimated for both in one process (the
target's compiles shared; not yet measured). An H100 has 0.7x the H200's bandwidth: its decode
rows take longer to time but compile in the same seconds, which dominate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Dict, List, Optional, Sequence

BUDGET_S = 330  # wall seconds of the driver; a device call adds its start and transfers
START_S = 30  # a device call's start and transfers, as measured (2026-11-26: 354 s held, 325 s run)
CALL_LIMIT_S = 360  # what the issue allows one call: the budget check keeps estimates within it
RESERVE_S = 10  # kept back from every part for the summary and the archive
MIN_PART_S = 20  # a part with less than this left is skipped, not started
BF16 = ('--dtype', 'bfloat16', '--param-dtype', 'bfloat16')


@dataclasses.dataclass(frozen=True)
class Part:
  name: str
  module: str  # benchmarks.<module>, or a dotted module path
  full: Sequence[str]  # its arguments at full size
  nano: Sequence[str]  # at nano size (CPU, the suite)
  cap_s: int  # the most it may take of the budget at full size
  estimate_s: int  # expected seconds at full size (see the module docstring)
  goal: str
  default: bool = True  # run without --parts naming it


PARTS: List[Part] = [
    Part('decode', 'decode_roofline',
         ('--presets', 'xxl,large,xl', '--kv', 'mha,gqa8,mqa', '--batch', '1',
          '--input-length', '2048', '--steps', '32', '--repeats', '3', '--shaped-setup', *BF16),
         ('--presets', 'nano', '--kv', 'mha,mqa', '--batch', '1', '--input-length', '16',
          '--steps', '8', '--repeats', '2', '--shaped-setup', *BF16),
         cap_s=130, estimate_s=93, goal='step <= 1.3x the bandwidth bound'),
    Part('layouts', 'decode_roofline',
         ('--presets', 'large', '--kv', 'gqa8', '--layouts', 'unrolled,scanned', '--batch', '1',
          '--input-length', '2048', '--steps', '32', '--repeats', '3', '--shaped-setup', *BF16),
         ('--presets', 'nano', '--kv', 'mha', '--layouts', 'unrolled,scanned', '--batch', '1',
          '--input-length', '16', '--steps', '8', '--repeats', '2', '--shaped-setup', *BF16),
         cap_s=40, estimate_s=20, goal='decode in the faster layout', default=False),
    Part('hf', 'hf_decode',
         ('--preset', 'large', '--max-decode-len', '64', '--repeats', '2', '--shaped-setup',
          *BF16),
         ('--preset', 'nano', '--max-decode-len', '8', '--input-length', '16', '--repeats', '2',
          '--shaped-setup', *BF16),
         cap_s=80, estimate_s=50, goal='ours >= 2x HF generate'),
    Part('costs', 'speculative_costs',
         ('--target-preset', 'large', '--draft-preset', 'small', '--draft-layers', 'all,2',
          '--batch', '1', '--gammas', '3', '--repeats', '2', '--shaped-setup', *BF16),
         ('--target-preset', 'nano', '--draft-preset', 'nano', '--draft-layers', 'all,1',
          '--batch', '1', '--gammas', '2', '--max-decode-len', '8', '--input-length', '16',
          '--repeats', '1', '--shaped-setup', *BF16),
         cap_s=110, estimate_s=95, goal='c <= 0.1 (2-layer draft), v(gamma) ~ 1'),
    Part('train', 'train_throughput',
         ('--preset', 'base', '--settings', 'finetune', '--batch', '128', '--steps', '8',
          '--dtype', 'bfloat16', '--scan-layers', '--remat-policy', 'minimal'),
         ('--preset', 'nano', '--settings', 'finetune', '--batch', '4', '--steps', '2',
          '--scan-layers', '--remat-policy', 'minimal'),
         cap_s=60, estimate_s=41, goal='>= 40% of the bf16 matmul rate'),
    Part('train_large', 'train_throughput',
         ('--preset', 'large', '--settings', 'finetune', '--batch', '64', '--steps', '6',
          '--dtype', 'bfloat16', '--scan-layers', '--remat-policy', 'minimal'),
         ('--preset', 'nano', '--settings', 'finetune', '--batch', '4', '--steps', '2',
          '--dtype', 'bfloat16', '--scan-layers', '--remat-policy', 'full'),
         cap_s=60, estimate_s=38, goal='>= 40% of the bf16 matmul rate'),
]


def estimated_total(parts: Sequence[Part] = PARTS) -> int:
  """Seconds the default parts are expected to take at full size, the reserve included."""
  return sum(p.estimate_s for p in parts if p.default) + RESERVE_S


def rows_of(output: str) -> List[Dict]:
  """The JSON rows a benchmark printed (one object per line), in order."""
  rows = []
  for line in output.splitlines():
    line = line.strip()
    if line.startswith('{') and line.endswith('}'):
      try:
        rows.append(json.loads(line))
      except ValueError:
        pass
  return rows


def run_part(part: Part, size: str, out: str, seconds: float) -> Dict:
  """Runs `part` with a limit of `seconds`; its record: status, seconds, rows, log file."""
  args = list(part.full if size == 'full' else part.nano)
  module = part.module if '.' in part.module else f'benchmarks.{part.module}'
  cmd = [sys.executable, '-m', module, *args,
         '--out', os.path.join(out, part.name)]
  log = os.path.join(out, f'{part.name}.log')
  t0 = time.monotonic()
  with open(log, 'w') as f:
    f.write('$ ' + ' '.join(cmd) + '\n')
    f.flush()
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
      code = proc.wait(timeout=seconds)
      status = 'ok' if code == 0 else f'exit {code}'
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, 9)
      proc.wait()
      status = f'cut by the clock after {seconds:.0f} s'
  elapsed = time.monotonic() - t0
  with open(log) as f:
    rows = rows_of(f.read())
  return {'part': part.name, 'status': status, 'seconds': elapsed, 'limit_s': seconds,
          'estimate_s': part.estimate_s, 'goal': part.goal, 'command': ' '.join(cmd[2:]),
          'rows': rows}


def _fmt(x, digits=2) -> str:
  return '-' if x is None else f'{x:.{digits}f}'


def summary_lines(records: Sequence[Dict]) -> List[str]:
  """The summary table: one line per measured figure, its goal beside it."""
  lines = ['| part | what | figure | goal | verdict |', '|---|---|---|---|---|']
  for rec in records:
    name, rows = rec['part'], rec['rows']
    if name in ('decode', 'layouts'):
      for r in rows:
        ratio = r['ratio_to_bound']
        lines.append(f'| {name} | {r["preset"]} G={r["kv_heads"]} {r.get("layout", "unrolled")} '
                     f'(setup {r.get("setup_s", 0):.0f} s, compile {r.get("compile_s", 0):.0f} s) '
                     f'| {r["step_ms"]:.3f} ms/step, bound {r["bound_ms"]:.3f} ms = {ratio:.2f}x '
                     f'| <= 1.3x | {"met" if ratio <= 1.3 else "missed"} |')
    elif name == 'hf':
      for r in rows:
        lines.append(f'| hf | {r["preset"]} greedy batch 1 | ours {r["ours_tokens_per_s"]:.0f} '
                     f'tok/s, HF {r["hf_tokens_per_s"]:.0f} tok/s = {r["speedup_vs_hf"]:.2f}x | '
                     f'>= 2x | {"met" if r["speedup_vs_hf"] >= 2 else "missed"} |')
    elif name.startswith('costs'):
      for r in rows:
        lines.append(f'| {name} | batch {r.get("batch")} gamma {r.get("gamma")} | c = '
                     f'{_fmt(r.get("c"), 3)}, v = {_fmt(r.get("v"))}, target step '
                     f'{_fmt(r.get("target_step_ms"), 3)} ms | {rec["goal"]} | - |')
    elif name.startswith('train'):
      for r in rows:
        frac = r['fraction_of_peak']
        lines.append(f'| {name} | {r["preset"]} {r["setting"]} batch {r["batch"]} remat '
                     f'{r.get("remat_policy")} (compile {r["compile_s"]:.0f} s) | '
                     f'{r["tokens_per_s"]:.0f} tok/s, {frac:.0%} of {r["matmul_peak_gflop_s"] / 1e3:.0f}'
                     f' TFLOP/s | >= 40% | {"met" if frac >= 0.4 else "missed"} |')
    if rec['status'] != 'ok':
      lines.append(f'| {name} | {rec["status"]} ({len(rows)} rows kept) | | | |')
  return lines


def write_summary(out: str, records: Sequence[Dict], meta: Dict) -> List[str]:
  lines = summary_lines(records)
  with open(os.path.join(out, 'summary.json'), 'w') as f:
    json.dump({**meta, 'parts': list(records)}, f, indent=1)
  head = [f'# Device check ({meta["mode"]}, size {meta["size"]})', '',
          f'Command: `{meta["command"]}`. Device: {meta.get("device", "?")}; JAX '
          f'{meta.get("jax", "?")}; {meta["date"]}. Parts (seconds used / limit / estimate): '
          + '; '.join(f'{r["part"]} {r["seconds"]:.0f}/{r["limit_s"]:.0f}/{r["estimate_s"]} '
                      f'({r["status"]})' for r in records) + '.', '']
  with open(os.path.join(out, 'summary.md'), 'w') as f:
    f.write('\n'.join(head + lines) + '\n')
  return lines


def _device() -> Dict[str, str]:
  """The device and JAX version, from a child (the driver itself never initialises a backend)."""
  code = ('import jax; d = jax.devices()[0]; '
          'print(jax.__version__ + "|" + d.platform + "|" + d.device_kind)')
  try:
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120).stdout.strip().splitlines()[-1]
    version, platform, kind = out.split('|')
    return {'jax': version, 'device': f'{platform}: {kind}'}
  except (subprocess.SubprocessError, IndexError, ValueError):
    return {}


def bench(out: str, size: str, budget: float, parts: Optional[Sequence[str]] = None,
          work: Optional[str] = None, catalogue: Sequence[Part] = PARTS) -> int:
  """Runs the parts into `work` (a new temporary directory when None) and leaves in `out` only
  `summary.{json,md}` and `device_check_bench.tar.gz` (the parts' files and logs)."""
  start = time.monotonic()
  os.makedirs(out, exist_ok=True)
  work = work or tempfile.mkdtemp(prefix='device_check_')
  os.makedirs(work, exist_ok=True)
  meta = {'mode': 'bench', 'size': size, 'budget_s': budget,
          'command': 'python -m benchmarks.device_check ' + ' '.join(sys.argv[1:]),
          'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), **_device()}
  records = []
  for part in catalogue:
    if (part.name not in parts) if parts else not part.default:
      continue
    left = budget - (time.monotonic() - start) - RESERVE_S
    limit = min(left, part.cap_s) if size == 'full' else left
    if left < (MIN_PART_S if size == 'full' else 1):
      records.append({'part': part.name, 'status': f'skipped: {left:.0f} s left', 'seconds': 0.0,
                      'limit_s': max(limit, 0.0), 'estimate_s': part.estimate_s,
                      'goal': part.goal, 'command': '', 'rows': []})
    else:
      print(f'== {part.name} (limit {limit:.0f} s)', flush=True)
      records.append(run_part(part, size, work, limit))
      print(f'   {records[-1]["status"]}, {records[-1]["seconds"]:.0f} s, '
            f'{len(records[-1]["rows"])} rows', flush=True)
    write_summary(out, records, meta)
  lines = write_summary(out, records, meta)
  with tarfile.open(os.path.join(out, 'device_check_bench.tar.gz'), 'w:gz') as tar:
    for name in sorted(os.listdir(work)):
      if name.endswith(('.json', '.md', '.log')):
        tar.add(os.path.join(work, name), arcname=name)
  print('\n'.join(lines), flush=True)
  return 0 if all(r['status'] == 'ok' for r in records) else 1


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('mode', choices=('bench', 'study'),
                 help='bench: this module; study: the gpu reproduction (benchmarks/device_study.py)')
  p.add_argument('--out', default=None,
                 help='where the summary and the archive go (default $OUT, else '
                      'results/gpu/device_check_MODE)')
  p.add_argument('--size', default='full', choices=('full', 'nano'))
  p.add_argument('--budget', type=float, default=BUDGET_S)
  p.add_argument('--parts', default=None, help='bench: comma list: run only these parts')
  p.add_argument('--work', default=None,
                 help="bench: the parts' own files; study: its data, models and results "
                      '(default: a temporary dir)')
  p.add_argument('--kit', default='gpu_kit', help='study: the kit (benchmarks/gpu_study_kit.sh)')
  p.add_argument('--exported', default=None, help="study: exported tasks in place of the kit's")
  p.add_argument('--set', dest='sets', action='append', default=[],
                 help='study: a preset override (KEY=VALUE), as `reproduce --set`')
  args = p.parse_args(argv)
  out = args.out or os.environ.get('OUT') or f'results/gpu/device_check_{args.mode}'
  if args.mode == 'study':
    from benchmarks import device_study  # pylint: disable=g-import-not-at-top
    return device_study.study(out, args.size, args.budget, args.kit, args.exported, args.work,
                              args.sets)
  return bench(out, args.size, args.budget, args.parts.split(',') if args.parts else None,
               args.work)


if __name__ == '__main__':
  sys.exit(main())
