"""A tiny DDTP corpus (the packaged Translation excerpt, a 300-piece vocabulary) for the scripts."""

import pytest

from gqa_spec.data import corpus


@pytest.fixture(scope='session')
def tiny_data_dir(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp('ddtp'))
  corpus.prepare(corpus.SAMPLE_LISTS_DIR, data_dir, vocab_size=300,
                 fractions=corpus.SAMPLE_FRACTIONS)
  return data_dir
