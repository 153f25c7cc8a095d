"""`cli.build_parser` imports only the module of the command it is asked for.

`cli._COMMAND_MODULES` names the commands each module registers; a module that adds, renames or
drops a command without the table would make `main` miss it, so the table is checked against what
the modules register. A `generate` process no longer imports the training stack (it took ~1.4 s
of every command's start-up).
"""

import argparse
import importlib
import subprocess
import sys

import pytest

from gqa_spec import cli


def test_the_table_names_what_each_module_registers():
  for module, names in cli._COMMAND_MODULES.items():  # pylint: disable=protected-access
    subparsers = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(module).register(subparsers)
    assert tuple(subparsers.choices) == names, module
  every = cli.build_parser()._subparsers._group_actions[0].choices  # pylint: disable=protected-access
  assert list(every) == [n for names in cli._COMMAND_MODULES.values() for n in names]  # pylint: disable=protected-access


@pytest.mark.parametrize('argv, command', [
    (['generate', '--model', 'm'], 'generate'), (['--verbose', 'train-draft', '-h'], 'train-draft'),
    (['--help'], None), ([], None), (['data', 'list'], 'data')])
def test_command_of(argv, command):
  assert cli._command_of(argv) == command  # pylint: disable=protected-access


def test_one_command_parser_parses_as_the_full_one():
  argv = ['--verbose', 'generate', '--model', 'm', '--inputs', 'i.jsonl', '--out', 'o.jsonl',
          '--gamma', '3']
  one = cli.build_parser('generate')
  assert list(one._subparsers._group_actions[0].choices) == ['generate', 'ngram']  # pylint: disable=protected-access
  assert vars(one.parse_args(argv)) == vars(cli.build_parser().parse_args(argv))
  # an unknown command gets every command, for argparse's error listing them
  assert 'train' in cli.build_parser('trian')._subparsers._group_actions[0].choices  # pylint: disable=protected-access


def test_generate_does_not_import_the_training_stack(tmp_path):
  code = ('import sys\nfrom gqa_spec import cli\n'
          'cli.build_parser(cli._command_of(["generate", "--help"]))\n'
          'print(sorted(m for m in sys.modules if m.startswith("gqa_spec.training")))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                       cwd=tmp_path)
  assert out.stdout.strip() == '[]', out.stdout


def test_unknown_command_is_argparse_error_listing_every_command(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(['trian'])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "invalid choice: 'trian'" in err and "'train'" in err and "'generate'" in err
