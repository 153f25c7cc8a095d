"""`gqa-spec calibrate --report-only` leaves committed results alone (issue 62): it writes to the
work dir unless `--out` says otherwise, and never replaces a calibration.json holding more finished
points than the work dir has, unless `--force`."""

import hashlib
import json
import os
import shutil

from gqa_spec import cli
from gqa_spec.reproduce import calibration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ('calibration.json', 'calibration.md', 'calibration.png')


def _digests(directory) -> dict:
  out = {}
  for name in NAMES:
    with open(os.path.join(directory, name), 'rb') as f:
      out[name] = hashlib.sha256(f.read()).hexdigest()
  return out


def test_report_only_keeps_committed_results(tmp_path, monkeypatch, capsys):
  committed = os.path.join(REPO, 'results', 'cpu')
  before = _digests(committed)
  with open(os.path.join(committed, 'calibration.json'), encoding='utf-8') as f:
    assert calibration.finished_points(json.load(f)) > 0  # the committed study has points
  # A fresh clone: the committed results, no runs/cpu work dir.
  shutil.copytree(committed, tmp_path / 'results' / 'cpu')
  monkeypatch.chdir(tmp_path)

  # As the page writes it: the report goes to the work dir, results/cpu is untouched.
  assert cli.main(['calibrate', '--preset', 'cpu', '--report-only']) == 0
  assert 'runs/cpu/calibration.md' in capsys.readouterr().out
  assert _digests(tmp_path / 'results' / 'cpu') == before
  with open(tmp_path / 'runs' / 'cpu' / 'calibration.json', encoding='utf-8') as f:
    assert calibration.finished_points(json.load(f)) == 0

  # Pointed at the committed results: refused in one line, nothing written.
  assert cli.main(['calibrate', '--preset', 'cpu', '--report-only', '--out', 'results/cpu']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('gqa-spec: error: results/cpu/calibration.json holds')
  assert '--force' in err[0]
  assert _digests(tmp_path / 'results' / 'cpu') == before
  # Training (the default command) from the empty work dir is refused as well, before it trains.
  assert cli.main(['calibrate', '--preset', 'cpu', '--sweeps', 'pretrain.target']) == 2
  assert 'holds' in capsys.readouterr().err
  assert _digests(tmp_path / 'results' / 'cpu') == before

  # --force replaces it.
  assert cli.main(['calibrate', '--preset', 'cpu', '--report-only', '--out', 'results/cpu',
                   '--force']) == 0
  with open(tmp_path / 'results' / 'cpu' / 'calibration.json', encoding='utf-8') as f:
    assert calibration.finished_points(json.load(f)) == 0
  assert _digests(committed) == before  # the repository's own files, for good measure
