"""`gqa-spec <command>`: one entry point; each concept registers its own sub-commands.

A module listed in `_COMMAND_MODULES` defines `register(subparsers)`, adding parsers whose
`func(args) -> int` runs the command. Bad input (`UserError`, `ValueError`, `FileNotFoundError`)
and any other `OSError` (a full disk: path, reason and errno) end in a one-line
`gqa-spec: error: ...` and exit code 2; set GQA_SPEC_DEBUG=1 for the traceback.
Ctrl-C (SIGINT) and SIGTERM at any moment end in one line and exit code 130 / 143 (a training run
saves first: its own handler turns them into a stop request, and it exits 0). As the process's
command (`argv` None) the exit skips the interpreter's finalisation, which could crash (exit 139)
while XLA's compilation or compute threads were still running.
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import os
import re
import signal
import sys
import threading
import weakref
from typing import Optional, Sequence

from gqa_spec import distributed

# TensorFlow (seqio's input pipelines) logs CUDA probing and oneDNN notices from C++ at import;
# they say nothing to a CPU user. An explicit TF_CPP_MIN_LOG_LEVEL wins (see `console.setup`).
_USER_TF_LEVEL = 'TF_CPP_MIN_LOG_LEVEL' in os.environ
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# Each module defines `register(subparsers)`; the commands it adds (`test_cli_commands` checks this
# table against what they register).
_COMMAND_MODULES = {
    'gqa_spec.checkpoints.commands': ('import-hf', 'export-hf', 'import-t5x', 'convert'),
    'gqa_spec.decoding.commands': ('generate', 'ngram'),
    'gqa_spec.training.commands': ('train', 'uptrain', 'eval', 'infer'),
    'gqa_spec.training.draft_commands': ('train-draft',),
    'gqa_spec.data.commands': ('data',),  # data fetch, prepare, show, vocab, list
    'gqa_spec.reproduce.commands': ('reproduce', 'calibrate'),
    'gqa_spec.status': ('status',),
}


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
  """The command line's parser: every command's, or only `command`'s where it names one.

  `main` asks for the command its arguments name: importing every command module (the training
  stack, seqio's metrics) took ~1.4 s of each process's start-up, whatever it ran. Anything else
  (no command, `--help`, a misspelt one) gets every command, for the usage and the error.
  """
  parser = argparse.ArgumentParser(
      prog='gqa-spec',
      description='Grouped-query attention and speculative decoding for T5.1.1 (JAX/Flax).')
  parser.add_argument('--verbose', action='store_true',
                      help="show the libraries' logs (TensorFlow's device probing, orbax, seqio)")
  subparsers = parser.add_subparsers(dest='command', metavar='COMMAND')
  subparsers.required = True
  modules = [m for m, names in _COMMAND_MODULES.items() if command in names] or _COMMAND_MODULES
  for name in modules:
    importlib.import_module(name).register(subparsers)
  return parser


def _command_of(argv: Sequence[str]) -> Optional[str]:
  """The command `argv` names: its first argument that is not an option (the only option before
  a command, `--verbose`, takes no value)."""
  return next((a for a in argv if not a.startswith('-')), None)


class _Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM, raised as an interrupt so that every `finally` (locks, saves) still runs."""


# Test hook: a file `main` creates once its signal handlers are installed (before that, a signal
# meets Python's own start-up: site imports, the console script's import of this module).
READY_ENV = 'GQA_SPEC_TEST_SIGNALS_READY'
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_RETRY_SECONDS = 0.5
_pending = None  # the exit code (128 + signal) of a signal whose interrupt was not handled yet
# Functions an interrupt must not be raised in (`_interrupt`): finalizers, and asyncio's scheduling
# from other threads and C callbacks (one of 6 signals in a CI run printed a traceback from there).
_NO_INTERRUPT = frozenset({'__del__', 'call_soon_threadsafe'})
# ... nor anywhere in weakref.py: `weakref.finalize.__call__` and the weak dictionaries' removal
# callbacks run from a dying object's weakref, where Python prints and swallows an exception (a CI
# run printed "Exception ignored in: <finalize object ...>" with the interrupt's traceback).
_NO_INTERRUPT_FILES = (weakref.__file__,)


def _interrupt(signum, frame):
  """Raises the interrupt, and again every `_RETRY_SECONDS` (SIGALRM) until `main` handles it.

  Not inside a gc callback or a `__del__`, where Python would print and swallow it ("Exception
  ignored in ...": jax's gc callback runs often), nor inside an import, where it would turn into the
  module's own error and traceback (numpy prints one, jaxlib's extension an ImportError), nor inside
  asyncio's `call_soon_threadsafe`, which a C extension calls back into (orbax's tensorstore
  futures, while a checkpoint loads) and which then prints the interrupt's traceback: there the
  interrupt waits for the next retry.
  """
  global _pending
  if signum in _SIGNALS:
    _pending = 128 + signum
  if _pending is None:
    return
  signal.setitimer(signal.ITIMER_REAL, _RETRY_SECONDS)
  if signum == signal.SIGALRM and isinstance(sys.exc_info()[1], KeyboardInterrupt):
    return  # the interrupt is on its way out (in an `except` or `finally`): let cleanup run
  callbacks = {getattr(callback, '__code__', None) for callback in gc.callbacks}
  while frame is not None:
    code = frame.f_code
    if (code in callbacks or code.co_name in _NO_INTERRUPT or
        code.co_filename in _NO_INTERRUPT_FILES or code.co_filename.startswith('<frozen importlib')):
      return
    frame = frame.f_back
  raise _Interrupted()


def _quiet(previous_hook, exception_of, active):
  """Wraps one of Python's last-resort error hooks (`sys.unraisablehook`, `sys.excepthook`, which
  C extensions' `PyErr_Print` calls, `threading.excepthook`) while `main` runs (`active[0]`).

  It drops an interrupt Python swallowed (raised in a weakref callback, a `__del__` or a gc callback
  that `_interrupt`'s frame checks did not recognise: the signal stays pending and the next retry
  raises it where it propagates), and, once a signal is pending, every error of the work it cut
  short (tensorstore's reads calling back into orbax's closed event loop printed a traceback after
  "gqa-spec: terminated" in a run of tests/test_signals.py). Everything else goes to `previous_hook`.
  """

  def hook(*args):
    if active[0] and (isinstance(exception_of(*args), _Interrupted) or _pending is not None):
      return
    previous_hook(*args)

  return hook


def _install_quiet_hooks():
  """Installs `_quiet` on the three hooks; returns a function that undoes it: it puts a previous
  hook back where `_quiet`'s is still the current one, and otherwise (a filter installed on top
  meanwhile, `checkpoints.aborted_reads`) leaves the chain and only turns `_quiet`'s off."""
  active = [True]
  hooks = ((sys, 'unraisablehook', lambda unraisable: unraisable.exc_value),
           (sys, 'excepthook', lambda kind, value, traceback: value),
           (threading, 'excepthook', lambda args: args.exc_value))
  installed = []
  for owner, name, exception_of in hooks:
    previous = getattr(owner, name)
    mine = _quiet(previous, exception_of, active)
    setattr(owner, name, mine)
    installed.append((owner, name, previous, mine))

  def restore():
    active[0] = False
    for owner, name, previous, mine in installed:
      if getattr(owner, name) is mine:
        setattr(owner, name, previous)

  return restore


def _exit_at_once(signum, frame):
  del frame
  os._exit(128 + signum)  # pylint: disable=protected-access


def main(argv: Optional[Sequence[str]] = None) -> int:
  global _pending
  previous = {}
  restore_hooks = lambda: None
  if threading.current_thread() is threading.main_thread():
    _pending = None
    for sig in _SIGNALS + (signal.SIGALRM,):
      previous[sig] = signal.signal(sig, _interrupt)
    restore_hooks = _install_quiet_hooks()
  try:
    try:
      if previous and os.environ.get(READY_ENV):
        open(os.environ[READY_ENV], 'w').close()  # pylint: disable=consider-using-with
      code = _run(argv)
    except KeyboardInterrupt:  # SIGINT or SIGTERM, at any moment: imports, compilation, decode
      code = None
    except Exception:  # pylint: disable=broad-except
      if _pending is None:
        raise
      code = None  # the interrupt turned into another error (an extension module's ImportError)
    if previous:  # no more retries from here on
      signal.signal(signal.SIGALRM, signal.SIG_IGN)
      signal.setitimer(signal.ITIMER_REAL, 0)
    if code is not None and _pending is None:
      if argv is None and previous:  # done: a signal while Python shuts down just exits
        for sig in _SIGNALS:
          signal.signal(sig, _exit_at_once)
          del previous[sig]
      return code
    code = _pending or 130  # 130: someone else's KeyboardInterrupt (the trainer's second Ctrl-C)
    if argv is None and previous:  # a second signal must not interrupt the way out
      for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
        del previous[sig]
    sys.stderr.write(f'gqa-spec: {"terminated" if code == 143 else "interrupted"}\n')
    if argv is None:  # the process's own command: leave now, before XLA's threads are torn down
      sys.stdout.flush()
      sys.stderr.flush()
      os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # other threads' dying words (orbax's loop)
      os._exit(code)  # pylint: disable=protected-access
    return code
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    restore_hooks()


def _gin_files(option: str, value: str, search: Sequence[str]) -> list:
  """For `distributed.fingerprint`: `(name, path)` of the file a `--gin_file` value resolves to on
  the search path, and of the files its `include` lines name, recursively (what each process will
  parse), each under the name it is written with."""
  if option != '--gin_file':
    return []
  from gqa_spec.training import gin_utils  # pylint: disable=g-import-not-at-top  (stdlib only)
  paths, found, todo = gin_utils.search_paths(search), {}, [(value, value)]
  while todo and len(found) < 100:
    name, written = todo.pop(0)
    try:
      path = gin_utils._resolve(written, paths)  # pylint: disable=protected-access
    except ValueError:  # not found: the command itself says so, on every process
      continue
    if path in found:
      continue
    found[path] = name
    try:
      with open(path, encoding='utf-8', errors='replace') as f:
        todo += [(f'{name} (include {m.group(1)})', m.group(1))
                 for m in _INCLUDE.finditer(f.read())]
    except OSError:
      pass
  return [(name, path) for path, name in found.items()]


_INCLUDE = re.compile(r'''^\s*include\s+['"]([^'"]+)['"]''', re.M)


def _run(argv: Optional[Sequence[str]]) -> int:
  parser = build_parser(_command_of(sys.argv[1:] if argv is None else argv))
  args = parser.parse_args(argv)
  from gqa_spec import console  # pylint: disable=g-import-not-at-top
  console.setup(getattr(args, 'verbose', False), _USER_TF_LEVEL)
  # what this process was given, compared across the processes when a command starts several
  # (`distributed.agree`, run by `distributed.initialize`): one check for every command
  given = list(sys.argv[1:] if argv is None else argv)
  search = [p for p in (getattr(args, 'gin_search_paths', '') or '').split(',') if p]
  distributed.expect(lambda: distributed.fingerprint(
      given, lambda option, value: _gin_files(option, value, search)))
  try:
    return int(args.func(args) or 0)
  except (ValueError, FileNotFoundError, NotADirectoryError, KeyError) as e:
    if os.environ.get('GQA_SPEC_DEBUG'):
      raise
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f'gqa-spec: error: {message}', file=sys.stderr)
    return 2
  except OSError as e:  # a write no helper wraps (an append to a log on a full disk): one line
    if os.environ.get('GQA_SPEC_DEBUG'):
      raise
    name = errno.errorcode.get(e.errno or 0, 'no errno')
    where = f'{e.filename}: ' if e.filename else ''
    print(f'gqa-spec: error: {where}{e.strerror or e} ({name})', file=sys.stderr)
    return 2
  finally:
    distributed.expect(None)


if __name__ == '__main__':
  sys.exit(main())
