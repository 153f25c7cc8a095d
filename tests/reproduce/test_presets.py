"""`--set KEY=VALUE` preset overrides: typed parsing, clear errors, and their own output dirs."""

import dataclasses
import json
import os

import pytest

from gqa_spec import cli
from gqa_spec.errors import UserError
from gqa_spec.reproduce import pipeline, presets
from gqa_spec.reproduce import overrides


def test_overrides_are_parsed_by_field_type():
  base = presets.get('cpu')
  p = overrides.apply(base, ['warmup_steps=10000', 'finetune_learning_rate=3e-3',
                              'gammas=1,3,7', 'temperatures=0,0.5', 'long_timing=512, 128',
                              'use_sample_corpus=true', 'pretrain_task=ddtp_span_corruption',
                              'finetune_multitask=false'])
  assert p.warmup_steps == 10000 and isinstance(p.warmup_steps, int)
  assert p.finetune_learning_rate == pytest.approx(3e-3)
  assert p.gammas == (1, 3, 7) and p.temperatures == (0.0, 0.5)
  assert p.long_timing == (512, 128) and p.use_sample_corpus is True
  assert p.pretrain_task == 'ddtp_span_corruption' and p.finetune_multitask is False
  # cpu takes the budget's design (multi-task pre-training and fine-tuning); smoke keeps the
  # paper's (span corruption, per-task fine-tuning)
  assert (base.pretrain_task, base.finetune_multitask) == ('ddtp_mixture', True)
  smoke = presets.get('smoke')
  assert (smoke.pretrain_task, smoke.finetune_multitask) == ('ddtp_span_corruption', False)
  # everything else is the preset's
  assert p.target == base.target and p.pretrain_steps == base.pretrain_steps
  assert overrides.apply(base, []) == base


def test_learning_rate_schedules_per_role():
  smoke = presets.get('smoke')  # no peak set: T5's 1 / sqrt(warmup) for both, one fine-tuning lr
  assert smoke.pretrain_schedule('target') == smoke.pretrain_schedule('draft') == (
      1.0, smoke.warmup_steps)
  assert smoke.finetune_lr('draft') == smoke.finetune_lr('target') == smoke.finetune_learning_rate
  p = overrides.apply(smoke, ['pretrain_peak_lr=0.05', 'warmup_steps=400',
                               'draft_pretrain_peak_lr=0.2', 'draft_finetune_learning_rate=0.03'])
  base, warmup = p.pretrain_schedule('target')
  assert warmup == 400 and base / warmup ** 0.5 == pytest.approx(0.05)  # the peak
  base, _ = p.pretrain_schedule('draft')
  assert base / 400 ** 0.5 == pytest.approx(0.2)
  assert p.finetune_lr('draft') == pytest.approx(0.03)
  assert p.finetune_lr('target') == smoke.finetune_learning_rate
  with pytest.raises(UserError, match="'fast' is not a number"):
    overrides.apply(smoke, ['pretrain_peak_lr=fast'])


@pytest.mark.parametrize('assignment, message', [
    ('warmup_steps', 'expected KEY=VALUE'),
    ('target=mini', 'not a settable preset field'),
    ('warmup_step=10', 'not a settable preset field'),
    ('warmup_steps=ten', "'ten' is not an integer"),
    ('finetune_learning_rate=fast', "'fast' is not a number"),
    ('gammas=1,x', "'x' is not an integer"),
    ('long_timing=2048', 'expected two comma-separated integers'),
    ('use_sample_corpus=maybe', 'expected true or false'),
    ('pretrain_task=wikipedia', 'expected one of ddtp_span_corruption, ddtp_mixture'),
    ('pretrain_task=ddtp_translate_summarize', 'expected one of ddtp_span_corruption'),
    ('finetune_multitask=maybe', 'expected true or false'),
    ('name=cpu', 'not a settable preset field'),
    ('workers=0', 'preset field workers must be > 0, got 0'),
    ('workers=two', "'two' is not an integer"),
])
def test_bad_overrides_name_the_problem(assignment, message):
  with pytest.raises(UserError, match=message):
    overrides.apply(presets.get('smoke'), [assignment])


def test_overrides_need_their_own_out_and_work_dirs(tmp_path):
  with pytest.raises(UserError, match='give its own --out and --work-dir'):
    pipeline.run('smoke', None, str(tmp_path / 'w'), stages=['corpus'],
                 overrides=['warmup_steps=5'])


def test_cli_records_overrides_and_the_exact_command(tmp_path, monkeypatch):
  out, work = str(tmp_path / 'r'), str(tmp_path / 'w')
  monkeypatch.setenv('HOME', str(tmp_path))  # nothing outside tmp
  sets = ['vocab_pieces=250', 'gammas=1,2', 'pretrain_task=ddtp_mixture',
          'finetune_multitask=true']
  rc = cli.main(['reproduce', '--preset', 'smoke', '--stages', 'corpus', '--out', out,
                 '--work-dir', work] + [a for s in sets for a in ('--set', s)])
  assert rc == 0
  with open(os.path.join(out, 'preset.json')) as f:
    recorded = json.load(f)
  assert recorded['vocab_pieces'] == 250 and recorded['gammas'] == [1, 2]
  assert recorded['pretrain_task'] == 'ddtp_mixture' and recorded['finetune_multitask'] is True
  assert recorded['overrides'] == sets
  assert recorded['work_dir'] == os.path.join('..', 'w')  # relative to preset.json's directory
  with open(os.path.join(out, 'corpus.json')) as f:
    corpus = json.load(f)
  assert corpus['command'] == (f'gqa-spec reproduce --preset smoke --set vocab_pieces=250 '
                               f'--set gammas=1,2 --set pretrain_task=ddtp_mixture '
                               f'--set finetune_multitask=true --out {out} --work-dir {work} '
                               '--stages corpus')
  assert cli.main(['reproduce', '--preset', 'smoke', '--set', 'gammas=1,x']) == 2


def test_the_time_boxed_fields_narrow_the_study_and_bad_values_are_refused():
  gpu = presets.get('gpu')  # the 6-minute device call's study
  assert [v.method for v in gpu.variants()] == [None, 'mean', 'mean']  # no first / random
  assert gpu.speculative_targets() == ('mha_g16',)
  assert list(gpu.speculative_task_lengths()) == [presets.TRANSLATE]
  full = overrides.apply(gpu, ['method_ablation=true', 'speculative_gqa=true'])
  assert [v.method for v in full.variants()][-2:] == ['first', 'random']
  assert full.speculative_targets() == ('mha_g16', 'g4_mean_a0.05')
  cpu = presets.get('cpu')  # the defaults keep the whole study
  assert cpu.trained_drafts and cpu.chain_drafts == presets.CHAIN_DRAFTS
  assert list(cpu.speculative_task_lengths()) == list(cpu.finetune_lengths)
  with pytest.raises(UserError, match="chain_drafts .*'tree'.*draft model, bigram, copy"):
    dataclasses.replace(cpu, chain_drafts=('draft model', 'tree'))
  with pytest.raises(UserError, match=r"speculative_tasks \['ddtp_qa'\] are not fine-tuning"):
    dataclasses.replace(cpu, speculative_tasks=('ddtp_qa',))
  with pytest.raises(UserError, match='eval_workers must be a positive integer'):
    dataclasses.replace(cpu, eval_workers=0.5)
  with pytest.raises(UserError, match='--set trained_drafts=maybe: expected true or false'):
    overrides.apply(cpu, ['trained_drafts=maybe'])
