"""Debian package descriptions (DDTP): reader, language join, leak-free split, task examples.

Debian's Description Translation Project publishes every package description in files named
`*_i18n_Translation-<lang>[.lz4|.xz|.bz2|.gz]` (apt keeps them in `/var/lib/apt/lists`). Each is a
sequence of RFC822-style records separated by blank lines:

  Package: 0ad
  Description-md5: d943033bedada21853d2ae54a2578a7b
  Description-en: Real-time strategy game of ancient warfare      <- synopsis
   0 A.D. (pronounced "zero ey-dee") is a free, open-source, ...  <- long description
   .                                                               <- paragraph break

The md5 identifies the English original, so translations join on it. Several binary packages often
share one md5 (one record here, with all their package names).

Split rule (documented in docs/data.md): records are grouped with union-find over three relations,
then a whole group goes to one split chosen by a hash of the group's key:
  1. the package-name stem (`package_stem`: `libfoo3-dev`, `python3-foo`, `foo-doc` -> `foo`), a
     stand-in for the source package, which the Translation files do not name;
  2. an identical English description (synopsis + long text);
  3. an identical English long description (the `foo-data`/`foo-common` packages of one source share
     it under different synopses).
Boilerplate long descriptions shared by more than `max_shared_text` stems (e.g. the Haskell or
transitional-package templates) are left out of relation 3: they would otherwise chain thousands of
unrelated packages into one group. The group key is the smallest stem of the group; its SHA-256 maps
to [0, 1) and the split fractions cut that interval, so the split is stable across runs and machines
and needs no random seed.

Typical use:
  records, report = read_corpus('/var/lib/apt/lists')
  splits = split_records(records)             # {'train': [...], 'validation': [...], 'test': [...]}
  translation_pairs(record), summarization_example(record), pretraining_texts(record)
`gqa_spec.data.corpus.prepare` writes the splits to disk; the seqio tasks read them from there.
"""

from __future__ import annotations

import bz2
import dataclasses
import glob
import gzip
import hashlib
import lzma
import os
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import lz4.frame

from gqa_spec.errors import UserError

APT_LISTS_DIR = '/var/lib/apt/lists'
LANGUAGES = ('en', 'de')
SPLITS = ('train', 'validation', 'test')
DEFAULT_FRACTIONS = (('train', 0.90), ('validation', 0.05), ('test', 0.05))
FETCH_HINT = ("fetch them with `gqa-spec data fetch` (runs `apt-get update -o "
              "Acquire::Languages=en,de` as root on Debian/Ubuntu) or copy `*_i18n_Translation-en*` and "
              "`*_i18n_Translation-de*` from a Debian machine's /var/lib/apt/lists into a directory "
              "and pass it with --lists-dir")

_OPENERS = {
    '': open,
    '.lz4': lz4.frame.open,
    '.xz': lzma.open,
    '.bz2': bz2.open,
    '.gz': gzip.open,
}


@dataclasses.dataclass(frozen=True)
class Text:
  """One language's description: a one-line synopsis and the long description's paragraphs."""
  synopsis: str
  paragraphs: Tuple[str, ...]

  def to_json(self) -> dict:
    return {'synopsis': self.synopsis, 'paragraphs': list(self.paragraphs)}

  @classmethod
  def from_json(cls, d: Optional[Mapping]) -> Optional['Text']:
    return None if d is None else cls(d['synopsis'], tuple(d['paragraphs']))


@dataclasses.dataclass(frozen=True)
class Record:
  """A description joined across languages; `texts` maps language -> Text ('en' always present)."""
  md5: str
  packages: Tuple[str, ...]
  texts: Mapping[str, Text]

  def to_json(self) -> dict:
    return {'md5': self.md5, 'packages': list(self.packages),
            'texts': {lang: t.to_json() for lang, t in sorted(self.texts.items())}}

  @classmethod
  def from_json(cls, d: Mapping) -> 'Record':
    return cls(d['md5'], tuple(d['packages']),
               {lang: Text.from_json(t) for lang, t in d['texts'].items()})


@dataclasses.dataclass
class ReadReport:
  """What the reader saw: files per language, parsed and malformed records, untranslated md5s."""
  files: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
  parsed: Dict[str, int] = dataclasses.field(default_factory=dict)
  malformed: Dict[str, int] = dataclasses.field(default_factory=dict)
  truncated_files: List[str] = dataclasses.field(default_factory=list)
  orphan_translations: int = 0  # a translation whose md5 has no English record

  def summary(self) -> str:
    parts = [f'{lang}: {self.parsed.get(lang, 0)} records from {len(self.files.get(lang, []))} '
             f'file(s), {self.malformed.get(lang, 0)} malformed' for lang in sorted(self.files)]
    if self.truncated_files:
      parts.append('truncated: ' + ', '.join(os.path.basename(f) for f in self.truncated_files))
    if self.orphan_translations:
      parts.append(f'{self.orphan_translations} translations without an English record')
    return '; '.join(parts)


def _clean(line: str) -> str:
  return ' '.join(line.split())


def parse_description(lines: Sequence[str]) -> Text:
  """Parses a `Description-xx` field: its first line and the continuation lines (leading space).

  Continuation lines are unwrapped (whitespace collapsed); ` .` starts a new paragraph. Lines indented
  by two or more spaces (Debian's verbatim lists) are joined too: SentencePiece drops newlines anyway.

  Args:
    lines: the field's value lines, the first without the `Description-xx:` prefix.

  Returns:
    The Text.
  """
  paragraphs, current = [], []
  for line in lines[1:]:
    if line.strip() == '.':
      if current:
        paragraphs.append(_clean(' '.join(current)))
      current = []
    else:
      current.append(line)
  if current:
    paragraphs.append(_clean(' '.join(current)))
  return Text(_clean(lines[0]), tuple(p for p in paragraphs if p))


def parse_translation(content: str, lang: str) -> Tuple[List[Tuple[str, str, Text]], int]:
  """Parses the records of one Translation file.

  Args:
    content: the decompressed file.
    lang: its language code; the description field is `Description-<lang>`.

  Returns:
    ([(package, md5, Text)], number of malformed records). A record is malformed when it lacks
    `Package`, a 32-hex-digit `Description-md5` or a non-empty `Description-<lang>`, or has a line
    that is neither a `Field: value` nor a continuation.
  """
  field = f'description-{lang}'
  records, malformed = [], 0
  for block in re.split(r'\n[ \t]*\n', content):
    if not block.strip():
      continue
    fields: Dict[str, List[str]] = {}
    key, ok = None, True
    for line in block.strip('\n').split('\n'):
      if line[:1] in (' ', '\t'):
        if key is None:
          ok = False
          break
        fields[key].append(line[1:])
      elif ':' in line:
        key, value = line.split(':', 1)
        key = key.strip().lower()
        fields[key] = [value.strip()]
      else:
        ok = False
        break
    package = fields.get('package', [''])[0]
    md5 = fields.get('description-md5', [''])[0]
    desc = fields.get(field)
    if (not ok or not package or not re.fullmatch(r'[0-9a-f]{32}', md5) or not desc
        or not desc[0]):
      malformed += 1
      continue
    records.append((package, md5, parse_description(desc)))
  return records, malformed


def _compression(path: str) -> str:
  return next((ext for ext in _OPENERS if ext and path.endswith(ext)), '')


def _read_file(path: str) -> Tuple[str, bool]:
  """Decompresses a file; returns (text, truncated). A damaged tail keeps what came before it."""
  chunks, truncated = [], False
  try:
    with _OPENERS[_compression(path)](path, 'rb') as f:
      while True:
        chunk = f.read1(1 << 16)  # one block at a time: a damaged tail loses only itself
        if not chunk:
          break
        chunks.append(chunk)
  except (EOFError, OSError, RuntimeError, lzma.LZMAError) as e:
    if not chunks and not isinstance(e, EOFError):
      raise UserError(f'cannot read {path}: {e}') from e
    truncated = True
  return b''.join(chunks).decode('utf-8', errors='replace'), truncated


def find_translation_files(directory: str, lang: str) -> List[str]:
  """The `*Translation-<lang>[.lz4|.xz|.bz2|.gz]` files of a directory, one per archive."""
  by_stem: Dict[str, str] = {}
  pattern = re.compile(rf'Translation-{re.escape(lang)}(\.lz4|\.xz|\.bz2|\.gz)?$')
  for path in sorted(glob.glob(os.path.join(directory, f'*Translation-{lang}*')), reverse=True):
    match = pattern.search(os.path.basename(path))
    if match:  # reverse order: a plain file wins over its compressed twin
      by_stem.setdefault(path[:len(path) - len(match.group(1) or '')], path)
  return sorted(by_stem.values())


def read_corpus(directory: str = APT_LISTS_DIR,
                languages: Sequence[str] = LANGUAGES) -> Tuple[List[Record], ReadReport]:
  """Reads and joins the Translation files of a directory on `Description-md5`.

  English is the pivot: a record exists for each English md5; other languages attach to it. Records
  of the same md5 in several files (main, security, updates) merge their package names.

  Args:
    directory: where the Translation files are (default: apt's lists directory).
    languages: language codes; the first is the pivot.

  Returns:
    (records sorted by md5, ReadReport).

  Raises:
    UserError: the directory is missing or holds no Translation file for the pivot language.
  """
  if not os.path.isdir(directory):
    raise UserError(f'no directory {directory} with Debian Translation files; {FETCH_HINT}')
  report = ReadReport()
  packages: Dict[str, set] = {}
  texts: Dict[str, Dict[str, Text]] = {}
  for lang in languages:
    paths = find_translation_files(directory, lang)
    report.files[lang] = paths
    if not paths and lang == languages[0]:
      raise UserError(f'no Translation-{lang} file in {directory}; {FETCH_HINT}')
    parsed = malformed = 0
    for path in paths:
      content, truncated = _read_file(path)
      if truncated:
        report.truncated_files.append(path)
        # The last record of a truncated file may be cut mid-text: count it as malformed.
        content, _, tail = content.rstrip('\n').rpartition('\n\n')
        malformed += bool(tail.strip())
      records, bad = parse_translation(content, lang)
      parsed, malformed = parsed + len(records), malformed + bad
      for package, md5, text in records:
        if lang != languages[0] and md5 not in texts:
          report.orphan_translations += 1
          continue
        packages.setdefault(md5, set()).add(package)
        texts.setdefault(md5, {}).setdefault(lang, text)
    report.parsed[lang], report.malformed[lang] = parsed, malformed
  records = [Record(md5, tuple(sorted(packages[md5])), texts[md5]) for md5 in sorted(texts)]
  return records, report


_PREFIXES = ('python3-', 'python-', 'ruby-', 'node-', 'golang-', 'libghc-', 'r-cran-', 'r-bioc-',
             'librust-', 'php-', 'lua-', 'ocaml-', 'gir1.2-', 'fonts-', 'texlive-', 'elpa-', 'lib')
_SUFFIXES = ('-dev', '-doc', '-dbg', '-dbgsym', '-data', '-common', '-bin', '-utils', '-tools',
             '-examples', '-java', '-perl', '-plugins', '-plugin', '-runtime', '-l10n', '-locales',
             '-prof', '-static', '-client', '-server', '-core', '-extra', '-all', '-udeb', '-headers')


def package_stem(package: str) -> str:
  """A source-package stand-in: the binary name without language prefixes, role suffixes, SONAMEs.

  `libgtk-3-0t64` -> `gtk`, `python3-numpy-doc` -> `numpy`, `0ad-data-common` -> `0ad`. A strip that
  would leave fewer than two characters is not applied.
  """
  name = package.lower()
  changed = True
  while changed:
    changed = False
    for suffix in _SUFFIXES:
      if name.endswith(suffix) and len(name) - len(suffix) >= 2:
        name, changed = name[:-len(suffix)], True
    # SONAME / ABI tails: libssl3, libgtk-3-0, libfoo1.2, libbar5t64, libbaz2a.
    stripped = re.sub(r'(?:[-.]?\d+(?:[.-]\d+)*[a-z]?(?:t64)?|t64)$', '', name)
    if stripped != name and len(stripped) >= 2:
      name, changed = stripped, True
  for prefix in _PREFIXES:
    if name.startswith(prefix) and len(name) - len(prefix) >= 2:
      name = name[len(prefix):]
      break
  return name


class _UnionFind:

  def __init__(self, n: int):
    self.parent = list(range(n))

  def find(self, i: int) -> int:
    while self.parent[i] != i:
      self.parent[i] = self.parent[self.parent[i]]
      i = self.parent[i]
    return i

  def union(self, i: int, j: int):
    i, j = self.find(i), self.find(j)
    if i != j:
      self.parent[max(i, j)] = min(i, j)


def group_records(records: Sequence[Record], max_shared_text: int = 20) -> List[str]:
  """Group key of each record: near-duplicates (by stem, or same English text) share one key.

  Args:
    records: the corpus.
    max_shared_text: a long description shared by more stems than this is boilerplate and does not
      join groups (an identical full description always does).

  Returns:
    For each record, its group's key: the smallest package stem in the group.
  """
  uf = _UnionFind(len(records))
  stems = [sorted({package_stem(p) for p in r.packages}) for r in records]
  by_key: Dict[Tuple[str, str], List[int]] = {}
  for i, record in enumerate(records):
    en = record.texts['en']
    for stem in stems[i]:
      by_key.setdefault(('stem', stem), []).append(i)
    by_key.setdefault(('full', en.synopsis + '\n' + '\n'.join(en.paragraphs)), []).append(i)
    if en.paragraphs:
      by_key.setdefault(('long', '\n'.join(en.paragraphs)), []).append(i)
  for (kind, _), members in by_key.items():
    if kind == 'long' and len({s for i in members for s in stems[i]}) > max_shared_text:
      continue
    for i in members[1:]:
      uf.union(members[0], i)
  group_key: Dict[int, str] = {}
  for i in range(len(records)):
    root = uf.find(i)
    group_key[root] = min(group_key.get(root, stems[i][0]), stems[i][0])
  return [group_key[uf.find(i)] for i in range(len(records))]


def split_of(group_key: str, fractions: Sequence[Tuple[str, float]] = DEFAULT_FRACTIONS) -> str:
  """The split of a group: SHA-256 of its key, read as a number in [0, 1), cut by the fractions."""
  u = int(hashlib.sha256(group_key.encode('utf-8')).hexdigest()[:15], 16) / float(1 << 60)
  total = 0.0
  for name, fraction in fractions:
    total += fraction
    if u < total:
      return name
  return fractions[-1][0]


def split_records(records: Sequence[Record],
                  fractions: Sequence[Tuple[str, float]] = DEFAULT_FRACTIONS,
                  max_shared_text: int = 20) -> Dict[str, List[Record]]:
  """Assigns each record to a split by its group (see the module docstring).

  Returns:
    split name -> records (in md5 order).
  """
  splits: Dict[str, List[Record]] = {name: [] for name, _ in fractions}
  for record, key in zip(records, group_records(records, max_shared_text)):
    splits[split_of(key, fractions)].append(record)
  return splits


def translation_pairs(record: Record, source: str = 'en',
                      target: str = 'de') -> List[Tuple[str, str]]:
  """Parallel sentences of a record: the synopses, and the paragraphs when their counts match."""
  if source not in record.texts or target not in record.texts:
    return []
  src, tgt = record.texts[source], record.texts[target]
  pairs = [(src.synopsis, tgt.synopsis)]
  if len(src.paragraphs) == len(tgt.paragraphs):
    pairs.extend(zip(src.paragraphs, tgt.paragraphs))
  return pairs


def summarization_example(record: Record, lang: str = 'en') -> Optional[Tuple[str, str]]:
  """(long description, synopsis), or None when there is no long description."""
  text = record.texts.get(lang)
  if text is None or not text.paragraphs:
    return None
  return '\n'.join(text.paragraphs), text.synopsis


def pretraining_texts(record: Record, languages: Iterable[str] = LANGUAGES) -> List[str]:
  """A document per language of the record: synopsis and paragraphs, one per line."""
  return ['\n'.join((t.synopsis,) + t.paragraphs) for lang, t in sorted(record.texts.items())
          if lang in languages]
