"""benchmarks.common's A/B protocol: what the children of a benchmark are given."""

import os
import subprocess
import sys

from benchmarks import common


def test_child_argv_drops_the_ab_arguments_in_both_spellings():
  argv = ['--settings', 'pretrain', '--baseline', 'HEAD~1', '--rounds=3', '--steps', '4',
          '--out', 'x/y', '--batch=1,8']
  assert common.child_argv(argv) == ['--settings', 'pretrain', '--steps', '4', '--batch=1,8']
  # a value equal to a dropped flag's name is kept when it is not that flag's value
  assert common.child_argv(['--kv', 'mha', '--out=o']) == ['--kv', 'mha']


def test_children_run_the_benchmark_module_without_the_working_directory_first():
  file = os.path.join(common.REPO, 'benchmarks', 'decode.py')
  cmd = common.child_command(file, '/tmp/rows.json', ['--kv', 'mqa'])
  # -P: the child's `gqa_spec` is the one first on PYTHONPATH, not the working directory's.
  assert cmd == [sys.executable, '-P', '-m', 'benchmarks.decode', '--child-out',
                 '/tmp/rows.json', '--kv', 'mqa']
  assert common.command(file, ['--kv', 'mqa']) == 'python -m benchmarks.decode --kv mqa'
  assert common.command(file, []) == 'python -m benchmarks.decode'
  assert common.command(file, ['--trees', 'topk:2;best:4']) == (
      "python -m benchmarks.decode --trees 'topk:2;best:4'")


def test_a_child_imports_the_gqa_spec_of_its_code_dir_from_the_repository_root(tmp_path):
  baseline = tmp_path / 'gqa_spec'
  baseline.mkdir()
  (baseline / '__init__.py').write_text('')
  # The flags of child_command before `-m`, with `-c` for the module: only the imports are checked.
  flags = common.child_command('x.py', 'out', [])[:2]
  out = subprocess.run(
      [*flags, '-c', 'import benchmarks, gqa_spec; print(gqa_spec.__file__, benchmarks.__file__)'],
      cwd=common.REPO, env=common.child_env(str(tmp_path)), check=True, capture_output=True,
      text=True).stdout.split()
  assert out == [str(baseline / '__init__.py'),
                 os.path.join(common.REPO, 'benchmarks', '__init__.py')]
