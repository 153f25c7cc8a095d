"""benchmarks/ab.py: what the A/B children of a benchmark are given."""

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load():
  spec = importlib.util.spec_from_file_location('ab', os.path.join(REPO, 'benchmarks', 'ab.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_child_argv_drops_the_ab_arguments_in_both_spellings():
  ab = load()
  argv = ['--settings', 'pretrain', '--baseline', 'HEAD~1', '--rounds=3', '--steps', '4',
          '--out', 'x/y', '--batch=1,8']
  assert ab.child_argv(argv) == ['--settings', 'pretrain', '--steps', '4', '--batch=1,8']
  # a value equal to a dropped flag's name is kept when it is not that flag's value
  assert ab.child_argv(['--kv', 'mha', '--out=o']) == ['--kv', 'mha']
