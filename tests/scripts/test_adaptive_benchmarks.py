"""benchmarks/adaptive_gamma.py and adaptive_tree.py: inputs from exported tasks (the GPU machine
has no seqio), and reports written after every cell (a run its clock cuts keeps its cells)."""

import json

import numpy as np
import pytest

from benchmarks import adaptive_gamma, adaptive_tree
from gqa_spec.data import tasks


def test_exported_inputs_are_the_seqio_inputs(tiny_data_dir, tiny_gpu_export):
  exported = adaptive_gamma.task_inputs(f'exported:{tiny_gpu_export}/ddtp_translate_en_de', None,
                                        4, 32, 16)
  try:
    seqio = adaptive_gamma.task_inputs('ddtp_translate_en_de', tiny_data_dir, 4, 32, 16)
  finally:
    tasks.register_ddtp_tasks()  # back to the default data dir for other modules
  assert exported.shape == (4, 32) and exported.dtype == np.int32
  np.testing.assert_array_equal(exported, seqio)
  assert (exported[:, 0] > 1).all()  # real tokens, not padding or EOS
  with pytest.raises(SystemExit, match='1000000 asked for'):
    adaptive_gamma.task_inputs(f'exported:{tiny_gpu_export}/ddtp_translate_en_de', None,
                               10 ** 6, 32, 16)


def test_inputs_read_the_splits_in_turn(tiny_data_dir, tiny_gpu_export):
  """--splits test,validation: every test input first, then the validation split's, from seqio and
  from an export alike; too few in all is a clear error."""
  task = f'exported:{tiny_gpu_export}/ddtp_translate_en_de'
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  (exp,), _ = exported.resolve(task)
  n_test = exp.num_examples('test')
  test = adaptive_gamma.task_inputs(task, None, n_test, 32, 16)
  validation = adaptive_gamma.task_inputs(task, None, 2, 32, 16, ('validation',))
  both = adaptive_gamma.task_inputs(task, None, n_test + 2, 32, 16, ('test', 'validation'))
  np.testing.assert_array_equal(both, np.concatenate([test, validation]))
  try:
    seqio = adaptive_gamma.task_inputs('ddtp_translate_en_de', tiny_data_dir, n_test + 2, 32, 16,
                                       ('test', 'validation'))
  finally:
    tasks.register_ddtp_tasks()
  np.testing.assert_array_equal(seqio, both)
  with pytest.raises(SystemExit, match=r'test\+validation'):
    adaptive_gamma.task_inputs(task, None, 10 ** 6, 32, 16, ('test', 'validation'))


def _row(method, seconds):
  return {'pair': 'p', 'task': 't', 'draft': 'd', 'batch': 1, 'temperature': 0.0,
          'method': method, 'seconds': seconds, 'tokens': 10, 'tokens_per_second': 10 / seconds,
          'tokens_per_call': 1.0, 'x_greedy': 0.1 / seconds, 'x_best_fixed': 0.2 / seconds,
          'cost_ratio': None, 'verify_ratio': None}


@pytest.mark.parametrize('module,auto,fixed', [
    (adaptive_gamma, 'auto:optimal', 'gamma=1'),
    (adaptive_tree, 'best:auto:16,depth:4', 'best:2,depth:4')])
def test_a_cut_run_keeps_its_cells(module, auto, fixed, tmp_path, monkeypatch):
  def measure(args, on_cell):  # one cell measured, then the clock's kill
    rows = [_row('no draft', 0.1), _row(fixed, 0.2),
            dict(_row(auto, 0.1), cost_ratio=0.5, verify_ratio=[1.5], alpha_init=0.3,
                 calibration_seconds=1.0, gamma_histogram=[1, 0], draft_steps_saved=0,
                 nodes_histogram=[1, 0]),
            _row(adaptive_gamma.GREEDY_AGAIN, 0.1)]
    on_cell(rows)
    raise KeyboardInterrupt

  monkeypatch.setattr(module, 'measure', measure)
  out = str(tmp_path / 'r')
  argv = ['--out', out] + (['--pair', 'p', 'T', 'D', 'exported:/x/t'] if module is adaptive_tree
                           else [])
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

  monkeypatch.setattr(adaptive_gamma, 'interleaved', interleaved)
  for count in range(3, 12):  # greedy decoding and 2..10 other methods (with 1, every pair of
    # three neighbours somewhere in the rotation)
    runs = {'no draft': lambda: [Result()]}
    runs.update({f'gamma={g}': (lambda: [Result()]) for g in range(1, count)})
    rows = adaptive_gamma.measure_cell(runs, 5, {'pair': 'p'}, lambda m, r: {},
                                       lambda m: m.startswith('gamma='))
    order = captured['order']
    assert sorted(order) == sorted(list(runs) + [adaptive_gamma.GREEDY_AGAIN])
    assert [r['method'] for r in rows][-1] == adaptive_gamma.GREEDY_AGAIN  # last in the table
    for r in range(captured['repeats']):
      rotated = order[r % len(order):] + order[:r % len(order)]
      for before, after in zip(rotated, rotated[1:]):
        assert {before, after} != {'no draft', adaptive_gamma.GREEDY_AGAIN}, (count, rotated)


def test_shuffled_rounds_give_each_method_changing_neighbours_in_seeded_orders():
  def rounds(shuffle):
    calls = []
    runs = {m: (lambda m=m: calls.append(m)) for m in 'abcde'}
    times = adaptive_gamma.interleaved(runs, 12, shuffle=shuffle)
    assert {m: len(t) for m, t in times.items()} == dict.fromkeys('abcde', 12)
    return [calls[5 + 5 * r:10 + 5 * r] for r in range(12)]  # after the compile calls

  rotated, shuffled = rounds(False), rounds(True)
  assert rotated[1] == list('bcdea') and all(sorted(o) == list('abcde') for o in shuffled)
  assert shuffled == rounds(True)  # seeded
  for orders, neighbours in ((rotated, 1), (shuffled, 3)):  # each method's predecessors (or none)
    for m in 'abcde':
      before = {o[o.index(m) - 1] if o.index(m) else None for o in orders}
      assert len(before) >= neighbours if orders is shuffled else len(before) == 2, (m, before)


def test_the_alpha_memory_simulation_scores_the_library_policy(tmp_path):
  """benchmarks/alpha_memory.py on a few short sequences: every scenario and form has a row, a
  draft that never pays (alpha 0.40 at these costs) leaves the policy on plain steps (exactly
  1 token per step), and the fixed gammas' best is what the form rows are scored against."""
  from benchmarks import alpha_memory
  out = tmp_path / 'am'
  assert alpha_memory.main(['--lengths', '16', '--sequences', '40', '--offsets', '0',
                            '--out', str(out)]) == 0
  rows = json.loads((tmp_path / 'am.json').read_text())['rows']
  assert len(rows) == len(alpha_memory.SCENARIOS) * len(alpha_memory.FORMS)
  for r in rows:
    best = r['best_fixed_tokens_per_step']
    assert r['x_best_fixed'] == pytest.approx(r['tokens_per_step'] / best, rel=1e-3)
  low = [r for r in rows if r['scenario'] == 'alpha 0.40']
  assert all(r['tokens_per_step'] == 1.0 for r in low)
  high = [r for r in rows if r['scenario'] == 'alpha 0.85']
  assert all(r['tokens_per_step'] > 1.3 and r['best_fixed_gamma'] >= 4 for r in high)
  assert '| per position + prior |' in (tmp_path / 'am.md').read_text()


def test_the_overhead_benchmark_holds_the_optimal_policy_at_the_fixed_gamma(tmp_path):
  """benchmarks/adaptive_overhead.py compares like with like: the optimal policy held at gamma
  takes exactly the loop iterations of the fixed policy and of `speculative.decode` at that gamma
  (greedy, the same proposals), greedy decoding one per token, and each line fits its points;
  `--methods` picks loops (greedy always, in the benchmark's order), a name it lacks is an error."""
  from benchmarks import adaptive_overhead
  out = tmp_path / 'ao'
  adaptive_overhead.main(['--preset', 'nano', '--lengths', '4,6', '--gamma', '2', '--repeats', '1',
                          '--methods', 'held,speculative,onewidth,fixed', '--out', str(out)])
  result = json.loads((tmp_path / 'ao.json').read_text())
  rows = {r['method']: r for r in result['rows']}
  assert list(rows) == ['greedy decoding', 'speculative.decode, gamma 2', "auto, policy 'fixed' at 2",
                        "auto, policy 'fixed' at 2, one width",
                        "auto, policy 'optimal' held at 2 (the calibration's program)"]
  assert rows["auto, policy 'fixed' at 2, one width"]['iterations'] == rows[
      "auto, policy 'fixed' at 2"]['iterations']
  assert result['complete']
  with pytest.raises(SystemExit):
    adaptive_overhead.main(['--methods', 'fixed,bogus', '--out', str(tmp_path / 'x')])
  assert rows['greedy decoding']['iterations'] == [4, 6]
  held = rows["auto, policy 'optimal' held at 2 (the calibration's program)"]['iterations']
  assert held == rows["auto, policy 'fixed' at 2"]['iterations']
  assert held == rows['speculative.decode, gamma 2']['iterations']
  for r in rows.values():  # two points: the line goes through both
    for n, t in zip(r['iterations'], r['seconds']):
      assert r['intercept_ms'] / 1e3 + r['slope_us'] / 1e6 * n == pytest.approx(t, rel=1e-6)
  assert '| per call ms |' in (tmp_path / 'ao.md').read_text()


def test_the_plain_path_benchmark_times_one_computation_in_each_variant(tmp_path):
  """benchmarks/plain_path.py: every variant decodes greedy decoding's tokens and makes the same
  length statistics (auto's, `plain_steps.plain_decode`'s, are the reference), and the rows name
  every variant at every batch, greedy decoding's difference from itself 0."""
  import jax.numpy as jnp
  from benchmarks import plain_path, workloads
  from gqa_spec.decoding.targets import T5Decoder
  from gqa_spec.models.config import preset
  from gqa_spec.models.t5 import Transformer
  model = Transformer(preset('nano'))
  target = T5Decoder(model)
  enc = jnp.asarray(workloads.synthetic_inputs(2, 8, model.config.vocab_size, seed=0))
  state = target.init(workloads.random_params(model), enc, 5)
  runs = plain_path.variants(target, state, 4)
  auto = runs['auto']()
  assert auto.gamma_histogram.shape == (2, plain_path.GAMMA_MAX + 1)
  for name, run in runs.items():
    out = run()
    r = out if name in ('greedy', 'auto') else out[0]
    np.testing.assert_array_equal(r.sequences[:, :5], auto.sequences[:, :5])
    if name not in ('greedy', 'auto', 'greedy + identity'):
      np.testing.assert_array_equal(out[1], auto.gamma_histogram)
      np.testing.assert_array_equal(out[2], auto.gamma_trace)
  plain_path.main(['--preset', 'nano', '--batches', '1,2', '--length', '4', '--input-length', '8',
                   '--rounds', '2', '--shuffle', '--out', str(tmp_path / 'pp')])
  rows = json.loads((tmp_path / 'pp.json').read_text())['rows']
  assert [(r['batch'], r['variant']) for r in rows] == [(b, v) for b in (1, 2) for v in runs]
  assert all(r['over_greedy_us'] == 0 for r in rows if r['variant'] == 'greedy')
  assert 'a new random order every round' in (tmp_path / 'pp.md').read_text()


def test_the_loop_kernels_benchmark_reads_each_loop_body_from_the_compiled_program(tmp_path):
  """benchmarks/loop_kernels.py: greedy decoding and `speculative.decode` compile to one while
  loop; the adaptive loops to an outer loop holding one loop per verification width (at gamma_max
  2: widths 1 and 2; the one-width loop: one), each with the sampler's own small loop nested, then
  the plain steps' loop, greedy decoding's step; every width's body has the target's matmuls and
  no copy of the cache; the policy held at gamma keeps its choice in the program (the held flag
  is an argument, not a folded constant)."""
  from benchmarks import loop_kernels
  loop_kernels.main(['--preset', 'nano', '--length', '6', '--input-length', '8', '--gamma', '2',
                     '--methods', 'greedy,speculative,fixed,onewidth,held', '--out',
                     str(tmp_path / 'lk')])
  rows = json.loads((tmp_path / 'lk.json').read_text())['rows']
  by = {}
  for r in rows:
    by.setdefault(r['method'], []).append(r)
  assert [len(by[m]) for m in by] == [1, 1, 6, 4, 6]
  (greedy,), (spec,), fixed, one, held = by.values()
  widths = lambda loops: [r for r in loops if r['depth'] == 1]
  assert [r['by_category'].get('control', 0) for r in (fixed[0], one[0], held[0])] == [2, 1, 2]
  assert len(widths(fixed)) == len(widths(held)) == 2 and len(widths(one)) == 1
  for r in [spec] + widths(fixed) + widths(one) + widths(held):
    assert r['by_category'].get('matmul', 0) > 0 and r['cache_copies'] == 0, r
  # the optimal policy's choice, made and not taken, at each width
  assert all(h['kernels'] > f['kernels'] for h, f in zip(widths(held), widths(fixed)))
  for loops in (fixed, one, held):  # the plain steps: greedy's step
    assert (loops[-1]['depth'], loops[-1]['kernels']) == (0, greedy['kernels'])
  assert '| kernels |' in (tmp_path / 'lk.md').read_text()
  assert '| cache copies |' in (tmp_path / 'lk.md').read_text()


def test_the_guard_benchmark_runs_generates_batches_and_keeps_its_tokens(tmp_path, tiny_gpu_export):
  """benchmarks/guard.py on a tiny pair (one checkpoint as target and as draft: alpha 1) over an
  exported task: its three methods per cell, greedy outputs' tokens in every one (temperature 0:
  exact whichever calls speculated), and the guarded rows' decisions, one per round."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from benchmarks import guard as guard_benchmark  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.config import T5Config  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  config = T5Config(vocab_size=512, emb_dim=16, num_heads=2, num_kv_heads=2, head_dim=8,
                    mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1)
  tokens = jnp.ones((1, 3), jnp.int32)
  params = jax.jit(lambda: Transformer(config).init(jax.random.PRNGKey(0), tokens, tokens, tokens,
                                                    enable_dropout=False)['params'])()
  ckpt = str(tmp_path / 'ckpt')
  native.save_checkpoint(ckpt, config, jax.tree.map(np.asarray, params))
  out = tmp_path / 'g'
  assert guard_benchmark.main([
      '--pair', 'tiny', ckpt, ckpt, f'exported:{tiny_gpu_export}/ddtp_translate_en_de',
      '--examples', '3', '--batches', '1', '--temperatures', '0', '--repeats', '2',
      '--gamma-max', '2', '--max-decode-len', '6', '--input-length', '32',
      '--out', str(out)]) == 0
  rows = json.loads((tmp_path / 'g.json').read_text())['rows']
  assert [r['method'] for r in rows] == list(guard_benchmark.METHODS)
  assert len({r['tokens'] for r in rows}) == 1 and rows[0]['calls'] == 3
  auto = rows[-1]
  if auto['speculated']:  # the measured costs decide it: the draft costs what the target does
    assert len(auto['guard_rounds']) == 2
    assert all(d['speculative_calls'] + d['plain_calls'] == 3 for d in auto['guard_rounds'])
  else:
    assert auto['guard_rounds'] == []
  assert '| auto |' in (tmp_path / 'g.md').read_text()


def test_confirmation_rounds_time_the_chosen_fixed_method_again_and_decide_the_goal(monkeypatch):
  """`--confirm`: after the sweep, the adaptive methods and the sweep's fastest fixed method (the
  largest of noisy medians: here gamma=2's lucky 0.8 s) run again in rounds of their own, on the
  held-out inputs' runs (their own token counts); the goal against the best fixed reads the
  median of the paired per-round ratios."""
  calls = []
  sweep = {'no draft': [1.0] * 3, 'gamma=1': [0.9] * 3, 'gamma=2': [0.8] * 3,
           'auto:optimal': [1.0] * 3, adaptive_gamma.GREEDY_AGAIN: [1.0] * 3}
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

  monkeypatch.setattr(adaptive_gamma, 'interleaved', interleaved)
  runs = {'no draft': result(10), 'gamma=1': result(10), 'gamma=2': result(10),
          'auto:optimal': result(11)}
  held = {'no draft': result(20), 'gamma=1': result(20), 'gamma=2': result(21),
          'auto:optimal': result(22)}
  rows = adaptive_gamma.measure_cell(
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
  (goal,) = adaptive_gamma.goals(rows)
  assert goal['best_fixed_goal'] and goal['x_best_fixed'] < 0.95
  lines = adaptive_gamma.goal_lines({'goals': [goal], 'confirm': 3, 'examples': 8},
                                    'auto:optimal', 'fixed gamma')
  assert f'| {np.median(ratios):.3f} | met |' in lines[-1]
  assert 'on the next 8 test inputs' in '\n'.join(lines)
  calls.clear()
  adaptive_gamma.measure_cell(runs, 3, {'pair': 'p'}, lambda m, r: {},
                              lambda m: m.startswith('gamma='))
  assert len(calls) == 1  # no confirmation rounds unless asked


def test_confirmation_inputs_are_the_ones_after_the_sweeps():
  inputs = np.arange(12).reshape(6, 2)
  split = adaptive_gamma.split_held_out(inputs, 3, 5)
  np.testing.assert_array_equal(split['inputs'], inputs[:3])
  np.testing.assert_array_equal(split['held_out'], inputs[3:])
  assert adaptive_gamma.split_held_out(inputs[:3], 3, 0)['held_out'] is None
  assert [b.shape for b in adaptive_gamma.batches_of(split['held_out'], 1)] == [(1, 2)] * 3


def test_sampled_cells_decode_with_several_keys_greedy_ones_with_one():
  keys = adaptive_gamma.sampling_keys(3, 1.0)
  assert len(keys) == 3 and len({tuple(np.asarray(k).tolist()) for k in keys}) == 3
  assert len(adaptive_gamma.sampling_keys(3, 0.0)) == 1  # greedy: every key decodes alike
  with pytest.raises(SystemExit, match='--seeds'):
    adaptive_gamma.sampling_keys(0, 1.0)
  assert adaptive_gamma.seeds_words({'seeds': 1}) == ''
  assert '4 random keys' in adaptive_gamma.seeds_words({'seeds': 4})


def test_batch_spread_prices_and_summarises():
  """benchmarks/batch_spread.py: the price of one row is Wald's (l + overshoot) / Eq. 1 (no wait
  for other rows); the summary's spread and errors are those of the batches' counts."""
  from benchmarks import batch_spread  # pylint: disable=g-import-not-at-top
  # alpha 0.5, gamma 1: tokens a call 1 or 2, mean 1.5, E[X^2] 2.5, overshoot (2.5 - 1.5) / 3
  assert batch_spread.price(0.5, 1, ((10.0,),), 8) == pytest.approx((10 + 1 / 3) / 1.5)
  # 8 rows wait for the slowest: more than one row's price
  assert batch_spread.price(0.5, 1, ((10.0,) * 8,), 8) > batch_spread.price(0.5, 1, ((10.0,),), 8)
  rows = [{'pair': 'p', 'lengths': [10, 8], 'greedy_iterations': 10,
           'gamma=1': {'iterations': 7, 'acceptance': 0.5}},
          {'pair': 'p', 'lengths': [10, 10], 'greedy_iterations': 10,
           'gamma=1': {'iterations': 8, 'acceptance': 0.6}}]
  [s] = batch_spread.summary(rows, 8)
  assert s['iterations_mean'] == 7.5 and s['iterations_sd'] == pytest.approx(np.sqrt(0.5))
  assert s['speed_spread'] == pytest.approx(8 / 7)
  own = [batch_spread.price(0.5, 1, ((8.0, 10.0),), 8) / 7 - 1,
         batch_spread.price(0.6, 1, ((10.0, 10.0),), 8) / 8 - 1]
  assert s['own_mean_error'] == pytest.approx(np.mean(own))
  assert s['first_error'] == pytest.approx(own[0] * 7 / 7.5 + 7 / 7.5 - 1)
  assert s['all_error'] == pytest.approx(
      batch_spread.price(0.55, 1, ((8.0, 10.0), (10.0, 10.0)), 8) / 7.5 - 1)
