"""`reproduce --preset gpu` at tiny size (`--set`) from exported tasks, in subprocesses where
TensorFlow, seqio and gin cannot be imported (`gpu_preset_check.py`), stopped by `--time-limit`
part-way and resumed by the same command: the job records stay consistent and the resumed run ends
at the planned step."""

import json
import os
import subprocess
import sys

import pytest

from gqa_spec.errors import UserError
from gqa_spec.reproduce import jobs, presets, writeup
from gqa_spec.reproduce import overrides

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 100
TINY = ['vocab_pieces=300', 'target.vocab_size=512', 'target.emb_dim=32', 'target.num_heads=4', 'target.head_dim=8',
        'target.mlp_dim=64', 'target.num_encoder_layers=1', 'target.num_decoder_layers=1',
        'draft.vocab_size=512', 'draft.emb_dim=16', 'draft.num_heads=2', 'draft.head_dim=8',
        'draft.mlp_dim=32', 'draft.num_encoder_layers=1', f'pretrain_steps={STEPS}',
        'pretrain_batch=4', 'warmup_steps=10', 'kv_heads=2', 'alphas=0',
        'method_ablation_kv_heads=2', 'method_ablation_alpha=0', 'timing_groups=1,2,4',
        'method_ablation=true']  # the conversion ablation the gpu preset leaves out, back on


def _reproduce(out, work, exported, *extra):
  args = ['reproduce', '--preset', 'gpu', *[a for s in TINY for a in ('--set', s)], '--exported',
          exported, '--out', out, '--work-dir', work, *extra]
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=_ROOT)
  result = subprocess.run([sys.executable, '-m', 'tests.reproduce.gpu_preset_check', *args],
                          cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0 and 'RC ' in result.stdout, result.stderr[-4000:]
  return int(result.stdout.split('RC ', 1)[1].split()[0])


def _steps_logged(model_dir):
  with open(os.path.join(model_dir, 'train_log.jsonl')) as f:
    return [r['step'] for r in map(json.loads, f) if r.get('split') == 'train']


def test_tiny_gpu_preset_stops_at_the_time_limit_and_resumes_without_tensorflow(tiny_gpu_export,
                                                                                 tmp_path):
  preset = overrides.apply(presets.get('gpu'), TINY)
  assert preset.target.num_heads == 4 and preset.target.num_kv_heads == 4
  exported = tiny_gpu_export
  out, work = str(tmp_path / 'results'), str(tmp_path / 'work')
  target_dir = os.path.join(work, 'models', 'pretrain', 'target')

  rc = _reproduce(out, work, exported, '--stages', 'corpus', 'pretrain', '--time-limit', '20')
  if rc == 75:  # stopped: the stage and any unfinished job left no record
    assert not os.path.exists(os.path.join(out, 'pretrain.json'))
    jobs = os.path.join(work, 'jobs', 'pretrain')
    for job in ('target', 'draft'):  # side by side (the preset's workers): either may finish first
      if os.path.isfile(os.path.join(jobs, f'{job}.json')):
        with open(os.path.join(jobs, f'{job}.json')) as f:
          assert json.load(f)['step'] == STEPS, job  # a record only for a job that finished
  else:  # the machine was fast enough to finish inside the limit
    assert rc == 0
  stopped_at = max(_steps_logged(target_dir), default=0) if os.path.isdir(target_dir) else 0
  with open(os.path.join(out, 'corpus.json')) as f:
    corpus = json.load(f)
  assert corpus['vocab_size'] <= 512 and set(corpus['tasks']) >= {presets.TRANSLATE,
                                                                 presets.PRETRAIN}
  assert '--exported' in corpus['command']
  train, test = writeup.smoke_splits(corpus)  # what `--preset smoke --exported` prints from it
  assert train['translate_en_de_pairs'] == (
      corpus['tasks'][presets.TRANSLATE]['splits']['train']['examples']) > 0
  assert f"{test['translate_en_de_pairs']} translation pairs" in writeup.smoke_note(train, test)

  assert _reproduce(out, work, exported, '--stages', 'corpus', 'pretrain', 'uptrain') == 0
  with open(os.path.join(out, 'pretrain.json')) as f:
    pretrain = json.load(f)
  assert pretrain['target']['step'] == pretrain['draft']['step'] == STEPS
  assert pretrain['target']['train_task'].startswith('exported:')
  logged = _steps_logged(target_dir)
  assert logged == sorted(logged) and logged[-1] == STEPS
  if 0 < stopped_at < STEPS:  # resumed from the stop's checkpoint, not restarted from step 0
    assert logged.count(stopped_at) == 1
  with open(os.path.join(out, 'uptrain.json')) as f:
    rows = json.load(f)['rows']
  assert sorted(r['variant']['method'] for r in rows) == ['first', 'mean', 'random']
  assert all(r['variant']['kv_heads'] == 2 and r['uptrain_steps'] == 0 for r in rows)


def test_a_job_stopped_by_the_limit_leaves_no_record_and_runs_again(tmp_path):
  ctx = jobs.Context(presets.get('smoke'), str(tmp_path / 'out'), str(tmp_path / 'work'))
  ran = []

  def job(key, stop=False):
    ran.append(key)
    ctx.stop_requested = ctx.stop_requested or stop
    return {'key': key}

  with pytest.raises(jobs.TimeLimitReached, match='during job b'):
    jobs.run_jobs(ctx, 'stage', [('a', lambda: job('a')), ('b', lambda: job('b', stop=True)),
                                 ('c', lambda: job('c'))])
  assert ran == ['a', 'b'] and jobs.job_done(ctx, 'stage', 'a')
  assert not jobs.job_done(ctx, 'stage', 'b')
  ctx.stop_requested = False
  records = jobs.run_jobs(ctx, 'stage', [('a', lambda: job('a')), ('b', lambda: job('b')),
                                         ('c', lambda: job('c'))])
  assert ran == ['a', 'b', 'b', 'c'] and [r['key'] for r in records] == ['a', 'b', 'c']
  with pytest.raises(UserError, match='positive number of seconds'):
    with jobs.time_limit(ctx, 0):
      pass
