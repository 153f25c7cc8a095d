"""`benchmarks/device_check.sh study` (the study half of `benchmarks/device_check.py`): the budget check on its
stage estimates, a run the clock stops at once, and the whole gpu reproduction at nano size on the
CPU from exported tasks, with the summary and the archive a device call brings back."""

import json
import os
import subprocess
import sys
import tarfile

from benchmarks import device_check as dc
from gqa_spec.reproduce import presets
from gqa_spec.reproduce.stages import STAGES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_study_fits_one_six_minute_call():
  assert dc.study_estimated_total() + dc.START_S <= dc.CALL_LIMIT_S
  assert dc.study_estimated_total() <= dc.BUDGET_S
  # every stage the preset runs has an estimate; the drafts stage is skipped (trained_drafts),
  # and the premise stage only records that the preset has no pair
  assert set(dc.STAGE_ESTIMATE_S) == {'setup', *STAGES} - {'drafts', 'premise'}
  assert not presets.get('gpu').trained_drafts and presets.get('gpu').premise is None


def test_no_estimate_is_below_what_the_stage_took_on_the_gpu():
  """Against the committed H200 run (call 3), its seconds scaled by the steps the preset now
  takes where they changed (a lower bound: compiles do not shrink with the steps)."""
  call = os.path.join(REPO, 'results', 'gpu', 'device_study_2026-11-26', 'call3')
  with open(os.path.join(call, 'summary.json')) as f:
    measured = json.load(f)
  with open(os.path.join(call, 'results', 'preset.json')) as f:
    then = json.load(f)
  now = presets.get('gpu')
  scale = {'pretrain': now.pretrain_steps / then['pretrain_steps'],
           'finetune': now.finetune_steps / then['finetune_steps']}
  checked = 0
  for stage, seconds in measured['stages'].items():
    if stage in dc.STAGE_ESTIMATE_S and seconds:
      assert dc.STAGE_ESTIMATE_S[stage] >= seconds * scale.get(stage, 1.0) - 1, stage
      checked += 1
  assert checked == 3  # pretrain, uptrain, finetune ran whole there
  assert dc.STAGE_ESTIMATE_S['setup'] >= measured['setup_s']


def _study(tmp_path, exported, budget, *extra):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  out = tmp_path / 'out'
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.device_check', 'study', '--size', 'nano', '--exported',
       exported, '--out', str(out), '--work', str(tmp_path / 'work'), '--budget', str(budget),
       *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  summary = json.loads((out / 'summary.json').read_text())
  with tarfile.open(out / 'device_check_study.tar.gz') as tar:
    names = tar.getnames()
  assert sorted(os.listdir(out)) == ['device_check_study.tar.gz', 'summary.json', 'summary.md']
  return proc, summary, names, (out / 'summary.md').read_text()


def test_a_study_the_clock_stops_still_leaves_its_summary(tiny_gpu_export, tmp_path):
  # 1 s of reproduction: it stops itself (exit 75) or is killed GRACE_S later, before fine-tuning
  proc, summary, names, md = _study(tmp_path, tiny_gpu_export, dc.STUDY_RESERVE_S + dc.GRACE_S + 1)
  assert proc.returncode == 1, proc.stdout[-2000:]
  assert (summary['status'], summary['status_text']) in (
      (75, 'stopped by its time limit'), (None, summary['status_text']))
  assert summary['status'] == 75 or summary['status_text'].startswith('killed after')
  assert 'finetune' not in summary['stages'] and 'study.log' in names
  assert f"| finetune | - ({dc.STAGE_ESTIMATE_S['finetune']}) | not reached |" in md


def test_the_study_runs_whole_at_nano_size(tiny_gpu_export, tmp_path):
  proc, summary, names, md = _study(tmp_path, tiny_gpu_export, 900)
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert summary['status'] == 0 and summary['status_text'] == 'finished'
  assert set(STAGES) <= set(summary['stages'])
  goals = {g['what'].split(' (')[0]: g for g in summary['goals']}
  assert set(goals) == {'MHA fine-tuned bleu', 'MHA fine-tuned rouge1',
                        'speculative greedy batch 1'}
  assert all(isinstance(g['figure'], float) and g['met'] in (True, False) for g in goals.values())
  claims = {c['key']: c for c in summary['claims']}
  assert claims['5a']['verdict'] == 'holds'  # greedy speculation equals greedy decoding
  assert claims['3a']['verdict'] == 'not run'  # the conversion ablation is left out
  for name in ('results/report.md', 'results/evaluate.json', 'results/speculative.json',
               'study.log', 'work/jobs'):
    assert name in names, name
  assert '| speculative |' in md and '| claim | ours | verdict |' in md
  with tarfile.open(tmp_path / 'out' / 'device_check_study.tar.gz') as tar:
    spec = json.load(tar.extractfile('results/speculative.json'))
  trees = spec['tree_rows']  # the tree grown inside the MHA chain job (no drafts job)
  assert [r['draft'] for r in trees] == ['draft model tree best:16,depth:4']
  assert all(r['tokens_equal_autoregressive'] for r in trees if r['temperature'] == 0)
  assert {r['draft'] for r in spec['rows']} == {'draft model'} and not spec['drafts_rows']
