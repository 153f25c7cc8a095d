"""benchmarks/data_export.py on a tiny corpus: the rows it reports and what they are computed from."""

import json

import pytest

from benchmarks import data_export


def test_rows_and_sizes(tmp_path):
  out = str(tmp_path / 'd')
  data_export.main(['--examples', '40', '--reads', '20', '--batches', '2', '--batch-size', '2',
                    '--repeats', '1', '--out', out])
  report = json.load(open(out + '.json'))
  rows = {r['format']: r for r in report['rows']}
  assert report['command'].startswith('python -m benchmarks.data_export --examples 40')
  # uint16 tokens (2 bytes) plus two int64 offsets per example over ~300 tokens an example.
  assert 2.0 < rows['npy']['bytes_per_token'] < 2.2
  assert rows['npy']['examples_per_s'] > 0
  assert rows['pipeline']['tokens_per_s'] == pytest.approx(
      rows['pipeline']['rows_per_s'] * sum(data_export.LENGTHS.values()))
  assert '| npy |' in open(out + '.md').read()
