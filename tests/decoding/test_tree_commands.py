"""`gqa-spec generate --tree` end to end on the tiny checkpoint of `test_commands.py`."""

import pytest

from gqa_spec import cli
from tests.decoding.test_commands import _generate, fire_guard, workdir  # pylint: disable=unused-import


def test_greedy_trees_give_the_autoregressive_outputs(workdir):  # pylint: disable=redefined-outer-name
  ref, _ = _generate(workdir, 'ar_tree_ref')
  out, _ = _generate(workdir, 'tree_bigram', '--draft', 'bigram:' + str(workdir / 'bigram.npz'),
                     '--tree', 'topk:2,2')
  assert out == ref
  for name, spec in [('tree_topk', 'topk:2,1'), ('tree_best', 'best:4,depth:2,width:2')]:
    out, stats = _generate(workdir, name, '--draft', str(workdir / 'ckpt'), '--tree', spec)
    assert out == ref, name
    assert stats['tree'] == spec
    assert stats['gamma'] is None and len(stats['accept_histogram']) == 3
    assert sum(stats['accept_histogram']) == stats['target_calls']
    assert stats['accepted_per_position'] == [stats['target_calls']] * 2  # self draft: all


def test_adaptive_trees_give_the_autoregressive_outputs_and_report_node_counts(workdir):  # pylint: disable=redefined-outer-name
  ref, _ = _generate(workdir, 'ar_auto_tree_ref')
  # Costs measured on the first batch (cost_calibration.measure_costs), a model draft (the target).
  out, stats = _generate(workdir, 'auto_tree', '--draft', str(workdir / 'ckpt'), '--tree',
                         'best:auto:4,depth:2,width:2')
  assert out == ref
  assert stats['tree'].startswith('best:auto:4,depth:2,width:2 (c=')
  assert stats['cost_ratio_measured'] and stats['cost_ratio'] > 0 and stats['calibration_seconds'] > 0
  assert stats['tree_node_widths'] == [1, 2, 4] and len(stats['verify_ratio']) == 3
  assert stats['alpha_init'] == 1.0  # the draft is the target: its top node is always right
  assert sum(stats['tree_nodes_histogram']) == stats['target_calls']
  per_row = stats['tree_nodes_per_call_per_row']
  assert len(per_row) == 3  # dummy rows left out
  # Whether a tree pays at alpha 1 depends on this machine's measured c and v: where it does, every
  # row's first call is the measured prior's choice (the loop accepted at most D = 2 draft tokens
  # a call at each width), else the largest tree (the chain prior); where not, greedy decoding ran
  # from the start.
  prior = stats['tree_accepted_init']
  assert prior is None or (len(prior) == 3 and all(0 <= a <= 2 for a in prior)), prior
  first = {t[0] for t in per_row}
  assert len(first) == 1 and (first <= {1, 2, 4} if stats['speculated'] else first == {0}), first
  assert prior is not None or not stats['speculated'] or first == {4}
  assert stats['speculated'] or all(set(t) == {0} for t in per_row)
  assert [sum(h) for h in stats['tree_nodes_histogram_per_row']] == list(map(len, per_row))
  assert list(map(len, stats['tree_nodes_verified_per_call_per_row'])) == list(map(len, per_row))
  # A bigram tree draft with c given (v = 1, alpha 0.9): the prior pays, the first calls verify
  # the largest tree; the same tokens.
  out, stats = _generate(workdir, 'auto_tree_bigram', '--draft',
                         'bigram:' + str(workdir / 'bigram.npz'), '--tree', 'best:auto,depth:2,width:2',
                         '--cost-ratio', '0.01')
  assert out == ref and stats['tree'].startswith('best:auto:6,depth:2,width:2 (c=0.01,v=1)')
  assert not stats['cost_ratio_measured'] and stats['cost_ratio'] == 0.01
  assert stats['calibration_seconds'] is None
  assert stats['speculated'] and stats['alpha_init'] == 0.9
  assert all(t[0] == 6 for t in stats['tree_nodes_per_call_per_row'])


def test_sampling_tree_runs(workdir):  # pylint: disable=redefined-outer-name
  out, stats = _generate(workdir, 'tree_sample', '--draft', str(workdir / 'ckpt'), '--tree',
                         'topk:2,2', '--temperature', '1', '--top-p', '0.9', '--seed', '1')
  assert len(out) == 3 and stats['acceptance_rate'] is not None


def test_adaptive_tree_guard_turns_to_greedy_decodings_program(workdir, monkeypatch):  # pylint: disable=redefined-outer-name
  """The guard (tests/decoding/test_commands.py's chain case) on `--tree best:auto`: a calibration
  that pays for trees with a greedy step priced at 1e-12 s; the second call is a plain probe."""
  fire_guard(monkeypatch)
  ref, _ = _generate(workdir, 'tree_guard_ref', '--batch-size', '1')
  out, stats = _generate(workdir, 'tree_guard', '--batch-size', '1', '--draft',
                         'bigram:' + str(workdir / 'bigram.npz'), '--tree',
                         'best:auto:4,depth:2,width:2')
  assert out == ref and stats['speculated'] and stats['guard']['plain_calls'] >= 1
  per_row = stats['tree_nodes_per_call_per_row']  # one row a batch: row i is call i
  assert per_row[0][0] == 4 and set(per_row[1]) == {0}


@pytest.mark.parametrize('extra, message', [
    (['--tree', 'topk:0'], 'branching'),
    (['--tree', 'best:3'], 'tree must be'),
    (['--tree', 'topk:2'], '--tree needs a --draft'),
    (['--tree', 'topk:2', '--draft', 'copy'], 'model draft'),
    (['--tree', 'best:99,depth:2,width:2', '--draft', 'copy'], 'budget'),
    (['--tree', 'best:auto:9,depth:2,width:2', '--draft', 'copy'], 'budget'),
    (['--tree', 'best:auto,width:2', '--draft', 'copy'], 'adaptive tree must be'),
    (['--tree', 'best:auto:4,depth:2', '--draft', 'copy'], 'model draft'),
    (['--tree', 'best:auto:4,depth:2', '--draft', '.', '--gamma', 'auto'],
     '--gamma auto is not supported with --tree best:auto'),
    (['--tree', 'best:auto:4,depth:2', '--draft', '.', '--gamma-policy', 'heuristic'],
     '--gamma-policy needs --gamma auto'),
    (['--tree', 'best:auto:4,depth:2', '--draft', '.', '--stage2', 'bigram:x.npz'],
     '--stage2 is not supported with --tree best:auto'),
    (['--tree', 'best:auto:4,depth:2', '--draft', '.', '--draft-confidence', '0.5'],
     '--draft-confidence needs --gamma auto'),
    (['--tree', 'best:auto:4,depth:2', '--draft', '.', '--model-parallel', '1'],
     '--tree best:auto is not supported with --model-parallel'),
    (['--tree', 'topk:2', '--draft', '.', '--gamma', '3'],
     '--gamma needs a chain --draft (not --tree)'),
    (['--tree', 'topk:2', '--draft', '.', '--lenience', '0.5'],
     '--lenience needs a chain --draft (not --tree)'),
    (['--tree', 'topk:2', '--draft', '.', '--stage2-gamma', '2'], '--stage2-gamma needs --stage2'),
    (['--tree', 'best:auto:4,depth:65', '--draft', '.'],
     '--tree depth 65 is more than --max-decode-len 64'),
    (['--tree', 'best:auto:4,depth:2', '--draft', '.', '--cost-ratio', '-1'],
     'cost ratio must be >= 0'),
    (['--tree', 'topk:2', '--draft', '.', '--cost-ratio', '1'],
     '--cost-ratio needs --gamma auto or --tree best:auto'),
])
def test_bad_tree_arguments_are_one_line_errors(workdir, capsys, extra, message):  # pylint: disable=redefined-outer-name
  argv = ['generate', '--model', str(workdir / 'ckpt'), '--inputs', str(workdir / 'in.jsonl'),
          '--out', str(workdir / 'x.jsonl'), *extra]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('gqa-spec: error:') and message in err and '\n' not in err


def test_staged_draft_gives_the_autoregressive_outputs(workdir):  # pylint: disable=redefined-outer-name
  ref, _ = _generate(workdir, 'ar_staged_ref')
  out, stats = _generate(workdir, 'staged', '--draft', str(workdir / 'ckpt'), '--gamma', '3',
                         '--stage2', 'bigram:' + str(workdir / 'bigram.npz'), '--stage2-gamma', '2')
  assert out == ref
  assert stats['stage2'].startswith('bigram:') and stats['stage2_gamma'] == 2
  assert stats['acceptance_rate'] == 1.0  # the target is its own draft


def test_staged_tree_gives_the_autoregressive_outputs(workdir):  # pylint: disable=redefined-outer-name
  ref, _ = _generate(workdir, 'ar_staged_tree_ref')
  out, stats = _generate(workdir, 'staged_tree', '--draft', str(workdir / 'ckpt'), '--tree',
                         'topk:2,1,1', '--stage2', 'bigram:' + str(workdir / 'bigram.npz'),
                         '--stage2-gamma', '2')
  assert out == ref
  assert stats['tree'] == 'topk:2,1,1' and stats['stage2_gamma'] == 2
  assert stats['draft'].startswith('staged tree')
  assert stats['accepted_per_position'] == [stats['target_calls']] * 3  # self draft: all
  assert 0 < stats['draft_calls']


@pytest.mark.parametrize('extra, message', [
    (['--stage2', 'bigram:x.npz'], 'needs a model --draft'),
    (['--stage2', 'bigram:x.npz', '--tree', 'topk:2', '--draft', 'copy'], 'model draft'),
    (['--stage2', 'bigram:x.npz', '--tree', 'topk:2', '--draft', 'chimera:.'], 'model draft'),
    (['--stage2', 'bigram:x.npz', '--draft', 'copy'], 'model draft'),
    (['--stage2', 'unigram:x.npz', '--draft', '.'], '--stage2 must be bigram'),
])
def test_bad_stage2_arguments_are_one_line_errors(workdir, capsys, extra, message):  # pylint: disable=redefined-outer-name
  argv = ['generate', '--model', str(workdir / 'ckpt'), '--inputs', str(workdir / 'in.jsonl'),
          '--out', str(workdir / 'x.jsonl'), *extra]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('gqa-spec: error:') and message in err and '\n' not in err
