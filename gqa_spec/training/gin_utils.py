"""Gin at the edge: t5x-style flags, the config search path, one-line errors.

Flags, as t5x's `gin_utils`:
  --gin_file=FILE          (repeatable) a gin file; relative names are looked up on the search path
  --gin_bindings=BINDING   (repeatable) e.g. "trainer.train.log_period = 10"
  --gin.MACRO=VALUE        shorthand for the binding "MACRO = VALUE" (VALUE is a gin literal)
  --gin_search_paths=DIRS  (comma-separated) extra search directories, before the defaults
Default search path: the current directory, then the project's configs (`CONFIGS_DIR`: the
repository's `configs/` in a source checkout, `gqa_spec/configs/` inside an installed wheel, where
setup.py packages them) and the directory above them, so `--gin_file=runs/pretrain.gin`,
`--gin_file=configs/runs/pretrain.gin` and the gin files' own `include 'models/t5_1_1/nano.gin'`
all resolve from any working directory, editable install or not.

Unrelated directories in the working directory never break resolution: gin's package-resource
reader takes `include 'runs/pretrain.gin'` to mean "file pretrain.gin of the Python package `runs`"
and crashes (TypeError) when `./runs/` is a directory without `__init__.py` (e.g. the work dir
`gqa-spec reproduce` leaves there). `parse` swaps that reader's existence check for one that treats
such a directory as "not here" and goes on down the search path (`_system_path_file_exists`).

Parse errors, missing files and unset `%gin.REQUIRED` macros become a `UserError` whose first line
says what is wrong and where, so the CLI prints one clear line.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tokenize
from typing import Iterable, List, Optional, Sequence, Tuple

from gqa_spec.errors import UserError

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _configs_dir() -> str:
  installed = os.path.join(_PACKAGE_DIR, 'configs')  # a wheel: setup.py maps configs/ there
  if os.path.isdir(os.path.join(installed, 'runs')):
    return installed
  return os.path.join(os.path.dirname(_PACKAGE_DIR), 'configs')  # a source checkout


CONFIGS_DIR = _configs_dir()
# The directory holding `configs/`: makes `--gin_file=configs/runs/pretrain.gin` resolve too.
CONFIGS_PARENT = os.path.dirname(CONFIGS_DIR)


def add_gin_flags(parser: argparse.ArgumentParser) -> None:
  """Adds --gin_file, --gin_bindings and --gin_search_paths (`--gin.MACRO=` is parsed separately)."""
  parser.add_argument('--gin_file', action='append', default=[], metavar='FILE',
                      help='gin config file (repeatable), e.g. experiments/nano_mha_pretrain_ddtp.gin')
  parser.add_argument('--gin_bindings', action='append', default=[], metavar='BINDING',
                      help="gin binding (repeatable), e.g. 'TRAIN_STEPS = 1000'")
  parser.add_argument('--gin_search_paths', default='', metavar='DIRS',
                      help='comma-separated directories searched for gin files and includes')


def split_macro_flags(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
  """Separates `--gin.MACRO=VALUE` / `--gin.MACRO VALUE` flags into bindings.

  Returns:
    `(remaining argv, bindings)`.
  """
  remaining, bindings = [], []
  args = list(argv)
  i = 0
  while i < len(args):
    arg = args[i]
    if arg.startswith('--gin.'):
      name, eq, value = arg[len('--gin.'):].partition('=')
      if not eq:
        if i + 1 >= len(args):
          raise UserError(f'{arg} needs a value: --gin.{name}=VALUE')
        value, i = args[i + 1], i + 1
      if not name.replace('_', '').replace('.', '').isalnum():
        raise UserError(f'bad gin macro flag {arg!r}; expected --gin.NAME=VALUE')
      bindings.append(f'{name} = {value}')
    else:
      remaining.append(arg)
    i += 1
  return remaining, bindings


def _gin():
  """gin, imported when a command parses configs: the library and `gqa-spec reproduce` run
  without it (GPU images often lack it)."""
  try:
    import gin  # pylint: disable=g-import-not-at-top
    import gin.resource_reader  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise UserError('gin-config is not installed: the gin-configured commands (train, uptrain, '
                    'eval, infer, train-draft) need it (`pip install gin-config`); the library '
                    'and `gqa-spec reproduce` do not') from None
  return gin


def search_paths(extra: Iterable[str] = ()) -> List[str]:
  paths = [p for p in extra if p] + [os.getcwd(), CONFIGS_DIR, CONFIGS_PARENT]
  return list(dict.fromkeys(os.path.abspath(p) for p in paths))


def parse(gin_files: Sequence[str], bindings: Sequence[str] = (),
          extra_search_paths: Iterable[str] = (), finalize: bool = True) -> None:
  """Clears gin, then parses the files and bindings (later ones override earlier ones).

  Raises:
    UserError: no file given, a file not found, a syntax or binding error.
  """
  if not gin_files:
    raise UserError('no --gin_file given; e.g. --gin_file=experiments/nano_mha_pretrain_ddtp.gin')
  gin = _gin()
  gin.clear_config(clear_constants=True)
  _guard_resource_reader()
  paths = search_paths(extra_search_paths)
  for path in paths:
    if path not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
      gin.add_config_file_search_path(path)  # (gin.clear_config keeps them: add each once)
  resolved = [_resolve(f, paths) for f in gin_files]
  try:
    gin.parse_config_files_and_bindings(resolved, list(bindings), finalize_config=finalize)
  except Exception as e:  # pylint: disable=broad-except  (gin raises SyntaxError, tokenize's
    # TokenError, ValueError, ImportError, ...: every one of them here means a bad config)
    gin.clear_config(clear_constants=True)
    if str(e).startswith('Unable to parse value'):
      _check_binding_values(gin, bindings)
    message = _one_line(e)
    if isinstance(e, IOError) and str(e).startswith('Unable to open file: '):
      missing = str(e)[len('Unable to open file: '):].split('. Searched config paths')[0]
      where = message[message.rfind(' (In file'):] if ' (In file' in message else ''
      message = f"include '{missing}' not found{where}; searched {', '.join(paths)}"
    if isinstance(e, tokenize.TokenError):  # unbalanced brackets: gin does not say where
      message = f'{e.args[0]} at line {e.args[1][0]}'
    if 'In file' not in message and 'In binding' not in message:
      message += f' (parsing {", ".join(resolved)}{" and bindings" if bindings else ""})'
    raise UserError(f'gin: {message}') from None


def _check_binding_values(gin, bindings: Sequence[str]) -> None:
  """A binding whose value is no gin literal: `UserError` naming it and showing the quoting.

  Called when gin failed to parse a value: its message ("Unable to parse value. (line 1)") names
  neither the binding nor the rule. References (`@name`) and macros (`%NAME`) are gin's to judge.
  """
  for binding in bindings:
    name, eq, value = binding.partition('=')
    name, value = name.strip(), value.strip()
    if not eq or '\n' in value or value.startswith(('@', '%')):
      continue  # gin reports those with their context
    try:
      gin.config.parse_value(value)
    except (SyntaxError, ValueError):
      example = value.replace("'", '')
      raise UserError(f'gin: cannot parse the value of {name}: {value}; a gin string needs its own '
                      f'quotes inside the shell\'s, e.g. --gin.{name}="\'{example}\'"') from None


def call(fn, *args, **kwargs):
  """Calls the gin-configured version of `fn`; gin files that do not configure it: `UserError`."""
  gin = _gin()
  try:
    configured = gin.get_configurable(fn)
  except ValueError as e:
    raise UserError(f'gin: {_one_line(e)} (do the gin files configure {fn.__module__}.'
                    f'{fn.__name__}?)') from None
  return configured(*args, **kwargs)


def operative_config() -> str:
  """The gin config actually used (for the run directory)."""
  return _gin().operative_config_str()


def _system_path_file_exists(config_path: str) -> bool:
  """gin's package-resource existence check, minus its crash on directories that are no package.

  `include 'a/b/c.gin'` may name file c.gin of the importable package `a.b` (gin's resource
  reader). A directory `a/b` without `__init__.py` in the working directory imports as a namespace
  package whose spec has no origin, and gin then fails with "expected str, bytes or os.PathLike
  object, not NoneType". Such a match is not a config file: answer False, so the search goes on.
  Unlike gin's check, a miss logs nothing (gin logs an ERROR line per search-path entry).
  """
  head, filename = os.path.split(config_path)
  if not head or os.path.isabs(head):
    return False
  try:
    spec = importlib.util.find_spec(head.replace('/', '.'))
  except (ImportError, ValueError):
    return False
  if spec is None or not spec.origin or not os.path.isfile(spec.origin):
    return False
  return os.path.isfile(os.path.join(os.path.dirname(spec.origin), filename))


def _guard_resource_reader() -> None:
  """Installs `_system_path_file_exists` in place of gin's own check (idempotent)."""
  gin = _gin()
  readers = gin.config._FILE_READERS  # pylint: disable=protected-access  (no public way to swap)
  for i, (reader, exists) in enumerate(readers):
    if exists is gin.resource_reader.system_path_file_exists:
      readers[i] = (reader, _system_path_file_exists)


def _resolve(name: str, paths: Sequence[str]) -> str:
  if os.path.isabs(name):
    if not os.path.isfile(name):
      raise UserError(f'gin file not found: {name}')
    return name
  for directory in paths:
    candidate = os.path.join(directory, name)
    if os.path.isfile(candidate):
      return candidate
  raise UserError(f'gin file not found: {name} (searched {", ".join(paths)})')


def _one_line(e: BaseException) -> str:
  lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
  if not lines:
    return type(e).__name__
  # gin appends 'In file "x.gin", line 3' on a following line: keep it, it says where.
  where = next((l for l in lines[1:] if l.startswith('In file') or l.startswith('In binding')), None)
  return lines[0] + (f' ({where})' if where else '')


def maybe_search_paths(value: Optional[str]) -> List[str]:
  """The --gin_search_paths flag as a list."""
  return [p for p in (value or '').split(',') if p]
