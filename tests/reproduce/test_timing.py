"""The timing stage's interleaved rounds (`timing.interleaved_seconds`): every model compiled
first, then one run of each per round, the order reversed every other round."""

import time

from gqa_spec.reproduce import timing


def test_models_are_compiled_first_then_timed_in_alternating_rounds():
  calls = []

  def run(k, seconds):
    def fn():
      calls.append(k)
      time.sleep(seconds)
      return k
    return fn

  times = timing.interleaved_seconds({4: run(4, 0.0), 1: run(1, 0.02), 2: run(2, 0.0)}, 3)
  assert calls == [4, 1, 2] + [1, 2, 4] + [4, 2, 1] + [1, 2, 4]  # compile runs, then 3 rounds
  assert sorted(times) == [1, 2, 4] and all(len(t) == 3 for t in times.values())
  assert min(times[1]) >= 0.02 > max(times[2] + times[4])  # each time is its own run's
