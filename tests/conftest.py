"""Fixtures shared across test packages."""

import os

import pytest


@pytest.fixture(scope='session')
def smoke_run(tmp_path_factory):
  """One `gqa-spec reproduce --preset smoke` per test session (about 5 minutes on 2 CPU cores).

  `GQA_SPEC_SMOKE_RUN=OUT_DIR:WORK_DIR` names an existing smoke reproduction to reuse (`.ci/run`
  passes the one the README's first command just made): the stages are cached, so `pipeline.run`
  only checks them (and finishes any that are missing). Unset, the session makes its own.

  Returns:
    (out_dir, work_dir) as strings: the results (stage JSON, report.md, PNGs) and the models + data.
  """
  from gqa_spec.reproduce import pipeline  # pylint: disable=g-import-not-at-top
  reuse = os.environ.get('GQA_SPEC_SMOKE_RUN')
  if reuse:
    out_dir, sep, work_dir = reuse.partition(':')
    if not (sep and out_dir and work_dir):
      raise ValueError(f'GQA_SPEC_SMOKE_RUN={reuse!r}: expected OUT_DIR:WORK_DIR')
  else:
    root = tmp_path_factory.mktemp('smoke_run')
    out_dir, work_dir = os.path.join(root, 'results'), os.path.join(root, 'work')
  pipeline.run('smoke', out_dir=out_dir, work_dir=work_dir, progress_bar=False)
  return out_dir, work_dir


@pytest.fixture(scope='session')
def tiny_data_dir(tmp_path_factory):
  """A tiny DDTP corpus (the packaged Translation excerpt, a 300-piece vocabulary) for real-data
  runs (training, the t5x-style scripts)."""
  from gqa_spec.data import corpus  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path_factory.mktemp('ddtp'))
  corpus.prepare(corpus.SAMPLE_LISTS_DIR, data_dir, vocab_size=300,
                 fractions=corpus.SAMPLE_FRACTIONS)
  return data_dir


@pytest.fixture(scope='module', autouse=True)
def _release_compiled_executables():
  """Drops JAX's compiled executables after a test module once the process holds many memory maps.

  XLA:CPU maps each executable's code and data into its own memory regions (3 per compiled
  module), and JAX's caches keep every executable alive for the life of the process. The whole
  suite compiles tens of thousands of them; one process then passes Linux's default
  `vm.max_map_count` (65530) about half-way through the suite and segfaults inside the next
  compilation. Clearing after *every* module kept the count low but made later modules recompile
  the loops and models they share with earlier ones; the reproduction's threshold
  (`jobs.MAPS_BEFORE_RELEASE`, a quarter of the limit) keeps both.
  """
  yield
  from gqa_spec.reproduce import jobs  # pylint: disable=g-import-not-at-top
  jobs.release_compiled()
