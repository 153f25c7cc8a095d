"""The prepared DDTP corpus on disk: fetch, prepare (split + stats + vocabulary), load.

Layout of a data dir (default `$GQA_SPEC_DATA_DIR`, else `~/.cache/gqa_spec/ddtp`):

  train.jsonl, validation.jsonl, test.jsonl   one `ddtp.Record` per line (md5, packages, texts)
  stats.json                                  records and task examples per split, reader report
  sentencepiece.model                         unigram vocabulary trained on the train split (en+de)

Build a tiny corpus from the excerpt shipped in the package (70 real English and 58 German
records of the bookworm Translation files; tests and the `smoke` reproduction use it):

  from gqa_spec.data import corpus, tasks
  stats = corpus.prepare(lists_dir=corpus.SAMPLE_LISTS_DIR, data_dir=tmp, vocab_size=300,
                         fractions=corpus.SAMPLE_FRACTIONS)
  tasks.register_ddtp_tasks(tmp)       # vocab defaults to tmp/sentencepiece.model
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Dict, List, Optional, Sequence, Tuple

from gqa_spec import atomic
from gqa_spec.data import ddtp
from gqa_spec.data import vocabulary as vocabulary_lib
from gqa_spec.errors import UserError

VOCAB_FILENAME = 'sentencepiece.model'
SAMPLE_LISTS_DIR = os.path.join(os.path.dirname(__file__), 'sample')
# The excerpt is small: wider validation/test fractions keep every split non-empty.
SAMPLE_FRACTIONS = (('train', 0.6), ('validation', 0.2), ('test', 0.2))
STATS_FILENAME = 'stats.json'


def default_data_dir() -> str:
  """`$GQA_SPEC_DATA_DIR`, else `~/.cache/gqa_spec/ddtp`."""
  return os.environ.get('GQA_SPEC_DATA_DIR') or os.path.join(
      os.path.expanduser('~'), '.cache', 'gqa_spec', 'ddtp')


def split_path(data_dir: str, split: str) -> str:
  return os.path.join(data_dir, f'{split}.jsonl')


def vocab_path(data_dir: str) -> str:
  return os.path.join(data_dir, VOCAB_FILENAME)


def fetch(languages: Sequence[str] = ddtp.LANGUAGES) -> str:
  """Asks apt to download the Translation files of `languages` (Debian-like systems, as root).

  Returns:
    apt's lists directory.

  Raises:
    UserError: no apt-get, not root, or apt-get failed; the message says what to do instead.
  """
  option = 'Acquire::Languages=' + ','.join(languages)
  if shutil.which('apt-get') is None:
    raise UserError('apt-get not found: this is not a Debian-like system; ' + ddtp.FETCH_HINT)
  if os.geteuid() != 0:
    raise UserError(f'fetching needs root: run `sudo apt-get update -o {option}`, then '
                    '`gqa-spec data prepare`')
  result = subprocess.run(['apt-get', 'update', '-o', option], capture_output=True, text=True)
  if result.returncode != 0:
    last = (result.stderr.strip().splitlines() or ['(no output)'])[-1]
    raise UserError(f'apt-get update failed ({last}); ' + ddtp.FETCH_HINT)
  return ddtp.APT_LISTS_DIR


def _split_stats(records: Sequence[ddtp.Record]) -> Dict[str, int]:
  return {
      'records': len(records),
      'records_with_de': sum('de' in r.texts for r in records),
      'translate_en_de_pairs': sum(len(ddtp.translation_pairs(r)) for r in records),
      'summarize_examples': sum(ddtp.summarization_example(r) is not None for r in records),
      'pretraining_documents': sum(len(ddtp.pretraining_texts(r)) for r in records),
  }


def prepare(lists_dir: str = ddtp.APT_LISTS_DIR, data_dir: Optional[str] = None,
            vocab_size: int = vocabulary_lib.DEFAULT_VOCAB_SIZE, train_vocab: bool = True,
            fractions: Sequence[Tuple[str, float]] = ddtp.DEFAULT_FRACTIONS,
            max_shared_text: int = 20) -> Dict:
  """Reads the Translation files, splits them, writes the splits, stats and a vocabulary.

  Args:
    lists_dir: directory of `*_i18n_Translation-{en,de}*` files.
    data_dir: output directory (default `default_data_dir()`).
    vocab_size: SentencePiece pieces (the seqio vocabulary adds 100 extra ids).
    train_vocab: train the vocabulary on the train split's English and German text.
    fractions: (split, fraction) pairs.
    max_shared_text: see `ddtp.group_records`.

  Returns:
    The stats written to `stats.json`.
  """
  data_dir = data_dir or default_data_dir()
  records, report = ddtp.read_corpus(lists_dir)
  splits = ddtp.split_records(records, fractions, max_shared_text)
  os.makedirs(data_dir, exist_ok=True)
  for split, split_records in splits.items():
    with atomic.open_for_write(split_path(data_dir, split)) as f:
      for record in split_records:
        f.write(json.dumps(record.to_json(), ensure_ascii=False) + '\n')
  stats = {
      'lists_dir': os.path.abspath(lists_dir),
      'reader': {'files': report.files, 'parsed': report.parsed, 'malformed': report.malformed,
                 'truncated_files': report.truncated_files,
                 'orphan_translations': report.orphan_translations},
      'fractions': dict(fractions),
      'splits': {split: _split_stats(split_records) for split, split_records in splits.items()},
  }
  if train_vocab:
    texts = (t for r in splits['train'] for t in ddtp.pretraining_texts(r))
    vocabulary_lib.train_sentencepiece(texts, vocab_path(data_dir), vocab_size)
    stats['vocabulary'] = {'path': vocab_path(data_dir), 'pieces': vocab_size,
                           'extra_ids': vocabulary_lib.EXTRA_IDS}
  atomic.write_json(os.path.join(data_dir, STATS_FILENAME), stats, indent=1, sort_keys=True)
  return stats


def load_split(data_dir: str, split: str) -> List[ddtp.Record]:
  """The records of a prepared split.

  Raises:
    UserError: the split was not prepared.
  """
  path = split_path(data_dir, split)
  if not os.path.exists(path):
    raise UserError(f'no prepared DDTP split at {path}; run `gqa-spec data prepare --data-dir '
                    f'{data_dir}` first')
  with open(path, encoding='utf-8') as f:
    return [ddtp.Record.from_json(json.loads(line)) for line in f if line.strip()]


def load_stats(data_dir: str) -> Optional[Dict]:
  """`stats.json` of a prepared data dir, or None."""
  path = os.path.join(data_dir, STATS_FILENAME)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def format_stats(stats: Dict) -> str:
  """A markdown table of the per-split sizes."""
  columns = list(next(iter(stats['splits'].values())))
  lines = ['| split | ' + ' | '.join(columns) + ' |', '|---' * (len(columns) + 1) + '|']
  for split, values in stats['splits'].items():
    lines.append(f'| {split} | ' + ' | '.join(str(values[c]) for c in columns) + ' |')
  return '\n'.join(lines)
