"""`gqa-spec status DIR`: where a training run or a reproduction stands, read from its files only.

A run directory (`trainer.train`'s model_dir): the latest complete checkpoint (and uncommitted
ones a killed save left), the last logged train and eval metrics, the best evaluation, and
whether a process is still writing it. A reproduction's results directory (`preset.json`): the
stages done and pending, the finished jobs of the first pending stage, and whether a process is
still running it.

"Still writing" is read from the run directory's lock (`gqa_spec.rundir_lock`), never taken.
Temporaries that killed writers left (`.NAME.tmpPID`, which the run's next writer removes) are
listed with their sizes. A record of the wrong shape (`best.json`, `preset.json`, a stage's JSON,
the lock) is one line saying so, the other lines as usual.
"""

from __future__ import annotations

import os
import time
from typing import List

from gqa_spec import rundir
from gqa_spec.errors import UserError
from gqa_spec.rundir import BEST_DIR, BEST_FILE, CHECKPOINTS_DIR, RUNNING_FILE, TRAIN_LOG_FILE
from gqa_spec.rundir_lock import leftovers, process_state

BEST_FIELDS = {'step': int, 'metric': str, 'value': float}


def _metrics(record: dict) -> str:
  skip = ('step', 'split', 'timing/steps_per_second')
  return ', '.join(f'{k}={v:.4g}' for k, v in record.items()
                   if k not in skip and isinstance(v, (int, float)))


def run_status(model_dir: str) -> List[str]:
  """The status lines of a trainer run directory."""
  from gqa_spec.training import summaries as metrics  # pylint: disable=g-import-not-at-top  (numpy only)
  lines = [f'run {model_dir}', f'  process: {process_state(model_dir)}']
  ckpt_dir = os.path.join(model_dir, CHECKPOINTS_DIR)
  entries = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
  # orbax commits a step by renaming its temporary directory to the bare step number.
  complete = sorted(int(e) for e in entries if e.isdigit())
  partial = sorted(e for e in entries if not e.isdigit() and e.split('.')[0].isdigit())
  if complete:
    lines.append(f'  latest complete checkpoint: step {complete[-1]} '
                 f'({os.path.join(CHECKPOINTS_DIR, str(complete[-1]))}); kept: '
                 f'{", ".join(map(str, complete))}')
  else:
    lines.append('  latest complete checkpoint: none')
  if partial:
    lines.append(f'  incomplete (uncommitted, ignored on resume): {", ".join(partial)}')
  records = metrics.read_records(os.path.join(model_dir, TRAIN_LOG_FILE))
  for split in ('train', 'eval'):
    last = [r for r in records if r.get('split') == split]
    if last:
      lines.append(f"  last {split} metrics (step {last[-1].get('step', '?')}): "
                   f'{_metrics(last[-1])}')
  try:
    best = rundir.optional_record(os.path.join(model_dir, BEST_FILE), BEST_FIELDS, 'best record')
  except rundir.RecordError as e:
    lines.append(f'  best: cannot be read: {e}')
  else:
    if best:
      lines.append(f"  best: {best['metric']} = {best['value']:.4g} at step {best['step']} "
                   f'({BEST_DIR}/)')
  lines += _leftover_lines(leftovers(model_dir), model_dir)
  if records:
    age = time.time() - os.path.getmtime(os.path.join(model_dir, TRAIN_LOG_FILE))
    lines.append(f'  last log write: {age:.0f} s ago')
  return lines


def _size(path: str) -> int:
  if not os.path.isdir(path) or os.path.islink(path):
    return os.lstat(path).st_size
  return sum(os.lstat(os.path.join(d, name)).st_size
             for d, _, names in os.walk(path) for name in names)


def _leftover_lines(paths: List[str], directory: str) -> List[str]:
  """'  left by killed writers (removed by the next writer): .best.tmp12 (141 MB), ...'."""
  if not paths:
    return []
  described = []
  for path in paths:
    try:
      size = f'{_size(path) / 1e6:.3g} MB'
    except OSError:
      size = 'gone meanwhile'
    described.append(f'{os.path.relpath(path, directory)} ({size})')
  return [f'  left by killed writers (the next writer removes them): {", ".join(described)}']


def reproduction_status(out_dir: str) -> List[str]:
  """The status lines of a `gqa-spec reproduce` results directory."""
  from gqa_spec.reproduce.stages import STAGES  # pylint: disable=g-import-not-at-top
  preset = rundir.read_record(os.path.join(out_dir, 'preset.json'), {}, 'reproduction record',
                              optional={'name': str, 'work_dir': str})
  # Relative to out_dir (or absolute, as older runs recorded it).
  work_dir = os.path.normpath(os.path.join(out_dir, preset.get('work_dir', '')))
  done = [s for s in STAGES if os.path.exists(os.path.join(out_dir, f'{s}.json'))]
  pending = [s for s in STAGES if s not in done]
  lines = [f"reproduction {out_dir} (preset {preset.get('name')}, work dir {work_dir})",
           f'  process: {process_state(out_dir)}',
           f"  stages done: {', '.join(done) or 'none'}",
           f"  stages pending: {', '.join(pending) or 'none'}"]
  for stage in done:
    try:
      wall = rundir.read_record(os.path.join(out_dir, f'{stage}.json'), {}, 'stage record',
                                optional={'wall_seconds': (float, type(None))}).get('wall_seconds')
    except rundir.RecordError as e:
      lines.append(f'    {stage}: cannot be read: {e}')
      continue
    if wall is not None:
      lines.append(f'    {stage}: {wall:.0f} s')
  if pending:
    jobs_dir = os.path.join(work_dir, 'jobs', pending[0])
    jobs = sorted(j[:-len('.json')] for j in os.listdir(jobs_dir)
                  if j.endswith('.json')) if os.path.isdir(jobs_dir) else []
    lines.append(f"  {pending[0]}: {len(jobs)} job(s) finished" +
                 (f" ({', '.join(jobs)})" if jobs else ''))
  lines += _leftover_lines(leftovers(out_dir), out_dir)
  return lines


def status(directory: str) -> List[str]:
  """Status lines of a run directory or a reproduction results directory."""
  if not os.path.isdir(directory):
    raise UserError(f'{directory} is not a directory')
  if os.path.exists(os.path.join(directory, 'preset.json')):
    return reproduction_status(directory)
  if any(os.path.exists(os.path.join(directory, name))
         for name in (CHECKPOINTS_DIR, TRAIN_LOG_FILE, RUNNING_FILE)):
    return run_status(directory)
  raise UserError(f'{directory} is neither a training run directory (checkpoints/, '
                  'train_log.jsonl) nor a reproduction results directory (preset.json)')


def register(subparsers) -> None:
  p = subparsers.add_parser(
      'status', help='where a training run or a reproduction stands (checkpoints, metrics, '
                     'stages, whether a process is still writing it)')
  p.add_argument('directory', help='a run directory (MODEL_DIR) or a reproduction results dir')
  p.set_defaults(func=_status)


def _status(args) -> int:
  print('\n'.join(status(args.directory)))
  return 0
