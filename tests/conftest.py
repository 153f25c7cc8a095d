"""Fixtures shared across test packages."""

import os

import pytest


@pytest.fixture(scope='session')
def smoke_run(tmp_path_factory):
  """One `gqa-spec reproduce --preset smoke` per test session (about 5 minutes on 2 CPU cores).

  Returns:
    (out_dir, work_dir) as strings: the results (stage JSON, report.md, PNGs) and the models + data.
  """
  from gqa_spec.reproduce import pipeline  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('smoke_run')
  out_dir, work_dir = os.path.join(root, 'results'), os.path.join(root, 'work')
  pipeline.run('smoke', out_dir=out_dir, work_dir=work_dir, progress_bar=False)
  return out_dir, work_dir
