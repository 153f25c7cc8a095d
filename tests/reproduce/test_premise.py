"""The premise stage (issue 59, item 3) without training: its pair in the presets, its wiring and
resumption with the trainers and the measurement replaced, its facts, its claims and the report's
section. The stage measured for real at tiny size: tests/reproduce/test_pipeline.py."""

import dataclasses
import json
import os

import pytest

from gqa_spec.errors import UserError
from gqa_spec.reproduce import claims, drafts, finetune, premise, presets, verdicts
from gqa_spec.reproduce import overrides
from gqa_spec.reproduce import jobs as jobs_lib
from gqa_spec.models.config import preset as model_preset

TR = presets.TRANSLATE


def test_cpu_has_a_t5_small_pair_at_its_vocabulary_and_the_others_none():
  cpu = presets.get('cpu')
  pair = cpu.premise
  small = model_preset('small')
  assert pair.target == small.replace(vocab_size=cpu.draft.vocab_size)  # the shape, cpu's vocab
  assert pair.batches == (1, 8) and pair.task == TR
  assert presets.get('smoke').premise is None and presets.get('gpu').premise is None
  # The decoder a greedy step reads: ~112 MiB in float32 (the sizing in `_cpu`'s docstring).
  c = pair.target
  layer = 2 * 4 * c.emb_dim * c.num_heads * c.head_dim + 3 * c.emb_dim * c.mlp_dim
  mib = 4 * (c.num_decoder_layers * layer + c.emb_dim * c.vocab_size) / 2 ** 20
  assert 105 < mib < 120, mib


def test_set_changes_the_pair_and_bad_values_are_one_line_errors():
  cpu = presets.get('cpu')
  changed = overrides.apply(cpu, ['premise.pretrain_steps=5', 'premise.batches=1,2',
                                   'premise.examples=4', 'premise.target.num_decoder_layers=2'])
  assert (changed.premise.pretrain_steps, changed.premise.batches) == (5, (1, 2))
  assert changed.premise.target.num_decoder_layers == 2 and changed.target == cpu.target
  assert overrides.apply(cpu, ['premise=none']).premise is None
  for bad, match in ((['premise.nope=1'], 'not a settable premise field'),
                     (['premise.pretrain_steps=0'], 'premise.pretrain_steps must be > 0'),
                     (['premise.target.vocab_size=512'], "the pair speculates with the study's"),
                     (['premise.batches=3'], 'must divide premise.examples'),
                     (['premise=off'], 'expected none')):
    with pytest.raises(UserError, match=match):
      overrides.apply(cpu, bad)
  with pytest.raises(UserError, match="'smoke' preset has no premise pair"):
    overrides.apply(presets.get('smoke'), ['premise.examples=2'])


def _row(draft, batch, gamma, speedup, alpha, c, v, temp=0.0, tokens_per_call=2.0):
  return {'task': TR, 'target': premise.TARGET, 'draft': draft, 'temperature': temp,
          'gamma': gamma, 'alpha': alpha, 'c': c, 'verify_ratio_v': v, 'batch_size': batch,
          'tokens_per_call': tokens_per_call, 'speedup_measured': speedup,
          'speedup_thm8_with_v': speedup / 0.95, 'tokens_equal_autoregressive': True}


def test_premise_claims_are_decided_on_a_weight_bound_pair():
  # A cheap draft (c 0.02) of a weight-bound target (v 1.05): Theorem 8 predicts > 2x at batch 1.
  rows = [_row('draft model', 1, 5, 2.1, 0.7, 0.02, 1.05, tokens_per_call=3.0),
          _row('distilled', 1, 5, 2.6, 0.8, 0.02, 1.05, tokens_per_call=3.6),
          _row('chimera', 1, 5, 1.9, 0.75, 0.05, 1.05, tokens_per_call=3.4),
          _row('staged (bigram 3/call)', 1, 5, 2.5, 0.7, 0.03, 1.05),
          # batch 8, where the premise fails (c 0.9, alpha 0.3): 6a and 6b leave it out
          _row('draft model', 8, 5, 0.5, 0.3, 0.9, 3.5, tokens_per_call=1.4),
          _row('staged (bigram 3/call)', 8, 5, 0.51, 0.3, 0.9, 3.5),
          _row('chimera', 8, 5, 0.4, 0.35, 0.9, 3.5, tokens_per_call=1.2)]
  trees = [{'task': TR, 'target': premise.TARGET, 'draft': 'draft model tree topk:4,2,2',
            'temperature': 0.0, 'batch_size': 1, 'tokens_per_call': 3.5, 'speedup_measured': 2.4,
            'tokens_equal_autoregressive': True}]
  by = {c.key: c for c in claims.premise_claims({'rows': rows, 'tree_rows': trees})}
  assert sorted(by) == ['5c (premise pair)', '5d (premise pair)', '6a (premise pair)',
                        '6b (premise pair)']
  assert by['5c (premise pair)'].verdict == verdicts.HOLDS
  assert '2.60x (distilled, gamma 5)' in by['5c (premise pair)'].ours  # the best batch-1 row
  assert by['5d (premise pair)'].verdict == verdicts.HOLDS  # 0.95 of Theorem 8
  assert by['6a (premise pair)'].verdict == verdicts.HOLDS  # 2.5 / 2.1 at batch 1 ...
  assert 'premise met in 1 settings, not in 1' in by['6a (premise pair)'].why  # ... batch 8 out
  assert by['6b (premise pair)'].verdict == verdicts.HOLDS  # +0.4 tokens per call
  # The claims table gets them as rows of their own, after the study's 5c-6b.
  table = claims.all_claims({'rows': []}, {'rows': []}, {'rows': []}, 0.05, {},
                            {'rows': rows, 'tree_rows': trees})
  assert [c.key for c in table][-4:] == sorted(by)


def test_premise_claims_of_a_pair_where_theorem_8_cannot_pay_read_premise_not_met():
  # About the study's own figures: c 0.22, v 1.17-1.56, alpha 0.47 -> at most 1.06x.
  rows = [_row('draft model', 1, 1, 0.6, 0.47, 0.22, 1.17),
          _row('draft model', 1, 3, 0.5, 0.44, 0.22, 1.56),
          _row('chimera', 1, 3, 0.4, 0.35, 0.3, 1.6, tokens_per_call=1.4),
          _row('staged (bigram 3/call)', 1, 3, 0.45, 0.44, 0.3, 1.6)]
  by = {c.key: c for c in claims.premise_claims({'rows': rows})}
  for key in ('5c', '6a', '6b'):
    claim = by[f'{key} (premise pair)']
    assert claim.verdict == verdicts.PREMISE_NOT_MET, claim
    assert 'at most 1.06x' in claim.why and 'measured c 0.22' in claim.why, claim.why
  assert claims.premise_claims({'rows': [], 'skipped': 'no pair'}) == []
  assert claims.premise_claims(None) == []


def test_premise_facts_compare_the_step_with_the_weights_over_the_bandwidth():
  def job(batch, step, c):
    return {'batch_size': batch, 'target_step_seconds': {'1': step},
            'bandwidth_bytes_per_s': 10e9,
            'param_bytes': {'target': 200e6, 'target_weights_per_step': 110e6, 'distilled': 4e6,
                            'chimera': 6e6, 'draft model': 4e6},
            'drafts_rows': [{'draft': 'distilled', 'c': c}, {'draft': 'draft model', 'c': c + 1},
                            {'draft': 'chimera', 'c': 0.5}]}
  facts = premise.premise_facts([job(8, 0.03, 0.05), job(1, 0.0125, 0.02)])
  assert facts['batch_size'] == 1 and facts['bound_seconds'] == pytest.approx(0.011)
  assert facts['weights_read_fraction'] == pytest.approx(0.88) and facts['weight_bound']
  assert facts['draft_cost'] == 0.02 and facts['cheap_draft']
  assert facts['c'] == {'distilled': {'8': 0.05, '1': 0.02}, 'draft model': {'8': 1.05, '1': 1.02}}
  slow = premise.premise_facts([job(1, 0.02, 0.2)])
  assert not slow['weight_bound'] and not slow['cheap_draft']  # 0.55 of the bandwidth; c 0.2
  text = premise.report_section({'rows': [_row('distilled', 1, 3, 1.5, 0.7, 0.02, 1.05)],
                                 'tree_rows': [], 'auto_rows': [], 'task': TR,
                                 'pretrain_task': presets.PRETRAIN_MIXTURE, 'premise': facts,
                                 'training': {'pretrain': {'step': 600, 'train_task': 'x'},
                                              'finetune': {'step': 100}}})
  assert '0.88 of the bandwidth (met: >= 0.8)' in text and '| 0.020 | met: <= 0.1 |' in text
  assert 'pre-trained 600 steps on `ddtp_mixture`' in text
  assert '| 1 | 0 | chain distilled (gamma=3) | 0.70 |' in text


def test_memory_bandwidth_is_bytes_over_the_fastest_read():
  bandwidth = premise.memory_bandwidth(mib=8, repeats=2)
  assert 1e8 < bandwidth < 1e13  # 0.1 GB/s .. 10 TB/s: bytes per second, not per ms or MiB


def test_a_preset_without_a_pair_records_so_and_the_report_says_it_once(tmp_path):
  ctx = jobs_lib.Context(presets.get('smoke'), str(tmp_path / 'r'), str(tmp_path / 'w'))
  record = premise.stage_premise(ctx)
  assert record['rows'] == [] and "'smoke' preset has no premise pair" in record['skipped']
  text = premise.report_section(record)
  assert text.count('No premise pair') == 1 and '\n' not in text
  assert 'has not run' in premise.report_section(None)


def test_stage_trains_then_measures_each_batch_and_a_rerun_skips_every_job(tmp_path, monkeypatch):
  """The jobs in order, with the pair's sizes, the study's draft as the distillation's start and
  the fine-tuned pair target as every draft's target; then resumption: nothing runs again."""
  base = presets.get('smoke')
  pair = presets.PremisePair(target=base.target.replace(emb_dim=48), pretrain_steps=7,
                             pretrain_batch=3, warmup_steps=2, pretrain_peak_lr=0.02,
                             finetune_steps=5, finetune_batch=2, draft_steps=4, draft_batch=2,
                             batches=(1, 2), examples=2, repeats=1)
  ctx = jobs_lib.Context(dataclasses.replace(base, premise=pair), str(tmp_path / 'r'),
                         str(tmp_path / 'w'), exported_dir=str(tmp_path / 'export'))  # no seqio
  os.makedirs(ctx.out_dir)
  jobs_lib.write_json(ctx.stage_path('finetune'), {'rows': [
      {'task': TR, 'name': 'draft', 'best_checkpoint': 'models/finetune/tr/draft/best'}]})
  calls = []

  def train(model_dir, config, task, lengths, batch, steps, **kw):
    calls.append(('train', ctx.relative(model_dir), config.emb_dim, task.split('/')[-1],
                  tuple(lengths), batch, steps, kw.get('initial_checkpoint_path') and
                  ctx.relative(kw['initial_checkpoint_path']), kw.get('evaluator'),
                  kw.get('best_metric')))
    return {'model_dir': ctx.relative(model_dir), 'step': steps, 'train_task': task}

  def fake_job(kind):
    def run(c, task, lengths, target, *rest):
      independent = next((ctx.relative(x) for x in rest if isinstance(x, str)), None)
      size = next(((x.steps, x.batch, ctx.relative(x.models_dir)) for x in rest
                   if isinstance(x, drafts.Size)), None)
      calls.append((kind, ctx.relative(target), independent, size))
      return {'draft': kind, 'checkpoint': f'models/premise/drafts/{kind}/x',
              'run_dir': f'models/premise/drafts/{kind}'}
    return run

  def measure(c, p, task, lengths, paths, successor, batch):
    assert successor == 'successor'
    calls.append(('measure', batch, {k: ctx.relative(v) for k, v in paths.items()}))
    rows = [{'draft': 'distilled', 'c': 0.01 * batch, 'batch_size': batch}]
    return {'batch_size': batch, 'drafts_rows': rows, 'tree_rows': [], 'auto_rows': [],
            'target_step_seconds': {'1': 0.01}, 'bandwidth_bytes_per_s': 1e10,
            'param_bytes': {'target_weights_per_step': 9e7}}

  monkeypatch.setattr(jobs_lib, 'train', train)
  monkeypatch.setattr(finetune, '_evaluator', lambda c, task, config: f'validation of {task}')
  for kind in ('chimera', 'distilled', 'independent'):
    monkeypatch.setattr(drafts, f'{kind}_job', fake_job(kind))
  monkeypatch.setattr(premise, '_measure', measure)
  class Bigram:
    def successor(self):
      return 'successor'
  monkeypatch.setattr(premise.speculation, 'fit_bigram', lambda c, t: Bigram())
  record = premise.stage_premise(ctx)
  lengths = base.finetune_lengths[TR]
  draft_dir = 'models/premise/drafts'
  target = 'models/premise/finetune/best'
  assert calls == [
      ('train', 'models/premise/pretrain', 48, base.pretrain_task, base.pretrain_lengths, 3, 7,
       None, None, None),
      ('train', 'models/premise/finetune', 48, TR, lengths, 2, 5, 'models/premise/pretrain',
       f'validation of {TR}', presets.TASK_METRIC[TR]),
      ('chimera', target, None, (4, 2, draft_dir)),
      ('distilled', target, 'models/finetune/tr/draft/best', (4, 2, draft_dir)),
      ('independent', target, 'models/finetune/tr/draft/best', None),
      ('measure', 1, {'target': target, 'draft model': 'models/finetune/tr/draft/best',
                      'distilled': 'models/premise/drafts/distilled/x',
                      'chimera': 'models/premise/drafts/chimera'}),
      ('measure', 2, calls[-1][2])]
  assert [r['batch_size'] for r in record['rows']] == [1, 2]
  assert record['premise']['c'] == {'distilled': {'1': 0.01, '2': 0.02}}
  assert record['premise']['weights_read_fraction'] == pytest.approx(0.9)
  json.dumps(record)  # a stage record
  calls.clear()
  assert premise.stage_premise(ctx)['rows'] == record['rows'] and calls == []
