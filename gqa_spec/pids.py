"""Whether a process id still names the process that took a lock or wrote a temporary file.

Standard library only (a leaf, like `errors`). A pid alone lies: after the writer died, after a
reboot or in another container the same number may belong to an unrelated program. On Linux a
process is named for good by its pid, its start time (`/proc/PID/stat` field 22, in clock ticks
since boot) and the boot it ran in (`/proc/sys/kernel/random/boot_id`); where `/proc` is missing
the functions answer None and the callers fall back to the pid alone.

  me = pids.identity()               # {'boot_id': ..., 'start_ticks': ...} of this process
  pids.gone(pid, recorded)           # why pid no longer names that process, or None
  pids.started_after(pid, seconds)   # the process now at pid started after that time
"""

from __future__ import annotations

import os
import time
from typing import Optional


def _read(path: str) -> Optional[str]:
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return None


def boot_id() -> Optional[str]:
  """This boot of this host's kernel (a new one after every reboot), or None."""
  text = _read('/proc/sys/kernel/random/boot_id')
  return text.strip() if text else None


def start_ticks(pid: int) -> Optional[int]:
  """When the process `pid` started, in clock ticks since boot (`/proc/PID/stat` field 22), or None
  (no such process, or no /proc)."""
  text = _read(f'/proc/{pid}/stat')
  if not text or ')' not in text:
    return None
  fields = text[text.rindex(')') + 2:].split()  # the name in parentheses may hold spaces
  try:
    return int(fields[19])  # field 3 (state) is fields[0]
  except (IndexError, ValueError):
    return None


def identity(pid: Optional[int] = None) -> dict:
  """What names process `pid` (this one by default) beyond its number: its boot and start time
  (fields absent where /proc cannot tell)."""
  found = {'boot_id': boot_id(), 'start_ticks': start_ticks(os.getpid() if pid is None else pid)}
  return {k: v for k, v in found.items() if v is not None}


def alive(pid: int) -> bool:
  """Whether some process (any program, any user) has the id `pid` on this host."""
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # alive, another user's
  except OverflowError:
    return False
  return True


def started_at(pid: int) -> Optional[float]:
  """The wall-clock time (seconds since the epoch) the process `pid` started, or None."""
  ticks = start_ticks(pid)
  stat = _read('/proc/stat')
  if ticks is None or not stat:
    return None
  for line in stat.splitlines():
    if line.startswith('btime '):
      return int(line.split()[1]) + ticks / os.sysconf('SC_CLK_TCK')
  return None


def started_after(pid: int, seconds: float, slack: float = 2.0) -> bool:
  """Whether the process now at `pid` started after `seconds` (epoch; `slack` for the coarse boot
  time): then it cannot be whoever was at work at that time under the same pid."""
  started = started_at(pid)
  return started is not None and started > seconds + slack


def gone(pid: int, recorded: dict) -> Optional[str]:
  """Why the process recorded as `pid` with `recorded` (`identity`'s fields) is gone from this host,
  or None when it may still run. Fields `recorded` lacks are not compared."""
  if not alive(pid):
    return f'its pid {pid} is gone on this host'
  if recorded.get('boot_id') and boot_id() and recorded['boot_id'] != boot_id():
    return f'it ran before this host rebooted (pid {pid} is now another process)'
  ticks = start_ticks(pid)
  if (recorded.get('start_ticks') is not None and ticks is not None
      and ticks != recorded['start_ticks']):
    return f'its pid {pid} now belongs to another process (started {_ago(pid)})'
  return None


def _ago(pid: int) -> str:
  started = started_at(pid)
  return ('at an unknown time' if started is None else
          time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started)))
