"""The manual (README.md, docs/) against the code: it builds, its links land, its paths and commands exist.

(1) `mkdocs build --strict` (warnings are errors: a page missing from the nav, a broken link or
anchor); (2) every relative link and `#anchor` in README.md and docs/, anchors as Python-Markdown's
`toc` extension (MkDocs' renderer) makes them; (3) every repository path named in backticks exists;
(4) every `gqa-spec ...` command line, in code blocks and in backticks, parses with the real CLI
parser (`gqa_spec.cli.build_parser`); (5) every `gqa_spec` import in a code block names a module at
its current location (not a deprecated path a module moved from) and names it defines. Nothing is run.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import glob
import html
import importlib.util
import io
import itertools
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ['README.md'] + sorted(
    os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, 'docs', '**', '*.md'),
                                                recursive=True))
# What the repository's root holds: a backticked word starting with one of these is a path.
ROOTS = ('gqa_spec', 'tests', 'configs', 'results', 'benchmarks', 'scripts', 'notebooks', 'docs',
         '.ci', 'pyproject.toml', 'setup.py', 'mkdocs.yml', 'README.md')
# Paths the docs name that a run makes rather than the repository holds.
GENERATED = (
    'results/smoke',  # the quickstart's `gqa-spec reproduce --preset smoke` (not committed)
    'gqa_spec/configs',  # configs/ copied into the wheel by setup.py at build time
)
# The extensions MkDocs renders with by default (mkdocs.yml adds none).
MARKDOWN_EXTENSIONS = ('toc', 'tables', 'fenced_code')

_FENCE = re.compile(r'^(\s*)(```|~~~)(.*?)$\n(.*?)^\1\2\s*$', re.M | re.S)
_INDENTED_BLOCK = re.compile(r'(?:^\n)((?:^(?: {4}|\t).*\n?)+)', re.M)
_INLINE_CODE = re.compile(r'(`+)(.+?)\1', re.S)
_LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')


def _read(page: str) -> str:
  with open(os.path.join(REPO, page), encoding='utf-8') as f:
    return f.read()


def _blocks(text: str) -> list[str]:
  """The code blocks of a page: fenced ones and 4-space indented ones."""
  fenced = [m.group(4) for m in _FENCE.finditer(text)]
  rest = _FENCE.sub('', text)
  indented = [re.sub(r'^(?: {4}|\t)', '', m.group(1), flags=re.M)
              for m in _INDENTED_BLOCK.finditer(rest)
              if not re.match(r'\s*([-*+]|\d+\.)\s', m.group(1))]  # not a list's continuation
  return fenced + indented


def _prose(text: str) -> str:
  """The page without its code blocks (links and inline code live here)."""
  return _INDENTED_BLOCK.sub('\n', _FENCE.sub('', text))


def _inline_code(text: str) -> list[str]:
  return [m.group(2).strip() for m in _INLINE_CODE.finditer(_prose(text))]


@functools.lru_cache(maxsize=None)
def _headings(page: str) -> dict[str, str]:
  """Heading id -> heading text, the ids MkDocs gives `page` (Python-Markdown's toc `slugify`)."""
  import markdown  # pylint: disable=g-import-not-at-top
  md = markdown.Markdown(extensions=list(MARKDOWN_EXTENSIONS))
  md.convert(_read(page))

  def walk(tokens):
    for token in tokens:
      yield token['id'], html.unescape(token['name'])
      yield from walk(token['children'])
  return dict(walk(md.toc_tokens))


def _anchors(page: str) -> frozenset[str]:
  return frozenset(_headings(page))


def _github_slug(heading: str) -> str:
  """GitHub's anchor for a heading (README.md is read there): no collapsing of `-`, `_` kept."""
  return re.sub(r'[^\w\- ]', '', heading.lower()).replace(' ', '-')


def test_anchor_ids_are_toc_slugs():
  """The anchor check reads real toc ids (punctuation dropped, duplicates numbered)."""
  from markdown.extensions.toc import slugify  # pylint: disable=g-import-not-at-top
  assert slugify('Long runs: stopping, progress, status', '-') == 'long-runs-stopping-progress-status'
  assert 'long-runs-stopping-progress-status' in _anchors('docs/rundir.md')
  assert _github_slug('Long runs: stopping, progress, status') == 'long-runs-stopping-progress-status'
  assert _github_slug('Staged speculation (Spector & Re 2023)') != slugify(
      'Staged speculation (Spector & Re 2023)', '-')  # GitHub keeps the `--` of ` & `


@pytest.mark.parametrize('page', PAGES)
def test_links_resolve(page):
  problems = []
  for target in _LINK.findall(_prose(_read(page))):
    if re.match(r'[a-z][a-z0-9+.-]*:', target):  # http:, https:, mailto:
      continue
    path, _, anchor = target.partition('#')
    resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    if not os.path.exists(os.path.join(REPO, resolved)):
      problems.append(f'{target}: {resolved} does not exist')
    elif anchor and not resolved.endswith('.md'):
      problems.append(f'{target}: an anchor into a file that is not markdown')
    elif anchor and anchor not in _anchors(resolved):
      problems.append(f'{target}: no heading with id {anchor!r} in {resolved}')
    elif anchor and page == 'README.md' and _github_slug(_headings(resolved)[anchor]) != anchor:
      problems.append(f'{target}: GitHub, where README.md is read, gives that heading another id')
  assert not problems, f'{page}: ' + '; '.join(problems)


def _expand_braces(word: str) -> list[str]:
  """`a{b,c}d` -> [abd, acd] (shell brace expansion, as the docs write file families)."""
  match = re.search(r'\{([^{}]*)\}', word)
  if not match:
    return [word]
  return list(itertools.chain.from_iterable(
      _expand_braces(word[:match.start()] + option + word[match.end():])
      for option in match.group(1).split(',')))


def _repository_paths(code: str) -> list[str]:
  """The words of an inline code span that name a file or directory of the repository."""
  paths = []
  for word in code.split():
    word = re.sub(r'^[(\'"]+|[)\'",;:.]+$', '', word)
    if '<' in word or '...' in word or not word.split('/')[0] in ROOTS:
      continue  # `results/<preset>/` is a pattern, not a path
    if '/' not in word and word not in ROOTS:
      continue
    paths.extend(_expand_braces(word))
  return paths


def _path_exists(path: str) -> bool:
  if path.rstrip('/').startswith(GENERATED):
    return True
  full = os.path.join(REPO, path)
  # A glob must match; a path may also name an output prefix (`--out results/benchmarks/x`).
  return bool(glob.glob(full) or glob.glob(full.rstrip('/') + '.*'))


def test_repository_path_check():
  """The path check expands braces and rejects what is not there."""
  assert _repository_paths('configs/models/t5_1_1/{nano,mini}.gin') == [
      'configs/models/t5_1_1/nano.gin', 'configs/models/t5_1_1/mini.gin']
  assert _repository_paths('results/<preset>/x.json') == []
  assert _repository_paths('drafts/base.py') == []  # relative to a package: not a repository path
  assert _path_exists('gqa_spec/cli.py') and _path_exists('configs/runs/*.gin')
  assert not _path_exists('gqa_spec/no_such_module.py')


@pytest.mark.parametrize('page', PAGES)
def test_repository_paths_exist(page):
  missing = sorted({path for code in _inline_code(_read(page)) for path in _repository_paths(code)
                    if not _path_exists(path)})
  assert not missing, f'{page} names paths the repository does not have: {missing}'


def _command_lines(text: str) -> list[str]:
  """`gqa-spec ...` lines of the code blocks (continuations joined, `$ ` prompts dropped) and spans."""
  lines = []
  for block in _blocks(text):
    for line in block.replace('\\\n', ' ').splitlines():
      line = re.sub(r'^\s*\$\s+', '', line).strip()
      if line.startswith('gqa-spec '):
        lines.append(line)
  lines.extend(code for code in _inline_code(text) if code.startswith('gqa-spec '))
  return lines


def _argv(line: str) -> list[str]:
  """A documented command line as argv: comments, shell redirections, `...` and `[ ]` dropped;
  `${VAR:-default}` read as its default (the variables the manual's pages shrink by, unset)."""
  line = re.sub(r'\$\{\w+:-([^}]*)\}', r'\1', line)
  words = shlex.split(line, comments=True)[1:]
  argv = []
  for word in words:
    if word in ('|', '||', '&&', ';', '>', '2>', '<') or word.startswith(('>', '2>')):
      break
    word = word.strip('[]')
    if word and word != '...':
      argv.append(word)
  return argv


@functools.lru_cache(maxsize=None)
def _parser() -> argparse.ArgumentParser:
  from gqa_spec import cli  # pylint: disable=g-import-not-at-top
  return cli.build_parser()


def _subcommand_exists(parser: argparse.ArgumentParser, words: list[str]) -> bool:
  """Whether `words` (no options) name a (sub-)command: `gqa-spec generate` in running text."""
  for word in words:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # pylint: disable=protected-access
    if not actions or word not in actions[0].choices:
      return False
    parser = actions[0].choices[word]
  return True


def _parse_error(line: str) -> str | None:
  argv = _argv(line)
  stderr = io.StringIO()
  try:
    with contextlib.redirect_stderr(stderr):
      _parser().parse_args(argv)
  except SystemExit:
    error = stderr.getvalue().strip().splitlines()[-1]
    if argv and not any(w.startswith('-') for w in argv) and _subcommand_exists(_parser(), argv):
      return None  # a command named in a sentence, its required arguments left out
    if '...' in shlex.split(line, comments=True) and 'arguments are required' in error:
      return None  # `...` stands for arguments shown elsewhere (`--inputs in.jsonl --out ...`)
    return error
  return None


def test_command_check():
  """The command check accepts real command lines and rejects a wrong flag or command."""
  assert _argv('gqa-spec generate --model CKPT [--gamma 4] ... > out.log  # comment') == [
      'generate', '--model', 'CKPT', '--gamma', '4']
  assert _parse_error("gqa-spec train --gin_file=x.gin --gin.MODEL_DIR=\"'/tmp/r'\"") is None
  assert _parse_error('gqa-spec data prepare --vocab-size "${PIECES:-8000}"') is None
  assert 'expected an integer' in _parse_error('gqa-spec data prepare --vocab-size "${PIECES:-x}"')
  assert _parse_error('gqa-spec generate') is None
  assert _parse_error('gqa-spec generate --model CKPT --gamma 3 ...') is None
  assert 'required' in _parse_error('gqa-spec generate --model CKPT --gamma 3')
  assert 'invalid int' in _parse_error('gqa-spec generate --model CKPT --max-decode-len x ...')
  assert 'integer or auto' in _parse_error('gqa-spec generate --model CKPT --gamma x ...')
  assert 'unrecognized arguments' in _parse_error('gqa-spec reproduce --no-such-flag')
  assert 'invalid choice' in _parse_error('gqa-spec no-such-command')


@pytest.mark.parametrize('page', PAGES)
def test_commands_parse(page):
  problems = [f'`{line}`: {error}' for line in _command_lines(_read(page))
              if (error := _parse_error(line)) is not None]
  assert not problems, f'{page}: ' + '; '.join(problems)


_IMPORT = re.compile(r'^\s*(?:from\s+(gqa_spec[\w.]*)\s+import\s+([\w\s,]+?)|import\s+(gqa_spec[\w.]*))\s*(?:#.*)?$',
                     re.M)


def _top_level_names(tree: ast.Module) -> set[str]:
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((a.asname or a.name).split('.')[0] for a in node.names)
  return names


def _moved_to(tree: ast.Module) -> str | None:
  """Where a deprecated path (a module that puts another in `sys.modules[__name__]`) points."""
  for node in tree.body:
    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
        and any(isinstance(t, ast.Subscript) and ast.unparse(t) == 'sys.modules[__name__]'
                for t in node.targets)):
      for imp in tree.body:
        if isinstance(imp, ast.ImportFrom) and node.value.id in [a.asname or a.name for a in imp.names]:
          return f'{imp.module}.{node.value.id}'
      return node.value.id
  return None


def _import_error(module_name: str, names: tuple[str, ...] = ()) -> str | None:
  """Why `from module_name import names` (or `import module_name`) is wrong, or None.

  Read, not run (the module itself is not imported, only its parent packages, so that a page's
  `from gqa_spec.data import tasks` costs no seqio/TensorFlow import).
  """
  try:
    spec = importlib.util.find_spec(module_name)
  except ImportError as e:
    return f'{module_name}: {e}'
  if spec is None or not spec.origin or not spec.origin.endswith('.py'):
    return f'no module {module_name}'
  with open(spec.origin, encoding='utf-8') as f:
    tree = ast.parse(f.read())
  if (target := _moved_to(tree)) is not None:
    return f'{module_name} moved to {target}'
  defined = _top_level_names(tree)
  for name in names:
    if name in defined:
      continue
    error = _import_error(f'{module_name}.{name}') if spec.submodule_search_locations else 'none'
    if error is not None:
      return error if ' moved to ' in error else f'{module_name} has no {name}'
  return None


def _imports(text: str) -> list[tuple[str, tuple[str, ...]]]:
  found = []
  for block in _blocks(text):
    for m in _IMPORT.finditer(block):
      names = tuple(n.split()[0] for n in m.group(2).split(',') if n.strip()) if m.group(2) else ()
      found.append((m.group(1) or m.group(3), names))
  return found


def test_import_check(tmp_path, monkeypatch):
  """The import check accepts current paths and rejects a moved module or a missing name."""
  assert _imports('```python\nfrom gqa_spec.data import batches, corpus as c  # x\nimport gqa_spec.cli\n```') == [
      ('gqa_spec.data', ('batches', 'corpus')), ('gqa_spec.cli', ())]
  assert _import_error('gqa_spec.data', ('batches', 'tasks')) is None
  assert _import_error('gqa_spec.decoding.tree', ('TreeShape',)) is None
  assert _import_error('gqa_spec.data', ('no_such_name',)) == 'gqa_spec.data has no no_such_name'
  assert _import_error('gqa_spec.decoding.tree', ('NoSuchClass',)) == 'gqa_spec.decoding.tree has no NoSuchClass'
  assert _import_error('gqa_spec.no_such_module') == 'no module gqa_spec.no_such_module'
  # A moved module kept under its old name (sys.modules aliasing).
  (tmp_path / 'docs_pkg').mkdir()
  (tmp_path / 'docs_pkg' / '__init__.py').write_text('')
  (tmp_path / 'docs_pkg' / 'new.py').write_text('X = 1\n')
  (tmp_path / 'docs_pkg' / 'old.py').write_text(
      'import sys\nfrom docs_pkg import new\nsys.modules[__name__] = new\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  assert _import_error('docs_pkg.old', ('X',)) == 'docs_pkg.old moved to docs_pkg.new'
  assert _import_error('docs_pkg', ('old',)) == 'docs_pkg.old moved to docs_pkg.new'
  assert _import_error('docs_pkg.new', ('X',)) is None


@pytest.mark.parametrize('page', PAGES)
def test_imports_resolve(page):
  problems = [error for module_name, names in _imports(_read(page))
              if (error := _import_error(module_name, names)) is not None]
  assert not problems, f'{page}: ' + '; '.join(problems)


def test_every_page_in_the_nav():
  """mkdocs.yml lists every page of docs/ (MkDocs only logs an INFO for one left out)."""
  with open(os.path.join(REPO, 'mkdocs.yml'), encoding='utf-8') as f:
    nav = set(re.findall(r':\s*(\S+\.md)\s*$', f.read(), re.M))
  pages = {os.path.relpath(p, 'docs') for p in PAGES if p.startswith('docs' + os.sep)}
  assert pages == nav


@pytest.mark.skipif(importlib.util.find_spec('mkdocs') is None,
                    reason="mkdocs is not installed (it is in the package's [test] extras)")
def test_mkdocs_build_strict(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'mkdocs', 'build', '--strict', '--quiet',
       '--config-file', os.path.join(REPO, 'mkdocs.yml'), '--site-dir', str(tmp_path / 'site')],
      capture_output=True, text=True, cwd=REPO, check=False)
  assert result.returncode == 0, result.stderr[-4000:]
  assert (tmp_path / 'site' / 'index.html').exists()
