"""Command-line argument checks that run before any work: numeric flags and output paths.

Standard-library only (a leaf layer). Numeric flags take an argparse `type` that names the flag in
its error (`argument -n: must be >= 1, got -3`); output paths go through `check_outputs` before a
model is loaded, so a bad path never costs a decode.

  p.add_argument('-n', type=arguments.positive_int, default=3)
  arguments.check_outputs({'--out': args.out, '--stats': args.stats}, inputs={'--inputs': path})
"""

from __future__ import annotations

import argparse
import filecmp
import os
from typing import Mapping, Optional

from gqa_spec import atomic
from gqa_spec.errors import UserError


# Layer layouts a loaded model can be given (`models/layout.py`): T5X's `layers_0..` or one scanned
# stack per encoder/decoder (`T5Config.scan_layers`). `--layout` flags take these.
LAYOUTS = ('unrolled', 'scanned')


def positive_int(text: str) -> int:
  """An argparse `type`: an integer >= 1 (argparse names the flag in the error)."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'expected an integer, got {text!r}') from None
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be >= 1, got {value}')
  return value


def _same(a: str, b: str) -> bool:
  return os.path.realpath(a) == os.path.realpath(b)


def _input_path(spec: Optional[str]) -> Optional[str]:
  """The local path an input flag names: itself, the PATH of a `KIND:PATH` spec (`--draft
  unigram:PATH`), or None (not given, not a path: `--draft copy`, a URL)."""
  if not spec or '://' in spec:
    return None
  if os.path.lexists(spec):
    return spec
  kind, _, rest = spec.partition(':')
  return rest if rest and kind.isidentifier() and os.path.lexists(rest) else None


def check_outputs(outputs: Mapping[str, Optional[str]],
                  inputs: Mapping[str, Optional[str]] = (), directories: bool = False,
                  folders: bool = False) -> None:
  """Raises `UserError` unless every output path can be written without losing data.

  The one check of every command that writes: an output never lies inside an input (the model,
  the draft, a run directory, a vocabulary: `generate --out MODEL/config.json` would break the
  model), never is a folder where a file is due, and its folder exists and is writable, before any
  work starts. `-` and streams (`/dev/null`, `/dev/stdout`, a FIFO: `atomic.is_stream`) are
  written in place and pass.

  Args:
    outputs: flag name -> output path (None: not given, skipped).
    inputs: flag name -> input path (or `KIND:PATH` spec) the outputs must not replace or lie
      inside (None, or not a local path: skipped).
    directories: the outputs are directories (created by the command; an existing one is the
      command's `--overwrite` business), not files.
    folders: the outputs are folders the command writes its files into (`eval`'s OUTPUT_DIR:
      created when missing, other files in it kept).
  """
  inputs = {name: _input_path(spec) for name, spec in dict(inputs or {}).items()}
  given = [(name, path) for name, path in outputs.items() if path]
  for i, (name, path) in enumerate(given):
    if atomic.is_stream(path):
      continue
    for in_name, in_path in inputs.items():
      if not in_path:
        continue
      if (_same(path, in_path) and not folders) or (directories and _inside(in_path, path)):
        raise UserError(f'{name} {path} would replace the input {in_name}; write elsewhere')
      if _inside(path, in_path):
        raise UserError(f'{name} {path} lies inside the input {in_name} {in_path}; write '
                        'elsewhere')
    for other, other_path in given[:i]:
      if _same(path, other_path):
        raise UserError(f'{name} and {other} are the same path {path}; give two paths')
    if folders:
      if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f'{name} {path} is a file; give a folder')
    elif not directories and os.path.isdir(path):
      raise UserError(f'{name} {path} is a folder; give a file path')
    target = os.path.abspath(atomic.final_target(path))  # a link's target is what is replaced
    parent = target if folders else os.path.dirname(target)
    while (directories or folders) and not os.path.exists(parent) and parent != os.path.dirname(
        parent):  # missing parents are made (the root always exists)
      parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
      raise UserError(f'{name} {path}: folder {parent} does not exist')
    reason = atomic.unwritable(parent)
    if reason is None and os.path.exists(target) and not (directories or folders) and not (
        os.access(target, os.W_OK)):
      reason = 'permission denied'
    if reason:
      raise UserError(f'{name} {path}: not writable ({reason})' +
                      ('' if parent in (target, os.path.dirname(os.path.abspath(target)))
                       else f': {parent}'))


def _inside(path: str, directory: str) -> bool:
  """Whether `path` is `directory` or lies inside it (replacing `directory` deletes it)."""
  path, directory = os.path.realpath(path), os.path.realpath(directory)
  return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def vocab_file(carried: Optional[str], given: Optional[str], checkpoint: str) -> Optional[str]:
  """The vocabulary of a checkpoint command: `--vocab` (`given`) where the checkpoint carries none
  (`carried`), else the checkpoint's own; a `--vocab` that differs from the carried one is refused
  (it would decode the model's ids into another vocabulary's text)."""
  if given is None:
    return carried
  if not os.path.isfile(given):
    raise UserError(f'--vocab {given}: vocabulary file not found')
  if carried is not None and not filecmp.cmp(carried, given, shallow=False):
    raise UserError(f'--vocab {given}: {checkpoint} carries another vocabulary ({carried}); drop '
                    '--vocab')
  return given
