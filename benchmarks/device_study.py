"""The gpu reproduction as one clock-bounded device call: `benchmarks/device_check.sh study`.

  python -m benchmarks.device_check study [--out DIR] [--budget SECONDS] [--size full|nano]
      [--kit DIR | --exported DIR]

Self-contained from a bare machine: installs the kit's wheels (`gpu_kit/wheels`, built here by
`benchmarks/gpu_study_kit.sh`: what the device image lacks) into a private directory, unpacks the
exported DDTP tasks (`gpu_kit/ddtp_export.tar.xz`), then runs

  python -m gqa_spec reproduce --preset gpu --exported DATA --out RESULTS --work-dir WORK \\
      --time-limit LEFT

with XLA's GPU autotuning off (`XLA_FLAGS=--xla_gpu_autotune_level=0`: the study's ~8 train-step
and ~25 decode-loop compiles are most of its budget; the preset's docstring says how it is sized).
`LEFT` is what is left of `--budget` (wall seconds from this command's start, default 330) less
`RESERVE_S` for packing; the reproduction stops cleanly at it (exit 75: finished stages and jobs
kept, training jobs checkpointed) and the summary says which stage it reached. Whatever happened,
`summary.{json,md}` (each stage's seconds, the quality and speed goals of the accelerator issue
beside the figures, the claims table when the report stage ran) and `device_check_study.tar.gz`
(the results directory: stage JSON, report.md, figures; the work dir's job records; the run log)
are left in `--out`.

`--size nano` runs the same preset at toy size on a CPU (`NANO_SET`: `--set` overrides, a few
steps); `tests/scripts/test_device_study.py` runs it in the suite, and checks that the stage
estimates (`STAGE_ESTIMATE_S`) fit one call.
"""

from __future__ import annotations

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

BUDGET_S = 330  # wall seconds of the driver (a device call adds its start and transfers)
RESERVE_S = 15  # kept back for the summary and the archive
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


def estimated_total() -> int:
  return sum(STAGE_ESTIMATE_S.values()) + RESERVE_S


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
                     'benchmarks/gpu_study_kit.sh (or give --exported DIR)')
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


def summary_lines(meta: Dict, records: Dict[str, dict]) -> List[str]:
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
  from benchmarks.device_check import _device  # pylint: disable=g-import-not-at-top
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
    left = budget - (time.monotonic() - start) - RESERVE_S
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
  lines = summary_lines(meta, records)
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
