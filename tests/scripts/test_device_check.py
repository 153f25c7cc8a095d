"""`benchmarks/device_check.py`: the budget check on its parts, a part cut by the clock, and one
real part at nano size on the CPU (the GPU run itself is results/gpu/device_check_2026-11-26/)."""

import json
import os
import subprocess
import sys
import tarfile

from benchmarks import device_check as dc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEASURED = os.path.join(REPO, 'results', 'gpu', 'device_check_2026-11-26', 'summary.json')


def test_the_default_parts_fit_one_six_minute_call():
  assert dc.estimated_total() + dc.START_S <= dc.CALL_LIMIT_S
  assert dc.estimated_total() <= dc.BUDGET_S
  for part in dc.PARTS:
    assert part.estimate_s <= part.cap_s, part.name


def test_no_estimate_is_below_what_the_part_took_on_the_gpu():
  with open(MEASURED) as f:
    measured = {r['part']: r for r in json.load(f)['parts']}
  checked = 0
  for part in dc.PARTS:
    record = measured.get(part.name)
    if record and record['status'] == 'ok':
      assert part.estimate_s >= record['seconds'] - 1, (part.name, record['seconds'])
      checked += 1
  assert checked >= 3  # decode, train, train_large ran whole there


def test_a_part_cut_by_the_clock_keeps_its_rows(tmp_path, monkeypatch):
  monkeypatch.setattr(dc, '_device', lambda: {})  # its child's JAX import would eat the clock
  fake = dc.Part('fake', 'tests.scripts.rows_then_sleep', (), (), cap_s=5, estimate_s=1,
                 goal='-')
  done = dc.Part('done', 'tests.scripts.rows_then_sleep', ('--no-sleep',), (), cap_s=5,
                 estimate_s=1, goal='-')
  out = tmp_path / 'out'
  # The first part gets its 5 s cap; after it less than MIN_PART_S is left beside the reserve.
  code = dc.bench(str(out), 'full', budget=dc.RESERVE_S + dc.MIN_PART_S + 2,
                  work=str(tmp_path / 'work'), catalogue=[fake, done])
  assert code == 1
  summary = json.loads((out / 'summary.json').read_text())
  cut, skipped = summary['parts']
  assert cut['status'].startswith('cut by the clock') and cut['rows'] == [{'row': 0}, {'row': 1}]
  assert skipped['status'].startswith('skipped')
  assert 'fake | cut by the clock' in (out / 'summary.md').read_text()
  with tarfile.open(out / 'device_check_bench.tar.gz') as tar:
    assert 'fake.log' in tar.getnames()
  assert sorted(os.listdir(out)) == ['device_check_bench.tar.gz', 'summary.json', 'summary.md']


def test_the_layouts_part_runs_at_nano_size(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, '-m', 'benchmarks.device_check', 'bench', '--size',
                         'nano', '--parts', 'layouts', '--out', str(tmp_path)], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  (record,) = json.loads((tmp_path / 'summary.json').read_text())['parts']
  assert [r['layout'] for r in record['rows']] == ['unrolled', 'scanned']
  assert all(r['step_ms'] > 0 and r['bound_ms'] > 0 for r in record['rows'])
  assert '| layouts | nano G=4 scanned' in proc.stdout  # the summary table, printed last
