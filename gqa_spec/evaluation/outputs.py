"""What `gqa-spec eval` and `gqa-spec infer` record beside their outputs, shared by both.

  step = outputs.checkpoint_step('RUN/best', None)       # RUN/best.json's step for a run's best/
  outputs.note_replaced(output_dir, ['metrics.json'])    # one stderr line when files are replaced

An output directory that exists is written into, and files of the same names are replaced (a rerun
needs no flag); a line on stderr names the files replaced, so a rerun never overwrites earlier
results without a word.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional, Sequence

from gqa_spec import rundir


def checkpoint_step(checkpoint_path: str, step: Optional[int]) -> Optional[int]:
  """The training step of a checkpoint: as loaded (a train-state checkpoint's), else for a run's
  `best/` export, named itself or taken for its run directory (`load_any(..., model=True)`), the
  step its `best.json` records; None when nothing records one."""
  if step is not None:
    return step
  path = os.path.normpath(os.path.abspath(checkpoint_path))
  if os.path.basename(path) == rundir.BEST_DIR:
    record = os.path.join(os.path.dirname(path), rundir.BEST_FILE)
  elif os.path.isdir(os.path.join(path, rundir.BEST_DIR)):  # a run directory: its best/ was taken
    record = os.path.join(path, rundir.BEST_FILE)
  else:
    return None
  if not os.path.isfile(record):
    return None
  try:
    with open(record) as f:
      return int(json.load(f)['step'])
  except (ValueError, KeyError, TypeError):
    return None  # an unreadable record: no step, as for any native checkpoint


def note_replaced(output_dir: str, names: Sequence[str]) -> None:
  """Prints one line naming the files of `names` that already exist in `output_dir`."""
  existing = [n for n in names if os.path.exists(os.path.join(output_dir, n))]
  if existing:
    print(f'gqa-spec: replacing {len(existing)} existing file(s) in {output_dir}: '
          f'{", ".join(existing)}', file=sys.stderr)
