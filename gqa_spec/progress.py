"""Progress wherever the output goes: a bar on a terminal, timed log lines everywhere else.

A long run under `nohup`, a batch scheduler or `| tee` has no terminal, so a tqdm bar would be
silent there; `Progress` then logs one line (logger `gqa_spec.progress`, level INFO) every
`every_steps` steps or `every_seconds` seconds, whichever comes first, plus the first and last:

  ... INFO gqa_spec.progress: [finetune 3/12 ddtp_translate_en_de.gqa2] train step 120/400 (30%)
      loss 4.213 tokens/s 5.1e+03 elapsed 1m04s ETA 2m29s

The bracketed prefix is the current `scope` stack (`gqa-spec reproduce` pushes its stage and job),
so a line says where in a multi-stage run it comes from. Inside `coarse()` (each job of
`gqa-spec reproduce`) only the time rule applies, so many short jobs do not flood the log.
The ETA extrapolates the rate measured since the first update, which leaves the compilation of
the first step out of it.

  with progress.scope('pretrain', 'job 1/2 target'):
    p = progress.Progress('train', total=1000, initial=0)
    for step in ...:
      p.update(step, loss=loss, tokens=tokens_in_this_step)
    p.close()
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import sys
import time
from typing import Iterator, Optional, Tuple

log = logging.getLogger('gqa_spec.progress')

# Seconds between two progress lines when no terminal shows a bar (GQA_SPEC_PROGRESS_SECONDS).
DEFAULT_SECONDS = 30.0
# Per context (a thread, or a job `gqa-spec reproduce` runs beside another in a copied context):
# the open `scope` labels, and whether a `coarse()` block is open.
_scopes: contextvars.ContextVar[Tuple[str, ...]] = contextvars.ContextVar('scopes', default=())
_coarse: contextvars.ContextVar[bool] = contextvars.ContextVar('coarse', default=False)


@contextlib.contextmanager
def coarse() -> Iterator[None]:
  """Inside the block, a `Progress` created there writes lines only every `every_seconds` (not its
  first, every tenth or last step): `gqa-spec reproduce` logs one line per job, and a job longer
  than `every_seconds` still shows its progress."""
  token = _coarse.set(True)
  try:
    yield
  finally:
    _coarse.reset(token)


@contextlib.contextmanager
def scope(*labels: str) -> Iterator[None]:
  """Prefixes every progress line inside the block with `labels` (nested scopes concatenate)."""
  token = _scopes.set(_scopes.get() + labels)
  try:
    yield
  finally:
    _scopes.reset(token)


def prefix() -> str:
  scopes = _scopes.get()
  return f'[{" ".join(scopes)}] ' if scopes else ''


def format_seconds(seconds: float) -> str:
  """`1h02m03s`, `4m05s` or `6s`."""
  if not math.isfinite(seconds):
    return '?'
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  if hours:
    return f'{hours}h{minutes:02d}m{secs:02d}s'
  return f'{minutes}m{secs:02d}s' if minutes else f'{secs}s'


def info(message: str, *args) -> None:
  """One progress line with the current scope prefix (stage starts and ends, job starts)."""
  log.info(prefix() + message, *args)


class Progress:
  """A bar on a terminal; otherwise a log line every `every_steps` steps or `every_seconds` s.

  Args:
    name: what progresses ('train', 'eval', ...), first word of each line.
    total: the value `update` reaches at the end (absolute step for training); None: unknown
      (lines show no percentage and no ETA).
    initial: the value at the start (the step a resumed run starts from).
    unit: the unit's name in lines ('step', 'batch').
    bar: show a tqdm bar instead of lines; None: when stderr is a terminal.
    every_steps: at most this many units between two lines (None: `ceil((total-initial)/10)`).
    every_seconds: at most this many seconds between two lines (None: the environment's
      GQA_SPEC_PROGRESS_SECONDS, default 30). A line is written only at an `update`.
    enabled: False shows nothing (hosts other than the first).
  """

  def __init__(self, name: str, total: Optional[int], initial: int = 0, unit: str = 'step',
               bar: Optional[bool] = None, every_steps: Optional[int] = None,
               every_seconds: Optional[float] = None, enabled: bool = True):
    self.name, self.total, self.unit, self.enabled = name, total, unit, enabled
    self._initial = self._last_value = initial
    if every_steps is None:
      every_steps = max(1, math.ceil((total - initial) / 10)) if total else 10
    if every_seconds is None:
      every_seconds = float(os.environ.get('GQA_SPEC_PROGRESS_SECONDS', DEFAULT_SECONDS))
    self.every_steps, self.every_seconds = every_steps, every_seconds
    self._coarse = _coarse.get()
    self._start = time.time()
    self._rate_origin = None  # (time, value) of the first update: the rate excludes compilation
    self._last_line = (self._start, initial)  # (time, value) of the last line
    self._tokens = 0.0  # since the last line
    self._bar = None
    if bar is None:
      bar = sys.stderr.isatty()
    if bar and enabled:
      import tqdm  # pylint: disable=g-import-not-at-top
      self._bar = tqdm.tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True,
                            desc=(prefix() + name).strip())

  def update(self, value: int, loss: Optional[float] = None,
             tokens: Optional[float] = None) -> None:
    """Reached `value` (absolute); `loss` of the latest unit, `tokens` processed since the last
    update (for tokens/s)."""
    if not self.enabled:
      return
    now = time.time()
    if self._bar is not None:
      self._bar.update(value - self._last_value)
      if loss is not None:
        self._bar.set_postfix(loss=f'{loss:.4f}', refresh=False)
    self._last_value = value
    if tokens is not None:
      self._tokens += tokens
    first = self._rate_origin is None
    if first:
      self._rate_origin = (now, value)
      if self._coarse:  # time and tokens/s from here: the first update includes compiling
        self._last_line, self._tokens = (now, value), 0.0
    last_time, last_value = self._last_line
    due = now - last_time >= self.every_seconds or not self._coarse and (
        first or (self.total is not None and value >= self.total)
        or value - last_value >= self.every_steps)
    if self._bar is None and due:
      self._line(now, value, loss, first)

  def _line(self, now: float, value: int, loss: Optional[float], first: bool) -> None:
    last_time, _ = self._last_line
    parts = [f'{prefix()}{self.name} {self.unit} {value}']
    if self.total:
      parts[0] += f'/{self.total} ({100 * value / self.total:.0f}%)'
    if loss is not None:
      parts.append(f'loss {loss:.4g}')
    if self._tokens and now > last_time and not first:  # the first update includes compiling
      parts.append(f'tokens/s {self._tokens / (now - last_time):.3g}')
    parts.append(f'elapsed {format_seconds(now - self._start)}')
    origin_time, origin_value = self._rate_origin
    if self.total:
      rate = (value - origin_value) / (now - origin_time) if now > origin_time else 0.0
      eta = 0.0 if value >= self.total else (self.total - value) / rate if rate > 0 else math.inf
      parts.append(f'ETA {format_seconds(eta)}')
    log.info(' '.join(parts))
    self._last_line, self._tokens = (now, value), 0.0

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
