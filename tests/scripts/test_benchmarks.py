"""The benchmark entry points at tiny sizes: each writes its table, where `--out` says or else under
the run directory (never into the committed results/), and none replaces a result file holding
more rows unless `--force`."""

import json
import os

import pytest

from benchmarks import adaptive, common, decode, speculative, train_step

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _result(path):
  with open(path + '.json') as f:
    return json.load(f)


def _result_of(rows):
  return {'command': 'c', 'rows': [{'r': i} for i in range(rows)],
          'machine': common.machine()}


def test_without_out_a_benchmark_writes_under_the_run_directory(tmp_path, monkeypatch):
  monkeypatch.setenv('GQA_SPEC_BENCH_DIR', str(tmp_path / 'runs'))
  committed = os.path.join(REPO, 'results', 'benchmarks')
  before = {n: os.path.getmtime(os.path.join(committed, n)) for n in os.listdir(committed)}
  decode.main(['--presets', 'nano', '--kv', 'mqa,mha', '--batch', '2', '--input-length', '16',
               '--steps', '2', '--repeats', '1', '--dtype', 'bfloat16'])
  out = str(tmp_path / 'runs' / 'decode')
  rows = _result(out)['rows']
  assert [(r['kind'], r['kv_heads'], r['batch']) for r in rows] == [('step', 1, 2), ('step', 4, 2)]
  assert all(r['step_ms'] > 0 and r['bound_ms'] > 0 for r in rows)
  assert '| nano (bfloat16) | 1 | unrolled | 16 | 2 |' in open(out + '.md').read()
  assert {n: os.path.getmtime(os.path.join(committed, n)) for n in os.listdir(committed)} == before


def test_out_says_where_the_result_goes(tmp_path):
  out = str(tmp_path / 'deep' / 'train')
  train_step.main(['--preset', 'nano', '--settings', 'finetune', '--batch', '2', '--steps', '1',
                   '--out', out])
  (row,) = _result(out)['rows']
  assert row['setting'] == 'finetune' and row['tokens_per_s'] > 0 and row['fraction_of_peak'] > 0
  assert '| finetune (nano) |' in open(out + '.md').read()
  assert sorted(os.listdir(tmp_path / 'deep')) == ['train.json', 'train.md']


def test_a_result_with_fewer_rows_replaces_one_only_with_force(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv('GQA_SPEC_BENCH_DIR', str(tmp_path / 'runs'))
  out = str(tmp_path / 'r')
  common.write_report(out, _result_of(3), ['# three'])
  with pytest.raises(SystemExit) as e:
    common.write_report(out, _result_of(2), ['# two'])
  assert e.value.code == 1
  assert 'holds 3 rows and this run 2: not replaced' in capsys.readouterr().err
  assert len(_result(out)['rows']) == 3 and open(out + '.md').read().startswith('# three')
  assert len(_result(str(tmp_path / 'runs' / 'refused' / 'r'))['rows']) == 2  # kept aside
  common.write_report(out, _result_of(2), ['# two'], partial=True)  # a run's own cell-by-cell
  assert len(_result(out)['rows']) == 3  # write skips, it does not stop the run
  common.write_report(out, _result_of(4), ['# four'])  # more rows: replaced
  assert len(_result(out)['rows']) == 4
  common.write_report(out, _result_of(1), ['# one'], force=True)
  assert len(_result(out)['rows']) == 1 and open(out + '.md').read().startswith('# one')


def test_speculative_writes_every_method_family(tmp_path):
  out = str(tmp_path / 'spec')
  speculative.main(['--batch-sizes', '1', '--temperatures', '0', '--num-examples', '1',
                    '--max-decode-len', '4', '--input-length', '8', '--gammas', '2',
                    '--gamma-max', '2', '--trees', 'topk:2,1', '--staged-trees', 'topk:2,1',
                    '--repeats', '1', '--out', out])
  result = _result(out)
  methods = [r['method'] for r in result['rows']]
  assert methods == ['greedy', 'chain gamma=2', 'auto', 'tree topk:2,1',
                     'staged gamma=2, bigram 3/call', 'staged tree topk:2,1, bigram 3/node',
                     'chimera gamma=2']
  assert result['complete'] and all(r['tokens_equal_greedy'] for r in result['rows'])
  assert 'speedup_thm8' in result['rows'][1]
  assert '| chimera gamma=2 | 0 | 1 |' in open(out + '.md').read()


def test_adaptive_writes_its_cells_and_goals(tmp_path):
  out = str(tmp_path / 'auto')
  adaptive.main(['--drafts', 'perturbed', '--batches', '1', '--temperatures', '0',
                 '--examples', '1', '--gammas', '1,2', '--gamma-max', '2',
                 '--max-decode-len', '4', '--input-length', '8', '--repeats', '1', '--out', out])
  result = _result(out)
  assert [r['method'] for r in result['rows']] == [
      'no draft', 'gamma=1', 'gamma=2', 'auto:optimal', 'auto:heuristic', adaptive.GREEDY_AGAIN]
  (goal,) = result['goals']
  assert goal['best_fixed'] in ('gamma=1', 'gamma=2') and result['complete']
  assert '## Goals' in open(out + '.md').read()
