"""DDTP reader, language join, bad input, package stems, the leak-free split, task examples."""

import bz2
import gzip
import lzma
import os
import shutil

import lz4.frame
import pytest

from gqa_spec.data import corpus, ddtp
from gqa_spec.errors import UserError

FIXTURES = corpus.SAMPLE_LISTS_DIR
EN = os.path.join(FIXTURES, 'example_i18n_Translation-en')
DE = os.path.join(FIXTURES, 'example_i18n_Translation-de')


def _read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


@pytest.fixture(scope='module')
def fixture_corpus():
  return ddtp.read_corpus(FIXTURES)


def test_parse_description_paragraphs():
  text = ddtp.parse_description(['Real-time strategy game', ' 0 A.D. is a', ' free game.', ' .',
                                 ' This package contains', '  * verbatim item'])
  assert text.synopsis == 'Real-time strategy game'
  assert text.paragraphs == ('0 A.D. is a free game.', 'This package contains * verbatim item')


def test_read_joins_languages_on_md5(fixture_corpus):
  records, report = fixture_corpus
  assert report.parsed == {'en': 70, 'de': 58} and report.malformed == {'en': 0, 'de': 0}
  assert len(records) == 70 and sum('de' in r.texts for r in records) == 58
  zero_ad = next(r for r in records if r.packages == ('0ad',))
  assert zero_ad.md5 == 'd943033bedada21853d2ae54a2578a7b'
  assert zero_ad.texts['en'].synopsis == 'Real-time strategy game of ancient warfare'
  assert zero_ad.texts['de'].synopsis == 'Echtzeit-Strategiespiel über antike Kriegsführung'


@pytest.mark.parametrize('ext,opener', [('.lz4', lz4.frame.open), ('.xz', lzma.open),
                                        ('.bz2', bz2.open), ('.gz', gzip.open)])
def test_compressed_files_read_like_plain(tmp_path, fixture_corpus, ext, opener):
  for src in (EN, DE):
    with opener(str(tmp_path / (os.path.basename(src) + ext)), 'wb') as f:
      f.write(_read(src).encode('utf-8'))
  records, _ = ddtp.read_corpus(str(tmp_path))
  assert records == fixture_corpus[0]


def test_records_of_several_archives_merge(tmp_path):
  shutil.copy(EN, tmp_path / 'main_i18n_Translation-en')
  blocks = _read(EN).split('\n\n')
  (tmp_path / 'security_i18n_Translation-en').write_text(
      blocks[0].replace('Package: 0ad', 'Package: 0ad-extra') + '\n')
  records, report = ddtp.read_corpus(str(tmp_path), languages=('en',))
  assert report.parsed['en'] == 71 and len(records) == 70
  assert next(r for r in records if '0ad' in r.packages).packages == ('0ad', '0ad-extra')


def test_malformed_records_are_counted(tmp_path):
  blocks = _read(EN).rstrip('\n').split('\n\n')
  blocks[1] = blocks[1].replace('Description-md5: ', 'Description-md5: zz')  # bad md5
  blocks[2] = blocks[2].replace('Package:', 'Pkg')  # a line that is neither field nor continuation
  blocks[3] = '\n'.join(l for l in blocks[3].split('\n') if not l.startswith('Description-en'))
  (tmp_path / 'x_i18n_Translation-en').write_text('\n\n'.join(blocks) + '\n')
  records, report = ddtp.read_corpus(str(tmp_path), languages=('en',))
  assert report.malformed['en'] == 3 and len(records) == 67
  assert '3 malformed' in report.summary()


def test_truncated_compressed_file_keeps_complete_records(tmp_path):
  raw = _read(EN).encode('utf-8')
  compressor = lz4.frame.LZ4FrameCompressor(auto_flush=True)  # one block per 4 KiB, as apt's
  data = compressor.begin() + b''.join(
      compressor.compress(raw[i:i + 4096]) for i in range(0, len(raw), 4096))
  (tmp_path / 'x_i18n_Translation-en.lz4').write_bytes(data[:len(data) // 2])
  records, report = ddtp.read_corpus(str(tmp_path), languages=('en',))
  assert report.truncated_files and 'truncated' in report.summary()
  assert 0 < len(records) < 70
  parsed_plus_dropped = report.parsed['en'] + report.malformed['en']
  assert report.malformed['en'] == 1 and parsed_plus_dropped == len(records) + 1


def test_missing_directory_says_how_to_fetch(tmp_path):
  with pytest.raises(UserError, match='gqa-spec data fetch'):
    ddtp.read_corpus(str(tmp_path / 'nope'))
  with pytest.raises(UserError, match='no Translation-en file'):
    ddtp.read_corpus(str(tmp_path))


@pytest.mark.parametrize('package,stem', [
    ('libgtk-3-0t64', 'gtk'), ('python3-numpy-doc', 'numpy'), ('python-numpy-doc', 'numpy'),
    ('0ad-data-common', '0ad'), ('libssl3', 'ssl'), ('libssl-dev', 'ssl'), ('openssl', 'openssl'),
    ('libboost-python1.74.0', 'boost-python'), ('libc6-dev', 'libc'), ('gcc-12', 'gcc'),
])
def test_package_stem(package, stem):
  assert ddtp.package_stem(package) == stem


def test_groups_join_stems_and_identical_text():
  text = ddtp.Text('A tool', ('Does things well.',))
  other = ddtp.Text('Another tool', ('Something else entirely.',))
  records = [
      ddtp.Record('1' * 32, ('foo',), {'en': text}),
      ddtp.Record('2' * 32, ('libfoo-dev',), {'en': other}),  # same stem as foo
      ddtp.Record('3' * 32, ('bar-utils',), {'en': ddtp.Text('Bar', text.paragraphs)}),  # long
      ddtp.Record('4' * 32, ('baz',), {'en': ddtp.Text('Baz', ('Unrelated.',))}),
  ]
  assert ddtp.group_records(records) == ['bar', 'bar', 'bar', 'baz']


def test_boilerplate_text_does_not_chain_groups():
  boiler = ('Transitional package. It can safely be removed.',)
  records = [ddtp.Record(f'{i:032x}', (f'pkg{chr(97 + i)}x',), {'en': ddtp.Text(f'S{i}', boiler)})
             for i in range(5)]
  assert len(set(ddtp.group_records(records, max_shared_text=3))) == 5
  assert len(set(ddtp.group_records(records, max_shared_text=10))) == 1


def test_split_is_stable_and_groups_never_straddle(fixture_corpus):
  records, _ = fixture_corpus
  fractions = corpus.SAMPLE_FRACTIONS
  splits = ddtp.split_records(records, fractions)
  reordered = ddtp.split_records(list(reversed(records)), fractions)
  assert {s: {r.md5 for r in rs} for s, rs in splits.items()} == {
      s: {r.md5 for r in rs} for s, rs in reordered.items()}
  assert sum(map(len, splits.values())) == len(records)
  assert all(splits.values())
  split_of_md5 = {r.md5: s for s, rs in splits.items() for r in rs}
  for record, key in zip(records, ddtp.group_records(records)):
    assert split_of_md5[record.md5] == ddtp.split_of(key, fractions)
  stems = {}
  for s, rs in splits.items():
    for r in rs:
      for p in r.packages:
        stems.setdefault(ddtp.package_stem(p), set()).add(s)
  assert all(len(v) == 1 for v in stems.values())
  # The 0ad family (three packages, shared long text) lands in one split.
  assert len({split_of_md5[r.md5] for r in records if r.packages[0].startswith('0ad')}) == 1
  # A hard-coded value: the hash rule must not change silently across versions or machines.
  assert ddtp.split_of('0ad') == 'train' and ddtp.split_of('0ad', fractions) == 'validation'
  assert ddtp.split_of('ssl', fractions) == 'test'


def test_task_examples():
  en = ddtp.Text('Game', ('Para one.', 'Para two.'))
  de = ddtp.Text('Spiel', ('Absatz eins.', 'Absatz zwei.'))
  record = ddtp.Record('1' * 32, ('g',), {'en': en, 'de': de})
  assert ddtp.translation_pairs(record) == [('Game', 'Spiel'), ('Para one.', 'Absatz eins.'),
                                            ('Para two.', 'Absatz zwei.')]
  unaligned = ddtp.Record('1' * 32, ('g',), {'en': en, 'de': ddtp.Text('Spiel', ('Ein.',))})
  assert ddtp.translation_pairs(unaligned) == [('Game', 'Spiel')]
  assert ddtp.summarization_example(record) == ('Para one.\nPara two.', 'Game')
  assert ddtp.summarization_example(ddtp.Record('1' * 32, ('g',), {'en': ddtp.Text('G', ())})) is None
  assert ddtp.pretraining_texts(record) == ['Spiel\nAbsatz eins.\nAbsatz zwei.',
                                            'Game\nPara one.\nPara two.']
