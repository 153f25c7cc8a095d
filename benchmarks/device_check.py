"""Does it hold on an accelerator? The accelerator evidence as one clock-bounded device call.

  bash benchmarks/device_check.sh bench     # the benchmark parts below: summary.{json,md}
  bash benchmarks/device_check.sh study     # the gpu reproduction (`reproduce --preset gpu`)
  bash benchmarks/device_check.sh kit       # here, before a study: builds gpu_kit/ to carry
  python -m benchmarks.device_check bench|study [--out DIR] [--budget SECONDS] [--size full|nano]

Without `--out` (or `$OUT`) the summary goes to `runs/benchmarks/device_check_MODE`.

bench: runs the parts of `PARTS` in order, each a benchmark module in a child process whose time
limit is what is left of `--budget` (wall seconds from this command's start, default 330, so that
with the machine's start and the transfers a call stays within 6 minutes), minus `RESERVE_S` for
writing. A part the clock cuts keeps the rows it printed (every benchmark prints each JSON row the
moment it is measured), a part with too little time left is skipped, and the summary says which.
After every part `summary.{json,md}` are rewritten, so a call killed from outside still leaves them;
at the end every part's JSON/Markdown and log are packed into `device_check_bench.tar.gz` (a device
call brings back at most 8 files). The summary table holds each goal of the accelerator issue
beside its figure:

  decode      batch-1 decode (`benchmarks/decode.py`), bf16 weights cast once, 2048 input tokens,
              XXL / large / XL shapes at G = H, 8, 1: ms/step against the bandwidth bound
              (goal <= 1.3x)
  layouts     (only with --parts layouts) the same step, large at G = 8, unrolled and scanned
  hf          greedy batch-1 tokens/s against HF transformers' `generate`, T5.1.1-large, same
              weights (`decode.py --hf`; goal >= 2x)
  train       the train step (`benchmarks/train_step.py`), T5.1.1-base (batch 128) and -large
              (batch 64), finetune shapes, bf16, scanned, remat 'minimal': the fraction of the
              measured bf16 matmul rate (goal >= 40%)

`Part.estimate_s` holds the seconds each part is expected to take at full size (process start,
compiles and writing included); the committed H200 run's are in
`results/gpu/device_check_2026-11-26/summary.json`.

study: self-contained from a bare machine. Installs the kit's wheels (`gpu_kit/wheels`: what the
device image lacks) into a private directory, unpacks the exported DDTP tasks
(`gpu_kit/ddtp_export.tar.xz`), then runs

  python -m gqa_spec reproduce --preset gpu --exported DATA --out RESULTS --work-dir WORK \\
      --time-limit LEFT

with XLA's GPU autotuning and Triton GEMMs off (`AUTOTUNE_OFF`). `LEFT` is what is left of
`--budget` less `STUDY_RESERVE_S`; the reproduction stops cleanly at it (exit 75: finished stages and
jobs kept) and the summary says which stage it reached. Whatever happened, `summary.{json,md}`
(each stage's seconds, the quality and speed goals beside the figures, the claims table when the
report stage ran) and `device_check_study.tar.gz` (the results directory, the work dir's job
records, the run log) are left in `--out`. `STAGE_ESTIMATE_S` holds each stage's expected seconds.

`--size nano` runs a part, or the study's preset at toy size (`NANO_SET`), on a CPU in seconds;
`tests/scripts/test_device_check.py` and `test_device_study.py` run them in the suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from gqa_spec import atomic
from gqa_spec.reproduce.stages import STAGES

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
    Part('decode', 'decode',
         ('--presets', 'xxl,large,xl', '--kv', 'mha,gqa8,mqa', '--batch', '1',
          '--input-length', '2048', '--steps', '32', '--repeats', '3', '--shaped-setup', *BF16),
         ('--presets', 'nano', '--kv', 'mha,mqa', '--batch', '1', '--input-length', '16',
          '--steps', '8', '--repeats', '2', '--shaped-setup', *BF16),
         cap_s=130, estimate_s=93, goal='step <= 1.3x the bandwidth bound'),
    Part('layouts', 'decode',
         ('--presets', 'large', '--kv', 'gqa8', '--layouts', 'unrolled,scanned', '--batch', '1',
          '--input-length', '2048', '--steps', '32', '--repeats', '3', '--shaped-setup', *BF16),
         ('--presets', 'nano', '--kv', 'mha', '--layouts', 'unrolled,scanned', '--batch', '1',
          '--input-length', '16', '--steps', '8', '--repeats', '2', '--shaped-setup', *BF16),
         cap_s=40, estimate_s=20, goal='decode in the faster layout', default=False),
    Part('hf', 'decode',
         ('--presets', 'large', '--kv', 'mha', '--batch', '1', '--input-length', '64',
          '--steps', '8', '--repeats', '2', '--hf', '--hf-tokens', '64', '--shaped-setup', *BF16),
         ('--presets', 'nano', '--kv', 'mha', '--batch', '1', '--input-length', '16',
          '--steps', '8', '--repeats', '2', '--hf', '--hf-tokens', '8', '--shaped-setup', *BF16),
         cap_s=90, estimate_s=60, goal='ours >= 2x HF generate'),
    Part('train', 'train_step',
         ('--preset', 'base', '--settings', 'finetune', '--batch', '128', '--steps', '8',
          '--dtype', 'bfloat16', '--scan-layers', '--remat-policy', 'minimal'),
         ('--preset', 'nano', '--settings', 'finetune', '--batch', '4', '--steps', '2',
          '--scan-layers', '--remat-policy', 'minimal'),
         cap_s=60, estimate_s=41, goal='>= 40% of the bf16 matmul rate'),
    Part('train_large', 'train_step',
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
      for r in (r for r in rows if r.get('kind', 'step') == 'step'):
        ratio = r['ratio_to_bound']
        lines.append(f'| {name} | {r["preset"]} G={r["kv_heads"]} {r.get("layout", "unrolled")} '
                     f'(setup {r.get("setup_s", 0):.0f} s, compile {r.get("compile_s", 0):.0f} s) '
                     f'| {r["step_ms"]:.3f} ms/step, bound {r["bound_ms"]:.3f} ms = {ratio:.2f}x '
                     f'| <= 1.3x | {"met" if ratio <= 1.3 else "missed"} |')
    elif name == 'hf':
      for r in (r for r in rows if r.get('kind') == 'hf'):
        lines.append(f'| hf | {r["preset"]} greedy batch 1 | ours {r["ours_tokens_per_s"]:.0f} '
                     f'tok/s, HF {r["hf_tokens_per_s"]:.0f} tok/s = {r["speedup_vs_hf"]:.2f}x | '
                     f'>= 2x | {"met" if r["speedup_vs_hf"] >= 2 else "missed"} |')
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


# ----------------------------------------------------------------------------- study

STUDY_RESERVE_S = 15  # kept back for the summary and the archive
GRACE_S = 10  # the reproduction's limit ends this much before the driver kills it (it asks its
# training job to stop min(30, S / 4) s before its limit: queued steps finish, a checkpoint)
AUTOTUNE_OFF = '--xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false'
# Seconds per stage as the gpu preset's docstring budgets them (steps + compiles; 'setup': wheels,
# unpacking, JAX's start): measured on an H200 where the stage ran (results/gpu/
# device_study_2026-11-26/, scaled to the preset's steps), estimated where it did not.
STAGE_ESTIMATE_S = {'setup': 5, 'corpus': 1, 'pretrain': 80, 'uptrain': 27, 'finetune': 66,
                    'evaluate': 45, 'timing': 35, 'speculative': 45, 'report': 5}
# The gpu preset at toy size (models and steps), for `--size nano` on a CPU.
NANO_SET = ('vocab_pieces=300', 'target.vocab_size=512', 'target.emb_dim=32',
            'target.num_heads=4', 'target.head_dim=8', 'target.mlp_dim=64',
            'target.num_encoder_layers=1', 'target.num_decoder_layers=2', 'draft.vocab_size=512',
            'draft.emb_dim=16', 'draft.num_heads=2', 'draft.head_dim=8', 'draft.mlp_dim=32',
            'draft.num_encoder_layers=1', 'pretrain_steps=20', 'pretrain_batch=4',
            'warmup_steps=5', 'kv_heads=2', 'timing_groups=2', 'finetune_steps=4',
            'finetune_batch=4', 'eval_period=4', 'validation_examples=4', 'test_examples=4',
            'eval_batch=4', 'timing_batch=2', 'timing_repeats=1', 'long_timing=32,8',
            'speculative_examples=2', 'speculative_repeats=1', 'gammas=2', 'temperatures=0',
            'draft_gammas=2', 'fast_compile_decoding=true', 'workers=2', 'eval_workers=2')
GOALS = {'bleu': 20.0, 'rouge1': 35.0, 'speculative_speedup': 2.0}


def study_estimated_total() -> int:
  """Seconds the study is expected to take at full size, its reserve included."""
  return sum(STAGE_ESTIMATE_S.values()) + STUDY_RESERVE_S


def _install_kit(kit: str, site: str, log) -> Optional[str]:
  """Installs the kit's wheels into `site`; returns it (None when the kit has no wheels)."""
  wheels = sorted(glob.glob(os.path.join(kit, 'wheels', '*.whl')))
  if not wheels:
    return None
  cmd = [sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps', '--no-compile',
         '--no-cache-dir', '--upgrade', '--target', site, *wheels]
  log.write('$ ' + ' '.join(cmd) + '\n')
  log.flush()
  subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=120)
  return site


def _unpack(kit: str, root: str) -> str:
  """The exported tasks from the kit's archive, unpacked under `root`; their directory."""
  archive = os.path.join(kit, 'ddtp_export.tar.xz')
  if not os.path.isfile(archive):
    raise SystemExit(f'{archive}: no exported tasks; build the kit with '
                     'benchmarks/device_check.sh kit (or give --exported DIR)')
  with tarfile.open(archive) as tar:
    tar.extractall(root, filter='data')
  return os.path.join(root, 'ddtp_export')


def _stage_records(results: str) -> Dict[str, dict]:
  """stage -> its record, for the stages that finished."""
  out = {}
  for name in STAGES:
    path = os.path.join(results, f'{name}.json')
    try:
      with open(path) as f:
        out[name] = json.load(f)
    except (OSError, ValueError):
      pass
  return out


def goal_rows(records: Dict[str, dict]) -> List[Dict[str, object]]:
  """The accelerator issue's quality and speed goals beside the study's figures."""
  rows = []
  for r in records.get('evaluate', {}).get('rows', []):
    if r.get('variant', '').startswith('mha') and r['metric'] in GOALS:
      goal = GOALS[r['metric']]
      rows.append({'what': f"MHA fine-tuned {r['metric']} ({r['task']}, test)",
                   'figure': r['score'], 'goal': f'>= {goal:g}', 'met': r['score'] >= goal})
  spec = records.get('speculative', {})
  greedy = [r for key in ('rows', 'tree_rows', 'auto_rows') for r in spec.get(key, [])
            if r['temperature'] == 0]
  if greedy:
    best = max(greedy, key=lambda r: r['speedup_measured'])
    name = best['draft'] + (f" gamma {best['gamma']}" if 'gamma' in best else '')
    rows.append({'what': f"speculative greedy batch 1 ({best['task']}, {best['target']}, best: "
                         f"{name}, {best['tokens_per_call']:.2f} tokens per target call)",
                 'figure': best['speedup_measured'],
                 'goal': f">= {GOALS['speculative_speedup']:g}x greedy",
                 'met': best['speedup_measured'] >= GOALS['speculative_speedup']})
  return rows


def study_summary_lines(meta: Dict, records: Dict[str, dict]) -> List[str]:
  lines = [f'# Device check (study, size {meta["size"]})', '',
           f'Command: `{meta["command"]}`. Device: {meta.get("device", "?")}; JAX '
           f'{meta.get("jax", "?")}; {meta["date"]}; XLA_FLAGS `{meta["xla_flags"]}`. '
           f'Reproduction exit status {meta.get("status")} ({meta.get("status_text")}); '
           f'set-up {meta.get("setup_s", 0):.0f} s, whole call {meta.get("seconds", 0):.0f} s.',
           '', '| stage | seconds (estimate) | |', '|---|---|---|']
  for stage in STAGES:
    rec = records.get(stage)
    seconds = '-' if rec is None else f"{rec.get('wall_seconds', 0):.0f}"
    lines.append(f'| {stage} | {seconds} ({STAGE_ESTIMATE_S.get(stage, "-")}) | '
                 f'{"done" if rec else "not reached"} |')
  lines += ['', '| goal | figure | target | verdict |', '|---|---|---|---|']
  for g in goal_rows(records):
    lines.append(f"| {g['what']} | {g['figure']:.2f} | {g['goal']} | "
                 f"{'met' if g['met'] else 'missed'} |")
  claims = records.get('report', {}).get('claims', [])
  if claims:
    lines += ['', '| claim | ours | verdict |', '|---|---|---|']
    lines += [f"| {c['key']}: {c['claim']} | {c['ours']} | {c['verdict']} |" for c in claims]
  return lines


def study(out: str, size: str, budget: float, kit: str = 'gpu_kit',
          exported: Optional[str] = None, root: Optional[str] = None,
          extra_set: Sequence[str] = ()) -> int:
  """Runs the study under the clock; leaves `summary.{json,md}` and the archive in `out`."""
  start = time.monotonic()
  os.makedirs(out, exist_ok=True)
  root = root or tempfile.mkdtemp(prefix='device_study_')
  os.makedirs(root, exist_ok=True)
  results, work, log_path = (os.path.join(root, n) for n in ('results', 'work', 'study.log'))
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  if size == 'full':
    env['XLA_FLAGS'] = f"{AUTOTUNE_OFF} {env.get('XLA_FLAGS', '')}".strip()
  meta = {'mode': 'study', 'size': size, 'budget_s': budget,
          'command': 'python -m benchmarks.device_check ' + ' '.join(sys.argv[1:]),
          'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
          'xla_flags': env.get('XLA_FLAGS', '')}
  with open(log_path, 'a') as log:
    site = _install_kit(kit, os.path.join(root, 'site'), log)
    if site:
      env['PYTHONPATH'] = os.pathsep.join(p for p in (site, env.get('PYTHONPATH')) if p)
    exported = exported or _unpack(kit, os.path.join(root, 'data'))
    meta.update(_device())
    meta['setup_s'] = time.monotonic() - start
    left = budget - (time.monotonic() - start) - STUDY_RESERVE_S
    sets = [a for s in (*(NANO_SET if size == 'nano' else ()), *extra_set) for a in ('--set', s)]
    cmd = [sys.executable, '-m', 'gqa_spec', 'reproduce', '--preset', 'gpu', *sets,
           '--exported', exported, '--out', results, '--work-dir', work,
           '--time-limit', f'{max(left - GRACE_S, 1):.0f}']
    log.write('$ ' + ' '.join(cmd) + '\n')
    log.flush()
    print(f'== study (time limit {max(left - GRACE_S, 1):.0f} s)', flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
      status = proc.wait(timeout=max(left, 1))
      text = {0: 'finished', 75: 'stopped by its time limit'}.get(status, 'failed')
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, 9)
      proc.wait()
      status, text = None, f'killed after {left:.0f} s'
  meta.update(status=status, status_text=text, seconds=time.monotonic() - start)
  records = _stage_records(results)
  lines = study_summary_lines(meta, records)
  atomic.write_json(os.path.join(out, 'summary.json'),
                    {**meta, 'stages': {k: v.get('wall_seconds') for k, v in records.items()},
                     'goals': goal_rows(records),
                     'claims': records.get('report', {}).get('claims', [])}, indent=1)
  atomic.write_text(os.path.join(out, 'summary.md'), '\n'.join(lines) + '\n')
  with atomic.open_for_write(os.path.join(out, 'device_check_study.tar.gz'), 'wb') as f, \
       tarfile.open(fileobj=f, mode='w:gz') as tar:
    if os.path.isdir(results):
      tar.add(results, arcname='results')
    if os.path.isdir(os.path.join(work, 'jobs')):
      tar.add(os.path.join(work, 'jobs'), arcname='work/jobs')
    tar.add(log_path, arcname='study.log')
  print('\n'.join(lines), flush=True)
  return 0 if status == 0 else 1


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('mode', choices=('bench', 'study'),
                 help='bench: the benchmark parts; study: the gpu reproduction')
  p.add_argument('--out', default=None,
                 help='where the summary and the archive go (default $OUT, else '
                      'runs/benchmarks/device_check_MODE)')
  p.add_argument('--size', default='full', choices=('full', 'nano'))
  p.add_argument('--budget', type=float, default=BUDGET_S)
  p.add_argument('--parts', default=None, help='bench: comma list: run only these parts')
  p.add_argument('--work', default=None,
                 help="bench: the parts' own files; study: its data, models and results "
                      '(default: a temporary dir)')
  p.add_argument('--kit', default='gpu_kit', help='study: the kit (device_check.sh kit)')
  p.add_argument('--exported', default=None, help="study: exported tasks in place of the kit's")
  p.add_argument('--set', dest='sets', action='append', default=[],
                 help='study: a preset override (KEY=VALUE), as `reproduce --set`')
  args = p.parse_args(argv)
  if not (args.out or os.environ.get('OUT')):
    from benchmarks import common  # pylint: disable=g-import-not-at-top  (imports JAX)
    args.out = os.path.join(common.run_dir(), f'device_check_{args.mode}')
  out = args.out or os.environ['OUT']
  if args.mode == 'study':
    return study(out, args.size, args.budget, args.kit, args.exported, args.work,
                              args.sets)
  return bench(out, args.size, args.budget, args.parts.split(',') if args.parts else None,
               args.work)


if __name__ == '__main__':
  sys.exit(main())
