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


def check_outputs(outputs: Mapping[str, Optional[str]],
                  inputs: Mapping[str, Optional[str]] = (), directories: bool = False) -> None:
  """Raises `UserError` unless every output path can be written without losing data.

  Args:
    outputs: flag name -> output path (None: not given, skipped).
    inputs: flag name -> input path the outputs must not replace (None: skipped).
    directories: the outputs are directories (created by the command; an existing one is the
      command's `--overwrite` business), not files.
  """
  inputs = dict(inputs or {})
  given = [(name, path) for name, path in outputs.items() if path]
  for i, (name, path) in enumerate(given):
    for in_name, in_path in inputs.items():
      if in_path and (_same(path, in_path) or (directories and _inside(in_path, path))):
        raise UserError(f'{name} {path} would replace the input {in_name}; write elsewhere')
    for other, other_path in given[:i]:
      if _same(path, other_path):
        raise UserError(f'{name} and {other} are the same path {path}; give two paths')
    if not directories and os.path.isdir(path):
      raise UserError(f'{name} {path} is a folder; give a file path')
    parent = os.path.dirname(os.path.abspath(path))
    while directories and not os.path.exists(parent):  # a new directory's missing parents are made
      parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
      raise UserError(f'{name} {path}: folder {parent} does not exist')
    if not os.access(parent, os.W_OK | os.X_OK) or (
        os.path.exists(path) and not directories and not os.access(path, os.W_OK)):
      raise UserError(f'{name} {path}: not writable (permission denied)')


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
