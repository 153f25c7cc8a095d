"""Exported tasks (`gqa-spec data export`, `data.exported`) against the seqio path they replace."""

import argparse
import json
import os

import numpy as np
import pytest
import seqio

from gqa_spec.data import commands, exported, features, tasks
from gqa_spec.errors import UserError

LENGTHS = {'inputs': 48, 'targets': 24}
SPLIT = 'validation'


@pytest.fixture(scope='module')
def export_dir(tiny_corpus, tmp_path_factory):
  """The tiny corpus's translate + summarize mixture and span corruption, exported by the CLI."""
  data_dir, _ = tiny_corpus
  out = str(tmp_path_factory.mktemp('export'))
  parser = argparse.ArgumentParser()
  commands.register(parser.add_subparsers())
  for names in (['ddtp_translate_summarize'], ['ddtp_span_corruption']):
    args = parser.parse_args(['data', 'export', *names, '--out', out, '--lengths', '48,24',
                              '--data-dir', data_dir])
    assert args.func(args) == 0
  yield out
  tasks.register_ddtp_tasks()  # back to the default data dir for other modules


def _seqio_batches(name, pack, batch_size):
  ds = seqio.get_dataset(name, task_feature_lengths=LENGTHS, dataset_split=SPLIT, shuffle=False,
                         num_epochs=1, feature_converter=seqio.EncDecFeatureConverter(pack=pack),
                         seed=0)  # the export's seed: the same span-corruption noise
  return list(ds.batch(batch_size, drop_remainder=True).as_numpy_iterator())


def _same(ours, theirs):
  assert len(ours) == len(theirs) > 0
  for a, b in zip(ours, theirs):
    assert sorted(a) == sorted(b)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize('task,pack', [('ddtp_translate_en_de', True), ('ddtp_summarize', True),
                                       ('ddtp_span_corruption', True), ('ddtp_summarize', False)])
def test_batches_equal_seqio_converter(export_dir, task, pack):
  ours = list(exported.get_batches(f'exported:{export_dir}/{task}', SPLIT, LENGTHS, 4, pack=pack,
                                   shuffle=False, num_epochs=1))
  _same(ours, _seqio_batches(task, pack, 4))


def test_shorter_lengths_trim_as_seqio(export_dir):
  short = {'inputs': 20, 'targets': 10}
  ours = list(exported.get_batches(f'exported:{export_dir}/ddtp_summarize', SPLIT, short, 2,
                                   shuffle=False, num_epochs=1))
  ds = seqio.get_dataset('ddtp_summarize', task_feature_lengths=short, dataset_split=SPLIT,
                         shuffle=False, num_epochs=1,
                         feature_converter=seqio.EncDecFeatureConverter(pack=True))
  _same(ours, list(ds.batch(2, drop_remainder=True).as_numpy_iterator()))
  with pytest.raises(UserError, match='exactly'):  # span corruption's noise depends on lengths
    next(exported.get_batches(f'exported:{export_dir}/ddtp_span_corruption', SPLIT, short, 2))
  with pytest.raises(UserError, match='at most'):
    next(exported.get_batches(f'exported:{export_dir}/ddtp_summarize', SPLIT,
                              {'inputs': 96, 'targets': 24}, 2))


def test_manifest_vocabulary_and_texts(export_dir, tiny_corpus):
  with open(os.path.join(export_dir, 'ddtp_translate_en_de', exported.MANIFEST)) as f:
    manifest = json.load(f)
  assert manifest['dtype'] == 'uint16' and manifest['vocab_size'] == 400
  assert manifest['metric_fns'] == ['gqa_spec.data.metrics:bleu']
  assert manifest['lengths'] == LENGTHS and not manifest['length_dependent']
  assert os.path.isfile(os.path.join(export_dir, manifest['vocabulary']))
  task = exported.ExportedTask(os.path.join(export_dir, 'ddtp_translate_en_de'))
  seqio_task = tasks.get('ddtp_translate_en_de')
  examples = list(seqio_task.get_dataset(LENGTHS, split=SPLIT, shuffle=False).as_numpy_iterator())
  assert task.num_examples(SPLIT) == len(examples) == manifest['splits'][SPLIT]['examples']
  vocab = seqio_task.output_features['targets'].vocabulary
  for i, example in enumerate(examples):
    ours = task.example(SPLIT, i, LENGTHS)['targets']
    np.testing.assert_array_equal(ours, example['targets'])
    assert task.vocabulary.decode(ours) == vocab.decode(example['targets'].tolist())
    assert task.texts(SPLIT)[i]['targets_pretokenized'] == example['targets_pretokenized'].decode()
  # Sentinels decode to UNK's surface form, as seqio's vocabulary decodes them.
  ids = [5, 399, 7, 1, 9, 450]
  assert task.vocabulary.decode(ids) == vocab.decode(ids)
  with open(os.path.join(export_dir, 'ddtp_translate_summarize', exported.MIXTURE_FILE)) as f:
    assert json.load(f)['rates'] == {'ddtp_summarize': 1.0, 'ddtp_translate_en_de': 1.0}


def test_shuffle_repeat_and_exact_resume(export_dir):
  name = f'exported:{export_dir}/ddtp_translate_summarize'

  def take(n, skip=0, seed=3):
    it = exported.get_batches(name, 'train', LENGTHS, 2, seed=seed, skip_batches=skip)
    return [next(it) for _ in range(n)]

  one_pass = len(list(exported.get_batches(name, 'train', LENGTHS, 2, shuffle=False,
                                           num_epochs=1)))
  run = take(one_pass + 10)  # into the second epoch of the tiny splits
  _same(take(15, skip=one_pass - 5), run[one_pass - 5:])
  other = take(4, seed=4)
  assert any(not np.array_equal(a['encoder_input_tokens'], b['encoder_input_tokens'])
             for a, b in zip(run, other))


def test_mixture_draws_both_tasks_by_rate(export_dir):
  task_names = []
  translate = exported.ExportedTask(os.path.join(export_dir, 'ddtp_translate_en_de'))
  prefix = translate.vocabulary  # the translate prompt's first piece starts every translate input
  batches = exported.get_batches(f'exported:{export_dir}/ddtp_translate_summarize', 'train',
                                 LENGTHS, 8, pack=False, seed=0)
  for _ in range(10):
    for row in next(batches)['encoder_input_tokens']:
      task_names.append(prefix.decode(row).startswith('translate English to German'))
  share = np.mean(task_names)
  assert 0.3 < share < 0.7  # rates 1:1 over 80 draws


def test_unknown_names_and_splits(export_dir):
  with pytest.raises(UserError, match='exported there: .*ddtp_summarize'):
    exported.resolve(f'exported:{export_dir}/nope')
  with pytest.raises(UserError, match='no exported split'):
    next(exported.get_batches(f'exported:{export_dir}/ddtp_span_corruption', 'test', LENGTHS, 2))


def test_pack_rows_closes_rows_at_chunk_ends():
  # lengths limit 4: chunks of 4 examples; the open row closes at each chunk end.
  lengths = np.array([[1, 1]] * 6)
  assert features.pack_rows(lengths, {'inputs': 4, 'targets': 3}) == [[0, 1, 2], [3], [4, 5]]


def test_shared_batches_give_what_a_fresh_pipeline_gives(export_dir):
  """`training.data.shared_batches` (the reproduction's jobs share their datasets): a later reader
  with the same config and start replays the kept batches and reads on; a full cache or another
  start reads on from a pipeline of its own; readers cannot change what the next one gets."""
  from gqa_spec.training import data  # pylint: disable=g-import-not-at-top
  cfg = data.DatasetConfig(f'exported:{export_dir}/ddtp_translate_summarize', LENGTHS,
                           batch_size=2, seed=3)

  def take(n, skip=0):
    it = data.get_batches(cfg, skip_batches=skip)
    return [next(it) for _ in range(n)]

  fresh = take(20)
  size = sum(a.nbytes for a in fresh[0].values())
  for max_bytes in (1 << 30, 4 * size):  # room for all; room for 4 batches
    with data.shared_batches(max_bytes):
      first = take(6)
      first[0]['encoder_input_tokens'] = None  # a reader's own dict
      with pytest.raises(ValueError):
        first[1]['decoder_target_tokens'][0, 0] = 7  # shared arrays are read-only
      _same(first[2:], fresh[2:6])
      again = take(15)
      _same(again, fresh[:15])  # replayed, then read on
      kept = 6 if max_bytes > 4 * size else 4
      assert all((again[i]['decoder_target_tokens'] is first[i]['decoder_target_tokens'])
                 == (i < kept) for i in range(1, 6))  # the kept arrays themselves
      _same(take(17), fresh[:17])
      _same(take(10, skip=3), fresh[3:13])  # another start: its own pipeline
