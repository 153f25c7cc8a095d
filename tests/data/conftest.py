"""Shared fixtures: a tiny DDTP corpus prepared once from the checked-in Translation excerpts."""

import os

import pytest

from gqa_spec.data import corpus

FIXTURES = corpus.SAMPLE_LISTS_DIR
TINY_FRACTIONS = corpus.SAMPLE_FRACTIONS


@pytest.fixture(scope='session')
def tiny_corpus(tmp_path_factory):
  """(data_dir, stats) of a corpus + 300-piece vocabulary built from the packaged DDTP excerpt."""
  data_dir = str(tmp_path_factory.mktemp('ddtp'))
  stats = corpus.prepare(FIXTURES, data_dir, vocab_size=300, fractions=TINY_FRACTIONS)
  return data_dir, stats
