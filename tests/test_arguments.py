"""Output paths and numeric flags checked before any work (`gqa_spec.arguments`)."""

import argparse
import os

import pytest

from gqa_spec import arguments
from gqa_spec.errors import UserError


def test_output_paths(tmp_path, monkeypatch):
  inputs = tmp_path / 'x.jsonl'
  inputs.write_text('{"input_ids": [5]}\n')
  ok = {'--out': str(tmp_path / 'o.jsonl'), '--stats': str(tmp_path / 's.json')}
  arguments.check_outputs(ok, inputs={'--inputs': str(inputs)})
  arguments.check_outputs({'--out': str(inputs)})  # an existing file is replaced: no input named
  cases = [
      ({'--out': str(inputs)}, 'would replace the input --inputs'),
      ({'--out': str(tmp_path / '.' / 'x.jsonl')}, 'would replace the input --inputs'),
      ({'--out': ok['--out'], '--stats': ok['--out']}, '--stats and --out are the same path'),
      ({'--out': str(tmp_path)}, 'is a folder'),
      ({'--out': str(tmp_path / 'no' / 'o.jsonl')}, 'does not exist'),
      ({'--out': ok['--out'], '--stats': str(tmp_path / 'no' / 's.json')}, '--stats'),
  ]
  for outputs, message in cases:
    with pytest.raises(UserError, match=message):
      arguments.check_outputs(outputs, inputs={'--inputs': str(inputs)})
  # This machine runs the tests as root, whom permission bits do not stop: os.access stands in.
  readonly = str(tmp_path / 'ro')
  os.mkdir(readonly)
  real_access = os.access
  monkeypatch.setattr(arguments.os, 'access',
                      lambda p, mode: p != readonly and real_access(p, mode))
  with pytest.raises(UserError, match='not writable'):
    arguments.check_outputs({'--out': os.path.join(readonly, 'o.jsonl')})
  assert inputs.read_text() == '{"input_ids": [5]}\n'


def test_output_directories(tmp_path):
  ckpt = tmp_path / 'ckpt'
  ckpt.mkdir()
  arguments.check_outputs({'OUT_DIR': str(tmp_path / 'new' / 'deeper')}, directories=True)
  arguments.check_outputs({'OUT_DIR': str(tmp_path / 'out')}, inputs={'CKPT_DIR': str(ckpt)},
                          directories=True)
  for out in (ckpt, tmp_path):  # the input itself, or a folder holding it (replacing deletes it)
    with pytest.raises(UserError, match='would replace the input CKPT_DIR'):
      arguments.check_outputs({'OUT_DIR': str(out)}, inputs={'CKPT_DIR': str(ckpt)},
                              directories=True)


@pytest.mark.parametrize('kind,text,message', [
    (arguments.positive_int, '-3', 'must be >= 1, got -3'),
    (arguments.positive_int, '0', 'must be >= 1, got 0'),
    (arguments.positive_int, '2.5', "expected an integer, got '2.5'"),
])
def test_numeric_flags_name_themselves(kind, text, message, capsys):
  parser = argparse.ArgumentParser(prog='gqa-spec data show')
  parser.add_argument('-n', type=kind)
  with pytest.raises(SystemExit) as info:
    parser.parse_args(['-n', text])
  assert info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err == f'gqa-spec data show: error: argument -n: {message}'
  assert parser.parse_args(['-n', '4']).n == 4


def test_data_export_checks_its_output_before_reading_a_task(tmp_path, capsys):
  from gqa_spec import cli  # pylint: disable=g-import-not-at-top
  afile = tmp_path / 'afile'
  afile.write_text('keep')
  code = cli.main(['data', 'export', 'no_such_task', '--out', str(afile)])
  assert code != 0 and 'is a file; give an export directory' in capsys.readouterr().err
  assert afile.read_text() == 'keep'
  # a new path (missing parents are made) passes the check and fails on the task instead
  code = cli.main(['data', 'export', 'no_such_task', '--out', str(tmp_path / 'no' / 'such')])
  assert code != 0 and 'is a file' not in capsys.readouterr().err
  with pytest.raises(SystemExit):
    cli.main(['data', 'export', 'no_such_task', '--out', str(tmp_path / 'x'),
              '--max-examples', '0'])
  assert 'argument --max-examples: must be >= 1, got 0' in capsys.readouterr().err


def test_a_relative_output_folder_that_does_not_exist_yet_is_checked(tmp_path, monkeypatch):
  """`eval` run with OUTPUT_DIR=eval/run1 in a fresh working directory (as each process of a
  multi-process run does): the missing folders are found writable at the working directory, and
  the check ends (it once looked for an existing parent of '' forever)."""
  import threading  # pylint: disable=g-import-not-at-top
  from gqa_spec import arguments  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'ckpt').mkdir()
  done = []
  thread = threading.Thread(target=lambda: done.append(arguments.check_outputs(
      {'OUTPUT_DIR': os.path.join('eval', 'run1')}, folders=True,
      inputs={'CHECKPOINT_PATH': 'ckpt'})), daemon=True)
  thread.start()
  thread.join(30)
  assert done == [None]
  with pytest.raises(UserError, match=r'^OUTPUT_DIR ckpt/eval lies inside the input CHECKPOINT_PATH'):
    arguments.check_outputs({'OUTPUT_DIR': os.path.join('ckpt', 'eval')}, folders=True,
                            inputs={'CHECKPOINT_PATH': 'ckpt'})
