"""Metrics against values computed by hand on small examples."""

import math

import pytest

from gqa_spec.data import metrics


def test_rouge_hand_computed():
  # 'the cat sat' vs 'the cat sat on the mat': 3 of 6 unigrams (P=1, R=1/2, F=2/3);
  # 2 of 5 bigrams (P=1, R=2/5, F=4/7); LCS 3 (= rouge1). The second pair is identical (100).
  scores = metrics.rouge(['the cat sat on the mat', 'a dog'], ['the cat sat', 'a dog'])
  assert scores['rouge1'] == pytest.approx((200 / 3 + 100) / 2)
  assert scores['rouge2'] == pytest.approx((400 / 7 + 100) / 2)
  assert scores['rougeLsum'] == pytest.approx((200 / 3 + 100) / 2)


def test_rouge_lsum_splits_sentences():
  # Swapped sentences: one line has LCS 2 of 4 tokens (rougeL 50); T5's ' . ' -> newline makes
  # them two sentences whose union LCS covers all 4 tokens (rougeLsum 100).
  scores = metrics.rouge(['a b . c d'], ['c d . a b'], ['rougeL', 'rougeLsum'])
  assert scores == {'rougeL': pytest.approx(50.0), 'rougeLsum': pytest.approx(100.0)}


def test_bleu_hand_computed():
  assert metrics.bleu(['the cat sat on the mat'], ['the cat sat on the mat'])['bleu'] == (
      pytest.approx(100.0))
  # Every n-gram precision is 1; brevity penalty exp(1 - 6/5).
  assert metrics.bleu(['the cat sat on the mat'], ['the cat sat on the'])['bleu'] == (
      pytest.approx(100 * math.exp(-0.2), abs=1e-3))
  # Two references per example (lists of references).
  assert metrics.bleu([['a b c d e', 'the cat sat on the mat']],
                      ['the cat sat on the mat'])['bleu'] == pytest.approx(100.0)


def test_trivia_qa_max_over_aliases():
  scores = metrics.trivia_qa([['The Beatles', 'Beatles'], ['Paris']], ['beatles!', 'paris france'])
  assert scores['em'] == pytest.approx(50.0)
  # F1: 1 for the first; 'paris france' vs 'paris': P=1/2, R=1, F1=2/3.
  assert scores['f1'] == pytest.approx(100 * (1 + 2 / 3) / 2)
  assert metrics.normalize_squad('The  Quick, brown fox!') == 'quick brown fox'


# (raw answer, official TriviaQA normalisation, SQuAD normalisation). The TriviaQA column is what
# triviaqa/evaluation/triviaqa_evaluation.py's normalize_answer and T5 0.9.4's
# qa_utils.normalize_trivia_qa return (read from both sources; written out here by hand).
_NORMALISATION_CASES = [
    ('U.S.A.', 'u s', 'usa'),                        # punctuation becomes a space; 'a' is an article
    ('Rock-and-Roll', 'rock and roll', 'rockandroll'),
    ("Guns N' Roses", 'guns n roses', 'guns n roses'),
    ('O\u2019Neill', 'o neill', 'o\u2019neill'),      # ’ is no ASCII punctuation: SQuAD keeps it
    ('\u2018Hello\u2019', 'hello', '\u2018hello\u2019'),
    ('caf\u00b4e', 'caf e', 'caf\u00b4e'),             # ´ (acute accent)
    ('`quoted`', 'quoted', 'quoted'),
    ('new_york_city', 'new york city', 'newyorkcity'),  # _ is a space in TriviaQA only
    ('the-end', 'end', 'theend'),                  # the freed article is removed
    ('  The   Who  ', 'who', 'who'),
    ('A.C. Milan', 'c milan', 'ac milan'),
    ('1,000', '1 000', '1000'),
    ('St. Louis', 'st louis', 'st louis'),
    ('!!!', '', ''),
    ('', '', ''),
    ('Théâtre', 'théâtre', 'théâtre'),            # non-ASCII letters are kept by both
]


@pytest.mark.parametrize('raw,trivia,squad', _NORMALISATION_CASES)
def test_normalize_trivia_qa_matches_official_case_by_case(raw, trivia, squad):
  assert metrics.normalize_trivia_qa(raw) == trivia
  assert metrics.normalize_squad(raw) == squad


def test_trivia_qa_scores_with_official_normalisation():
  # 'u.s.' vs alias 'U.S.A.': TriviaQA gives 'u s' == 'u s' (EM 1); SQuAD would give 'us' vs 'usa'.
  assert metrics.trivia_qa([['U.S.A.']], ['u.s.']) == {'em': 100.0, 'f1': 100.0}
  # 'new_york' vs 'New York': one EM under TriviaQA (SQuAD: 'newyork' vs 'new york', F1 0).
  assert metrics.trivia_qa([['New York']], ['new_york'])['em'] == 100.0
  # Token F1 over the space-split tokens: 'rock and roll' vs 'rock': P=1, R=1/3, F1=1/2.
  assert metrics.trivia_qa([['Rock-and-Roll']], ['rock'])['f1'] == pytest.approx(50.0)
  # Empty after normalisation: EM counts equality, F1 is 0 with no common token (as the official).
  assert metrics.trivia_qa([['The']], ['a']) == {'em': 100.0, 'f1': 0.0}


def test_answers_postprocessor():
  example = {'answers': [b'Paris', b'City of Light']}
  assert metrics.answers_postprocessor('x', example, is_target=True) == ['Paris', 'City of Light']
  assert metrics.answers_postprocessor('x', example, is_target=False) == 'x'


def test_bleu_statistics_recompute_corpus_bleu_of_any_resample():
  targets = ['das ist ein kleines Haus .', 'Ich gehe heute nach Hause , sagte er .',
             'Guten Morgen', 'ein zwei drei vier fünf']
  predictions = ['das ist ein Haus .', 'Ich gehe nach Hause , sagte sie .', 'Morgen', '']
  stats = metrics.bleu_statistics(targets, predictions)
  assert stats.shape == (4, len(metrics.BLEU_STATISTICS))
  assert list(stats[0]) == [5, 6, 5, 3, 1, 0, 5, 4, 3, 2]  # lengths, matches 1-4, totals 1-4
  assert metrics.bleu_from_statistics(stats) == metrics.bleu(targets, predictions)['bleu']
  resample = [0, 0, 1, 3]
  assert metrics.bleu_from_statistics(stats[resample]) == pytest.approx(metrics.bleu(
      [targets[i] for i in resample], [predictions[i] for i in resample])['bleu'], abs=1e-9)


def test_rouge_is_the_mean_of_the_per_example_scores():
  targets = ['the cat sat on the mat', 'a b c d']
  predictions = ['the cat sat', 'x y']
  per_example = metrics.rouge_per_example(targets, predictions)
  assert per_example['rouge1'][1] == 0.0
  assert per_example['rouge1'][0] == pytest.approx(2 * 0.5 * 1.0 / 1.5)  # P 1, R 1/2
  assert metrics.rouge(targets, predictions)['rouge1'] == 100 * per_example['rouge1'].mean()
