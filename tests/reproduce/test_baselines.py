"""Table 1's trivial baselines: the text rules, their scores on hand-made examples, the examples."""

import pytest

from gqa_spec.data import metrics
from gqa_spec.errors import UserError
from gqa_spec.reproduce import baselines, report


def test_prefixes_are_removed_and_other_text_kept():
  assert baselines.strip_prefix('translate English to German: The cat.') == 'The cat.'
  assert baselines.strip_prefix('summarize:  A tool.\nMore. ') == 'A tool.\nMore.'
  assert baselines.strip_prefix('no prefix here') == 'no prefix here'


def test_first_sentence_and_first_words():
  assert baselines.first_sentence('A fast tool. It does\nmore! Really?') == 'A fast tool.'
  assert baselines.first_sentence('Version 1.2 is\nhere') == 'Version 1.2 is here'  # no end
  assert baselines.first_sentence('Why? Because.') == 'Why?'
  assert baselines.first_words('one two\nthree  four', 3) == 'one two three'
  assert baselines.first_words('one', 5) == 'one'
  with pytest.raises(UserError, match='n >= 1'):
    baselines.first_words('one', 0)
  assert baselines.median_words(['a b', 'a b c d', 'a b c d e f']) == 4
  with pytest.raises(UserError, match='no texts'):
    baselines.median_words([])


def test_predictions_per_task_kind():
  sources = ['The cat sat. Then it slept.', 'A dog']
  assert baselines.predictions('translate', sources) == {'copy input': sources}
  assert baselines.predictions('summarize', sources, 2) == {
      'first sentence': ['The cat sat.', 'A dog'], 'first 2 words': ['The cat', 'A dog']}
  with pytest.raises(UserError, match="'translate' or 'summarize'"):
    baselines.predictions('qa', sources)


def test_scores_on_hand_made_examples():
  # Copying a source that equals its reference is a perfect translation; one that shares nothing
  # scores 0.
  assert metrics.bleu(['the same words here today'], ['the same words here today'])['bleu'] == (
      pytest.approx(100.0))
  assert metrics.bleu(['ganz andere Wörter hier'], ['totally different words there'])['bleu'] == 0
  # ROUGE-1 of the first sentence 'The cat ran.' against 'the cat sat': 2 of 3 unigrams match
  # both ways (case and punctuation ignored), F = 2/3.
  first = baselines.predictions('summarize', ['The cat ran. Dogs bark loudly.'], 1)
  assert metrics.rouge(['the cat sat'], first['first sentence'])['rouge1'] == (
      pytest.approx(200 / 3))
  # 'first 1 words' = 'The': P = 1, R = 1/3, F = 0.5.
  assert metrics.rouge(['the cat sat'], first['first 1 words'])['rouge1'] == pytest.approx(50.0)


def test_evaluate_scores_the_test_examples_with_the_task_metric(tiny_data_dir):
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  tasks.register_ddtp_tasks(tiny_data_dir)
  rows = baselines.evaluate({'ddtp_translate_en_de': 'bleu', 'ddtp_summarize': 'rouge1'},
                            {'ddtp_translate_en_de': (64, 32), 'ddtp_summarize': (64, 32)},
                            'test', 8)
  assert [(r['task'], r['baseline'].split(' ')[0]) for r in rows] == [
      ('ddtp_translate_en_de', 'copy'), ('ddtp_summarize', 'first'),
      ('ddtp_summarize', 'first')]
  assert all(r['examples'] == 8 for r in rows)
  sources, targets = baselines.task_examples('ddtp_translate_en_de', 'test',
                                             {'inputs': 64, 'targets': 32}, 8)
  assert not any(s.startswith('translate') for s in sources)
  assert rows[0]['score'] == pytest.approx(metrics.bleu(targets, sources)['bleu'])
  # Copying English is a weak but non-zero German translation (shared names and words); the
  # first sentence of a description overlaps its synopsis.
  assert 0 < rows[0]['score'] < 30 and 0 < rows[1]['score'] < 60


def test_table1_shows_baselines_as_marked_rows():
  evaluate = [{'variant': 'mha_g4', 'label': 'MHA', 'kv_heads': 4, 'method': None, 'alpha': None,
               'model': 'target', 'task': t, 'score': s, 'time_per_sample_s': 0.01}
              for t, s in (('ddtp_translate_en_de', 3.0), ('ddtp_summarize', 20.0))]
  table = report.table1(evaluate, [
      {'task': 'ddtp_translate_en_de', 'baseline': 'copy input', 'metric': 'bleu', 'score': 5.25},
      {'task': 'ddtp_summarize', 'baseline': 'first sentence', 'metric': 'rouge1',
       'score': 18.5}])
  lines = table.splitlines()
  assert lines[2].startswith('| MHA |')
  # Columns: model, time, average, then the tasks sorted (summarize, translate).
  assert lines[3] == '| baseline: copy input | - | - | - | 5.25 |'
  assert lines[4] == '| baseline: first sentence | - | - | 18.50 | - |'
