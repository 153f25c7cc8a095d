"""`gqa-spec <command>`: one entry point; each concept registers its own sub-commands.

A module listed in `_COMMAND_MODULES` defines `register(subparsers)`, adding parsers whose
`func(args) -> int` runs the command. Bad input (`UserError`, `ValueError`, `FileNotFoundError`)
ends in a one-line `gqa-spec: error: ...` and exit code 2; set GQA_SPEC_DEBUG=1 for the traceback.
Ctrl-C (SIGINT) and SIGTERM at any moment end in one line and exit code 130 / 143 (a training run
saves first: its own handler turns them into a stop request). As the process's command (`argv`
None) the exit skips the interpreter's finalisation, which could crash (exit 139) while XLA's
compilation or compute threads were still running.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
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


class _Terminated(KeyboardInterrupt):
  """SIGTERM, raised as an interrupt so that every `finally` (locks, pending saves) still runs."""


def _terminate(signum, frame):
  del signum, frame
  raise _Terminated()


def _exit_at_once(signum, frame):
  del frame
  os._exit(128 + signum)  # pylint: disable=protected-access


def main(argv: Optional[Sequence[str]] = None) -> int:
  in_main_thread = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, _terminate) if in_main_thread else None
  try:
    code = _run(argv)
    if argv is None and in_main_thread:  # done: a signal while Python shuts down just exits
      for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_at_once)
      previous = None
    return code
  except KeyboardInterrupt as e:  # SIGINT or SIGTERM, at any moment: imports, compilation, decode
    code = 143 if isinstance(e, _Terminated) else 130
    if argv is None:  # a second signal must not interrupt the way out
      signal.signal(signal.SIGINT, signal.SIG_IGN)
      signal.signal(signal.SIGTERM, signal.SIG_IGN)
      previous = None
    print(f'gqa-spec: {"terminated" if code == 143 else "interrupted"}', file=sys.stderr)
    if argv is None:  # the process's own command: leave now, before XLA's threads are torn down
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)  # pylint: disable=protected-access
    return code
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)


def _run(argv: Optional[Sequence[str]]) -> int:
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


if __name__ == '__main__':
  sys.exit(main())
