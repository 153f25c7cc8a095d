"""`guard.SpeculationGuard` and `guard.decode_batches`: a run stops speculating once its calls
measure slower than greedy decoding, after a plain call confirms it (the CLI end to end:
tests/decoding/test_commands.py)."""

import time
import types

import jax
import numpy as np
import pytest

from gqa_spec.decoding.guard import SpeculationGuard, call_seconds, decode_batches


def test_speculation_that_pays_is_never_interrupted():
  guard = SpeculationGuard(step_seconds=0.1)
  for _ in range(20):
    assert not guard.next_plain
    guard.record(0.9, [10, 7], iterations=5, plain=False)  # 10 greedy steps (1.0 s) in 0.9 s
  assert guard.speed == pytest.approx(1.0 / 0.9) and guard.stopped_after is None
  assert guard.to_dict()['plain_calls'] == 0 and not guard.to_dict()['unit_measured']


def test_slow_speculation_is_confirmed_by_a_plain_call_then_stopped():
  guard = SpeculationGuard(step_seconds=0.1)
  guard.record(2.0, [10], iterations=4, plain=False)  # 0.5x, but one call decides nothing
  assert not guard.next_plain
  guard.record(2.0, [10], iterations=4, plain=False)
  assert guard.next_plain and guard.probing and guard.stopped_after is None  # a probe first
  guard.record(1.2, [12], iterations=12, plain=True)  # greedy: 0.1 s a step, as calibrated
  assert guard.stopped_after == 3 and guard.next_plain and guard.speed == pytest.approx(0.5)
  guard.record(1.0, [10], iterations=10, plain=True)  # stays plain: final
  assert guard.next_plain and guard.stopped_after == 3
  assert guard.to_dict() == {
      'floor': 0.97, 'min_calls': 2, 'speculative_calls': 2, 'plain_calls': 2,
      'speed': pytest.approx(0.5), 'unit_seconds': pytest.approx(0.1), 'call_seconds': 0.0,
      'unit_measured': True, 'stopped_after_call': 3}


def test_a_calls_encoder_pass_counts_until_plain_calls_are_timed():
  # 10 steps at the calibration's 0.1 s plus an encoder pass of 0.2 s, in 1.1 s: 1.09x greedy
  # decoding. Steps alone (1.0 s) would read 0.91x and probe.
  guard = SpeculationGuard(step_seconds=0.1, call_seconds=0.2)
  for _ in range(5):
    guard.record(1.1, [10], iterations=4, plain=False)
  assert guard.speed == pytest.approx(1.2 / 1.1) and not guard.next_plain
  assert guard.to_dict()['call_seconds'] == 0.2
  bare = SpeculationGuard(step_seconds=0.1)
  for _ in range(2):
    bare.record(1.1, [10], iterations=4, plain=False)
  assert bare.speed == pytest.approx(1.0 / 1.1) and bare.probing
  # A plain call's own unit holds its encoder pass: the term is dropped once one is timed.
  guard.probing = True
  guard.record(1.5, [10], iterations=10, plain=True)  # 0.15 s a step, call included
  assert guard.speed == pytest.approx(0.15 * 50 / 5.5) and guard.to_dict()['call_seconds'] == 0.0


def test_call_seconds_times_the_encoder_pass():
  calls = []

  def init():
    calls.append(1)
    time.sleep(0.02)
    return jax.numpy.zeros(3)

  seconds = call_seconds(init, repeats=3)
  assert 0.02 <= seconds < 0.2 and len(calls) == 4  # one untimed run, then the fastest of 3


def test_a_probe_that_finds_speculation_paying_resumes_it():
  # The calibration's unit read greedy decoding 3x too fast: the probe's own unit corrects it.
  guard = SpeculationGuard(step_seconds=0.03)
  for _ in range(2):
    guard.record(0.8, [10], iterations=4, plain=False)  # 0.375x at the calibration's unit
  assert guard.next_plain
  guard.record(1.0, [10], iterations=10, plain=True)  # 0.1 s a step: speculation at 1.25x
  assert not guard.next_plain and guard.stopped_after is None
  assert guard.speed == pytest.approx(0.1 * 20 / 1.6)
  # Slower later (the cumulative speed falls below 0.97x): stopped at once, the unit measured.
  for _ in range(4):
    guard.record(2.0, [10], iterations=4, plain=False)
  assert guard.stopped_after is not None and guard.next_plain


def test_bad_settings_raise():
  for kwargs in ({'step_seconds': 0.0}, {'step_seconds': 1.0, 'call_seconds': -1.0},
                 {'step_seconds': 1.0, 'floor': 1.5},
                 {'step_seconds': 1.0, 'min_calls': 0}):
    with pytest.raises(ValueError):
      SpeculationGuard(**kwargs)


class _FakeRun:
  """A decode call that 'takes' `spec` or `plain` seconds on a fake clock, outputs of `steps`
  tokens per row."""

  def __init__(self, spec: float, plain: float, steps: int = 10):
    self.now, self.spec, self.plain, self.steps, self.calls = 0.0, spec, plain, steps, []

  def clock(self):
    return self.now

  def __call__(self, inputs, n, rng, plain):
    self.calls.append((inputs, plain, tuple(np.asarray(jax.random.key_data(rng)).ravel())))
    self.now += self.plain if plain else self.spec
    return types.SimpleNamespace(lengths=np.full((4,), self.steps), loop_iterations=self.steps,
                                 inputs=inputs, plain=plain)


def test_decode_batches_switches_to_plain_calls_compiling_them_untimed():
  run = _FakeRun(spec=2.0, plain=1.0)  # speculation at 0.5x greedy decoding's measured speed
  guard = SpeculationGuard(step_seconds=0.1)
  batches = [(f'batch{i}', 3) for i in range(6)]
  results, seconds, compile_seconds = decode_batches(run, batches, jax.random.PRNGKey(0), guard,
                                                     clock=run.clock)
  assert [r.inputs for r, _ in results] == [b for b, _ in batches] and [n for _, n in results] == [3] * 6
  assert [r.plain for r, _ in results] == [False, False, True, True, True, True]
  # batch 2 ran twice, plain: first untimed (compiling greedy decoding's program), then timed
  assert [(x, p) for x, p, _ in run.calls][2:4] == [('batch2', True), ('batch2', True)]
  assert run.calls[2][2] == run.calls[3][2]  # the same key: the timed call is the one kept
  assert compile_seconds == 1.0 and seconds == 2 * 2.0 + 4 * 1.0
  assert guard.stopped_after == 3


def test_decode_batches_without_a_guard_splits_keys_as_before():
  run = _FakeRun(spec=2.0, plain=1.0)
  results, seconds, compile_seconds = decode_batches(run, [('a', 1), ('b', 1)],
                                                     jax.random.PRNGKey(7), clock=run.clock)
  rng, keys = jax.random.PRNGKey(7), []
  for _ in range(2):
    rng, step = jax.random.split(rng)
    keys.append(tuple(np.asarray(jax.random.key_data(step)).ravel()))
  assert [k for _, _, k in run.calls] == keys
  assert [p for _, p, _ in run.calls] == [False, False] and compile_seconds == 0.0 and seconds == 4.0
