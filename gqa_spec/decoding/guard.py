"""A run of many batches that stops speculating once its own calls measure slower than greedy
decoding (`generate --gamma auto` and `--tree best:auto`, `--guard`).

The calibration prices an iteration before the run; the guard checks that price against the
run's own calls:

  speed = (unit * steps + call * calls) / seconds  over the speculative calls so far,

steps being the greedy steps each call replaced (its batch's longest output), unit the seconds of
a greedy step (the plain calls' own once any ran, else the calibration's) and call what a greedy
call spends besides its steps (`call_seconds`; 0 once plain calls give the unit). After
`min_calls` speculative calls, a speed below `floor` makes the next call a plain probe when none
was timed yet, else stops speculation for the rest of the run; a probe that shows speculation
paying resumes it. Each decision uses only calls already made, so every call stays exact
speculative (or plain) decoding. With several processes every process reads process 0's seconds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import jax
import numpy as np

from gqa_spec import distributed
from gqa_spec.decoding import cost_calibration


@dataclasses.dataclass
class SpeculationGuard:
  """The guard's state over a run (module docstring); `next_plain` says how to decode the next
  batch, `record` takes each timed call.

  Attributes:
    step_seconds: the calibration's seconds per greedy step, the unit until a plain call is timed.
    call_seconds: what a greedy call spends besides its steps (`call_seconds`).
    floor: stop below this speed.
    min_calls: speculative calls before deciding.
  """
  step_seconds: float
  call_seconds: float = 0.0
  floor: float = 0.97
  min_calls: int = 2
  speculative_calls: int = 0
  speculative_seconds: float = 0.0
  speculative_steps: int = 0
  plain_calls: int = 0
  plain_seconds: float = 0.0
  plain_steps: int = 0
  stopped_after: Optional[int] = None  # calls made (both kinds) when speculation stopped
  probing: bool = False

  def __post_init__(self):
    if not self.step_seconds > 0 or not self.call_seconds >= 0:
      raise ValueError(f'step_seconds must be > 0 and call_seconds >= 0, got '
                       f'{self.step_seconds}, {self.call_seconds}')
    if not 0 < self.floor <= 1 or self.min_calls < 1:
      raise ValueError(f'floor must be in (0, 1] and min_calls >= 1, got {self.floor}, '
                       f'{self.min_calls}')

  @property
  def next_plain(self) -> bool:
    """Whether the next call decodes without the draft (a probe, or speculation stopped)."""
    return self.probing or self.stopped_after is not None

  @property
  def unit(self) -> float:
    """Seconds per greedy step: the plain calls' own, else the calibration's."""
    return self.plain_seconds / self.plain_steps if self.plain_steps else self.step_seconds

  @property
  def speed(self) -> Optional[float]:
    """The speculative calls' speed over greedy decoding's so far (None before any)."""
    if not self.speculative_seconds:
      return None
    call = 0.0 if self.plain_steps else self.call_seconds
    return ((self.unit * self.speculative_steps + call * self.speculative_calls)
            / self.speculative_seconds)

  def record(self, seconds: float, lengths: Sequence[int], iterations: int, plain: bool) -> None:
    """A timed call: its wall `seconds`, the output lengths of its real rows, its loop
    `iterations`, and whether it was plain (`next_plain` when it was made)."""
    if plain:
      self.plain_calls += 1
      self.plain_seconds += seconds
      self.plain_steps += max(int(iterations), 1)
      if not self.probing:
        return
      self.probing = False
    else:
      self.speculative_calls += 1
      self.speculative_seconds += seconds
      self.speculative_steps += max(max((int(n) for n in lengths), default=0), 1)
    speed = self.speed
    if self.speculative_calls < self.min_calls or speed is None or speed >= self.floor:
      return
    if self.plain_steps:
      self.stopped_after = self.speculative_calls + self.plain_calls
    else:
      self.probing = True

  def to_dict(self) -> Dict[str, Any]:
    """`generate --stats`' `guard` entry."""
    return {'floor': self.floor, 'min_calls': self.min_calls,
            'speculative_calls': self.speculative_calls, 'plain_calls': self.plain_calls,
            'speed': self.speed, 'unit_seconds': self.unit,
            'call_seconds': 0.0 if self.plain_steps else self.call_seconds,
            'unit_measured': bool(self.plain_steps), 'stopped_after_call': self.stopped_after}


def call_seconds(init: Callable[[], Any], repeats: int = 3) -> float:
  """`SpeculationGuard.call_seconds`: the fastest of `repeats` runs of `init()` (the target's
  encoder pass and cache set-up on one batch, compiled), process 0's on every process."""
  return distributed.from_process_zero([cost_calibration.min_time(init, repeats)])[0]


def decode_batches(run: Callable[[Any, int, jax.Array, bool], Any], batches: Iterable[Tuple[Any, int]],
                   rng: jax.Array, guard: Optional[SpeculationGuard] = None,
                   clock: Callable[[], float] = time.perf_counter
                   ) -> Tuple[List[Tuple[Any, int]], float, float]:
  """Each `(inputs, real rows n)` of `batches` decoded in turn by `run(inputs, n, rng, plain)`
  (a host result with `lengths [b]` and `loop_iterations`), each with its own key, `plain` as
  `guard.next_plain` says, each call timed and given to the guard. Greedy decoding's program is
  compiled by an untimed call the first time the guard turns to it. Returns `([(result, n)],
  seconds of the timed calls, seconds of that compiling call)`."""
  results, seconds, compile_seconds, plain_compiled = [], 0.0, 0.0, False
  for inputs, n in batches:
    rng, step_rng = jax.random.split(rng)
    plain = guard is not None and guard.next_plain
    if plain and not plain_compiled:
      t0 = clock()
      run(inputs, n, step_rng, True)
      compile_seconds += clock() - t0
      plain_compiled = True
    t0 = clock()
    result = run(inputs, n, step_rng, plain)
    call = clock() - t0
    seconds += call
    results.append((result, n))
    if guard is not None:
      guard.record(distributed.from_process_zero([call])[0], np.asarray(result.lengths)[:n],
                   int(result.loop_iterations), plain)
  return results, seconds, compile_seconds
