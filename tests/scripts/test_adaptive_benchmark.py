"""benchmarks/adaptive.py: inputs from exported tasks (the GPU machine has no seqio), reports
written after every cell (a run its clock cuts keeps its cells), the A/A control's place, the
confirmation rounds."""

import json

import numpy as np
import pytest

from benchmarks import adaptive, common, workloads
from gqa_spec.data import tasks


def test_exported_inputs_are_the_seqio_inputs(tiny_data_dir, tiny_gpu_export):
  exported = workloads.task_inputs(f'exported:{tiny_gpu_export}/ddtp_translate_en_de', None,
                                        4, 32, 16)
  try:
    seqio = workloads.task_inputs('ddtp_translate_en_de', tiny_data_dir, 4, 32, 16)
  finally:
    tasks.register_ddtp_tasks()  # back to the default data dir for other modules
  assert exported.shape == (4, 32) and exported.dtype == np.int32
  np.testing.assert_array_equal(exported, seqio)
  assert (exported[:, 0] > 1).all()  # real tokens, not padding or EOS
  with pytest.raises(SystemExit, match='1000000 asked for'):
    workloads.task_inputs(f'exported:{tiny_gpu_export}/ddtp_translate_en_de', None,
                               10 ** 6, 32, 16)


def test_inputs_read_the_splits_in_turn(tiny_data_dir, tiny_gpu_export):
  """--splits test,validation: every test input first, then the validation split's, from seqio and
  from an export alike; too few in all is a clear error."""
  task = f'exported:{tiny_gpu_export}/ddtp_translate_en_de'
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  (exp,), _ = exported.resolve(task)
  n_test = exp.num_examples('test')
  test = workloads.task_inputs(task, None, n_test, 32, 16)
  validation = workloads.task_inputs(task, None, 2, 32, 16, ('validation',))
  both = workloads.task_inputs(task, None, n_test + 2, 32, 16, ('test', 'validation'))
  np.testing.assert_array_equal(both, np.concatenate([test, validation]))
  try:
    seqio = workloads.task_inputs('ddtp_translate_en_de', tiny_data_dir, n_test + 2, 32, 16,
                                       ('test', 'validation'))
  finally:
    tasks.register_ddtp_tasks()
  np.testing.assert_array_equal(seqio, both)
  with pytest.raises(SystemExit, match=r'test\+validation'):
    workloads.task_inputs(task, None, 10 ** 6, 32, 16, ('test', 'validation'))


def _row(method, seconds):
  return {'pair': 'p', 'task': 't', 'draft': 'd', 'batch': 1, 'temperature': 0.0,
          'method': method, 'seconds': seconds, 'tokens': 10, 'tokens_per_second': 10 / seconds,
          'tokens_per_call': 1.0, 'x_greedy': 0.1 / seconds, 'x_best_fixed': 0.2 / seconds,
          'cost_ratio': None, 'verify_ratio': None}


def test_a_cut_run_keeps_its_cells(tmp_path, monkeypatch):
  module, auto, fixed = adaptive, 'auto:optimal', 'gamma=1'

  def measure(args, on_cell):  # one cell measured, then the clock's kill
    rows = [_row('no draft', 0.1), _row(fixed, 0.2),
            dict(_row(auto, 0.1), cost_ratio=0.5, verify_ratio=[1.5], alpha_init=0.3,
                 calibration_seconds=1.0, gamma_histogram=[1, 0], draft_steps_saved=0,
                 nodes_histogram=[1, 0]),
            _row(adaptive.GREEDY_AGAIN, 0.1)]
    on_cell(rows)
    raise KeyboardInterrupt

  monkeypatch.setattr(module, 'measure', measure)
  out = str(tmp_path / 'r')
  argv = ['--out', out]
  with pytest.raises(KeyboardInterrupt):
    module.main(argv)
  report = json.load(open(out + '.json'))
  assert report['complete'] is False and len(report['rows']) == 4
  assert [g['x_greedy'] for g in report['goals']] == [1.0]
  assert '**Partial**' in open(out + '.md').read()


def test_the_ab_control_never_runs_right_after_greedy_decoding(monkeypatch):
  # measure_cell times greedy decoding twice (the A/A control); in the rotated rounds neither
  # copy may follow the other (a program run right after itself came out faster on a GPU).
  captured = {}

  def interleaved(runs, repeats, order=(), shuffle=False):
    captured.update(order=list(order), repeats=repeats, shuffle=shuffle)
    return {name: [1.0] for name in runs}

  class Result:  # what measure_cell reads of a decode result
    lengths = np.array([3])
    target_calls = np.array([3])
    loop_iterations = np.array(3)
    accepted = proposed = np.array([1])

  monkeypatch.setattr(common, 'interleaved', interleaved)
  for count in range(3, 12):  # greedy decoding and 2..10 other methods (with 1, every pair of
    # three neighbours somewhere in the rotation)
    runs = {'no draft': lambda: [Result()]}
    runs.update({f'gamma={g}': (lambda: [Result()]) for g in range(1, count)})
    rows = adaptive.measure_cell(runs, 5, {'pair': 'p'}, lambda m, r: {},
                                       lambda m: m.startswith('gamma='))
    order = captured['order']
    assert sorted(order) == sorted(list(runs) + [adaptive.GREEDY_AGAIN])
    assert [r['method'] for r in rows][-1] == adaptive.GREEDY_AGAIN  # last in the table
    for r in range(captured['repeats']):
      rotated = order[r % len(order):] + order[:r % len(order)]
      for before, after in zip(rotated, rotated[1:]):
        assert {before, after} != {'no draft', adaptive.GREEDY_AGAIN}, (count, rotated)


def test_shuffled_rounds_give_each_method_changing_neighbours_in_seeded_orders():
  def rounds(shuffle):
    calls = []
    runs = {m: (lambda m=m: calls.append(m)) for m in 'abcde'}
    times = common.interleaved(runs, 12, shuffle=shuffle)
    assert {m: len(t) for m, t in times.items()} == dict.fromkeys('abcde', 12)
    return [calls[5 + 5 * r:10 + 5 * r] for r in range(12)]  # after the compile calls

  rotated, shuffled = rounds(False), rounds(True)
  assert rotated[1] == list('bcdea') and all(sorted(o) == list('abcde') for o in shuffled)
  assert shuffled == rounds(True)  # seeded
  for orders, neighbours in ((rotated, 1), (shuffled, 3)):  # each method's predecessors (or none)
    for m in 'abcde':
      before = {o[o.index(m) - 1] if o.index(m) else None for o in orders}
      assert len(before) >= neighbours if orders is shuffled else len(before) == 2, (m, before)


def test_confirmation_rounds_time_the_chosen_fixed_method_again_and_decide_the_goal(monkeypatch):
  """`--confirm`: after the sweep, the adaptive methods and the sweep's fastest fixed method (the
  largest of noisy medians: here gamma=2's lucky 0.8 s) run again in rounds of their own, on the
  held-out inputs' runs (their own token counts); the goal against the best fixed reads the
  median of the paired per-round ratios."""
  calls = []
  sweep = {'no draft': [1.0] * 3, 'gamma=1': [0.9] * 3, 'gamma=2': [0.8] * 3,
           'auto:optimal': [1.0] * 3, adaptive.GREEDY_AGAIN: [1.0] * 3}
  again = {'gamma=2': [1.0, 1.0, 1.2], 'auto:optimal': [0.9, 1.25, 1.1]}

  def interleaved(runs, repeats, order=(), shuffle=False):
    calls.append((sorted(runs), repeats))
    return sweep if len(calls) == 1 else again

  def result(tokens):
    class Result:
      lengths = np.array([tokens])
      target_calls = np.array([3])
      loop_iterations = np.array(3)
      accepted = proposed = np.array([1])
    return lambda: [Result()]

  monkeypatch.setattr(common, 'interleaved', interleaved)
  runs = {'no draft': result(10), 'gamma=1': result(10), 'gamma=2': result(10),
          'auto:optimal': result(11)}
  held = {'no draft': result(20), 'gamma=1': result(20), 'gamma=2': result(21),
          'auto:optimal': result(22)}
  rows = adaptive.measure_cell(
      runs, 3, {'pair': 'p', 'draft': 'd', 'batch': 1, 'temperature': 0.0}, lambda m, r: {},
      lambda m: m.startswith('gamma='), confirm=3, held_runs=held)
  assert calls[1] == (['auto:optimal', 'gamma=2'], 3)  # the adaptive method and the sweep's best
  auto = next(r for r in rows if r['method'] == 'auto:optimal')
  assert auto['x_best_fixed'] == pytest.approx((11 / 1.0) / (10 / 0.8))  # 0.88: a miss
  ratios = [(22 / 0.9) / (21 / 1.0), (22 / 1.25) / (21 / 1.0), (22 / 1.1) / (21 / 1.2)]
  assert auto['confirm_ratios'] == pytest.approx(ratios)
  assert auto['x_best_fixed_confirmed'] == pytest.approx(float(np.median(ratios)))  # 1.05
  assert auto['confirmed_best_fixed'] == 'gamma=2' and auto['confirm_held_out']
  assert auto['confirm_tokens'] == {'auto:optimal': 22, 'gamma=2': 21}
  assert all('x_best_fixed_confirmed' not in r for r in rows if r['method'] != 'auto:optimal')
  (goal,) = adaptive.goals(rows)
  assert goal['best_fixed_goal'] and goal['x_best_fixed'] < 0.95
  lines = adaptive.goal_lines({'goals': [goal], 'confirm': 3, 'examples': 8},
                                    'auto:optimal', 'fixed gamma')
  assert f'| {np.median(ratios):.3f} | met |' in lines[-1]
  assert 'on the next 8 test inputs' in '\n'.join(lines)
  calls.clear()
  adaptive.measure_cell(runs, 3, {'pair': 'p'}, lambda m, r: {},
                              lambda m: m.startswith('gamma='))
  assert len(calls) == 1  # no confirmation rounds unless asked


def test_confirmation_inputs_are_the_ones_after_the_sweeps():
  inputs = np.arange(12).reshape(6, 2)
  split = adaptive.split_held_out(inputs, 3, 5)
  np.testing.assert_array_equal(split['inputs'], inputs[:3])
  np.testing.assert_array_equal(split['held_out'], inputs[3:])
  assert adaptive.split_held_out(inputs[:3], 3, 0)['held_out'] is None
  assert [b.shape for b in adaptive.batches_of(split['held_out'], 1)] == [(1, 2)] * 3


def test_sampled_cells_decode_with_several_keys_greedy_ones_with_one():
  keys = adaptive.sampling_keys(3, 1.0)
  assert len(keys) == 3 and len({tuple(np.asarray(k).tolist()) for k in keys}) == 3
  assert len(adaptive.sampling_keys(3, 0.0)) == 1  # greedy: every key decodes alike
  with pytest.raises(SystemExit, match='--seeds'):
    adaptive.sampling_keys(0, 1.0)
  assert adaptive.seeds_words({'seeds': 1}) == ''
  assert '4 random keys' in adaptive.seeds_words({'seeds': 4})