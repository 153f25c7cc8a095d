"""Shared fixtures: a tiny DDTP corpus prepared once from the checked-in Translation excerpts."""

import os

import pytest

from gqa_spec.data import corpus

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'testdata', 'ddtp')
# The excerpt has ~70 records: wide validation/test fractions so every split has examples.
TINY_FRACTIONS = (('train', 0.6), ('validation', 0.2), ('test', 0.2))


@pytest.fixture(scope='session')
def tiny_corpus(tmp_path_factory):
  """(data_dir, stats) of a corpus + 300-piece vocabulary built from tests/testdata/ddtp."""
  data_dir = str(tmp_path_factory.mktemp('ddtp'))
  stats = corpus.prepare(FIXTURES, data_dir, vocab_size=300, fractions=TINY_FRACTIONS)
  return data_dir, stats
