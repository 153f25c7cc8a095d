"""`gqa-spec <command>`: one entry point; each concept registers its own sub-commands.

A module listed in `_COMMAND_MODULES` defines `register(subparsers)`, adding parsers whose
`func(args) -> int` runs the command. Bad input (`UserError`, `ValueError`, `FileNotFoundError`)
ends in a one-line `gqa-spec: error: ...` and exit code 2; set GQA_SPEC_DEBUG=1 for the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional, Sequence

# TensorFlow (seqio's input pipelines) logs CUDA probing and oneDNN notices from C++ at import;
# they say nothing to a CPU user. An explicit TF_CPP_MIN_LOG_LEVEL wins (see `console.setup`).
_USER_TF_LEVEL = 'TF_CPP_MIN_LOG_LEVEL' in os.environ
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

_COMMAND_MODULES = (
    'gqa_spec.checkpoints.commands',  # import-hf, export-hf, import-t5x, convert
    'gqa_spec.decoding.commands',  # generate, ngram
    'gqa_spec.training.commands',  # train, uptrain, eval
    'gqa_spec.training.draft_commands',  # train-draft
    'gqa_spec.data.commands',  # data fetch, prepare, show, vocab, list
    'gqa_spec.reproduce.commands',  # reproduce
    'gqa_spec.status',  # status
)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='gqa-spec',
      description='Grouped-query attention and speculative decoding for T5.1.1 (JAX/Flax).')
  parser.add_argument('--verbose', action='store_true',
                      help="show the libraries' logs (TensorFlow's device probing, orbax, seqio)")
  subparsers = parser.add_subparsers(dest='command', metavar='COMMAND')
  subparsers.required = True
  for name in _COMMAND_MODULES:
    importlib.import_module(name).register(subparsers)
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  from gqa_spec import console  # pylint: disable=g-import-not-at-top
  console.setup(getattr(args, 'verbose', False), _USER_TF_LEVEL)
  try:
    return int(args.func(args) or 0)
  except (ValueError, FileNotFoundError, NotADirectoryError, KeyError) as e:
    if os.environ.get('GQA_SPEC_DEBUG'):
      raise
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f'gqa-spec: error: {message}', file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print('gqa-spec: interrupted', file=sys.stderr)
    return 130


if __name__ == '__main__':
  sys.exit(main())
