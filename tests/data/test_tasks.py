"""DDTP seqio tasks over a tiny prepared corpus, the feature converter, the CLI and re-registration."""

import argparse
import json
import os

import pytest
import seqio

from gqa_spec.data import commands
from gqa_spec.data import corpus
from gqa_spec.data import batches as pipeline
from gqa_spec.data import tasks
from gqa_spec.data import vocabulary
from gqa_spec.errors import UserError

LENGTHS = {'inputs': 64, 'targets': 32}


@pytest.fixture(scope='module')
def registered(tiny_corpus):
  data_dir, stats = tiny_corpus
  tasks.register_ddtp_tasks(data_dir)
  yield data_dir, stats
  tasks.register_ddtp_tasks()  # back to the default data dir for other modules


def _run_cli(argv):
  parser = argparse.ArgumentParser()
  commands.register(parser.add_subparsers())
  args = parser.parse_args(argv)
  return args.func(args)


def test_prepare_writes_splits_stats_and_vocabulary(registered):
  data_dir, stats = registered
  sizes = {s: v['records'] for s, v in stats['splits'].items()}
  assert sum(sizes.values()) == 70 and all(sizes.values())
  assert corpus.load_stats(data_dir) == json.loads(json.dumps(stats))
  vocab = vocabulary.get_vocabulary(corpus.vocab_path(data_dir))
  assert vocab.vocab_size == 300 + vocabulary.EXTRA_IDS
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert vocabulary.padded_vocab_size(vocab) == 512
  text = 'Real-time strategy game of ancient warfare'
  assert vocab.decode(vocab.encode(text)) == text
  assert len(corpus.load_split(data_dir, 'test')) == sizes['test']


def test_translate_task_examples(registered):
  task = tasks.get('ddtp_translate_en_de')
  vocab = task.output_features['targets'].vocabulary
  examples = list(task.get_dataset(LENGTHS, split='validation', shuffle=False).as_numpy_iterator())
  assert len(examples) == registered[1]['splits']['validation']['translate_en_de_pairs']
  inputs = [vocab.decode(e['inputs'].tolist()) for e in examples]
  assert all(i.startswith('translate English to German: ') for i in inputs)
  assert all(e['targets'][-1] == vocab.eos_id and len(e['targets']) <= 32 for e in examples)
  pairs = [(i, vocab.decode(e['targets'].tolist())) for i, e in zip(inputs, examples)]
  # 0ad is in the validation split of the tiny corpus (pinned in test_ddtp).
  assert ('translate English to German: Real-time strategy game of ancient warfare',
          'Echtzeit-Strategiespiel über antike Kriegsführung') in pairs


def test_summarize_task_targets_are_synopses(registered):
  data_dir, _ = registered
  task = tasks.get('ddtp_summarize')
  vocab = task.output_features['targets'].vocabulary
  synopses = {r.texts['en'].synopsis for r in corpus.load_split(data_dir, 'validation')}
  examples = list(task.get_dataset({'inputs': 512, 'targets': 64}, split='validation',
                                   shuffle=False).as_numpy_iterator())
  assert {vocab.decode(e['targets'].tolist()) for e in examples} == synopses
  assert all(vocab.decode(e['inputs'].tolist()).startswith('summarize: ') for e in examples)


def test_span_corruption_task_only_sees_its_split(registered):
  task = tasks.get('ddtp_span_corruption')
  assert set(task.splits) == {'train', 'validation'}
  lengths = {'inputs': 64, 'targets': 16}
  with seqio.map_seed_manager(0):
    examples = list(task.get_dataset(lengths, split='train', shuffle=False).as_numpy_iterator())
  vocab = task.output_features['targets'].vocabulary
  assert len(examples) > 20
  sentinel_0 = vocab.vocab_size - 1
  assert all(e['targets'][0] == sentinel_0 and e['inputs'][-1] == vocab.eos_id for e in examples)
  assert all(len(e['inputs']) == 64 for e in examples[:-1])


def test_packed_training_features(registered):
  lengths = {'inputs': 256, 'targets': 128}
  ds = pipeline.get_dataset('ddtp_translate_en_de', 'train', lengths, batch_size=4, pack=True,
                            shuffle=True, seed=1)
  batch = next(ds.as_numpy_iterator())
  assert set(batch) == {'encoder_input_tokens', 'encoder_segment_ids', 'encoder_positions',
                        'decoder_input_tokens', 'decoder_target_tokens', 'decoder_loss_weights',
                        'decoder_segment_ids', 'decoder_positions'}
  assert batch['encoder_input_tokens'].shape == (4, 256)
  assert batch['decoder_target_tokens'].shape == (4, 128)
  assert batch['encoder_segment_ids'].max() >= 2  # short synopsis pairs do get packed
  # decoder inputs are the targets shifted right within each segment (0 starts a segment).
  starts = batch['decoder_positions'] == 0
  assert (batch['decoder_input_tokens'][starts] == 0).all()


def test_unpacked_inference_features_and_mixture(registered):
  ds = pipeline.get_dataset('ddtp_summarize', 'validation', LENGTHS, batch_size=2, pack=False)
  batch = next(ds.as_numpy_iterator())
  assert set(batch) == {'encoder_input_tokens', 'decoder_input_tokens', 'decoder_target_tokens',
                        'decoder_loss_weights'}
  assert tasks.get('ddtp_summarize').metric_fns
  mixture = tasks.get(tasks.DDTP_MIXTURE)
  stats = registered[1]['splits']['train']
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert rates['ddtp_translate_en_de'] == stats['translate_en_de_pairs']
  batch = next(pipeline.get_dataset(tasks.DDTP_MIXTURE, 'train', LENGTHS, batch_size=2,
                                    shuffle=True, seed=0).as_numpy_iterator())
  assert batch['encoder_input_tokens'].shape == (2, 64)


def test_reregistering_points_tasks_at_another_dir(tiny_corpus, tmp_path):
  tasks.register_ddtp_tasks(str(tmp_path))
  try:
    with pytest.raises(UserError, match='gqa-spec data prepare'):
      list(tasks.get('ddtp_summarize').get_dataset(LENGTHS, split='train'))
  finally:
    tasks.register_ddtp_tasks(tiny_corpus[0])
  assert next(iter(tasks.get('ddtp_summarize').get_dataset(LENGTHS, split='train')))


def test_unknown_task_lists_registered():
  with pytest.raises(UserError, match='registered: .*ddtp_summarize.*trivia_qa'):
    tasks.get('no_such_task')


def test_cli_show_and_vocab(registered, capsys, tmp_path):
  data_dir, _ = registered
  assert _run_cli(['data', 'show', 'ddtp_summarize', '--split', 'validation', '-n', '3',
                   '--data-dir', data_dir]) == 0
  out = capsys.readouterr().out
  assert out.count('--- ddtp_summarize [validation] example') == 3
  assert 'inputs (' in out and 'summarize: ' in out and '</s>' in out
  assert _run_cli(['data', 'show', 'ddtp_span_corruption', '--split', 'train', '-n', '1',
                   '--lengths', '64,16', '--data-dir', data_dir]) == 0
  assert '<extra_id_0>' in capsys.readouterr().out
  output = str(tmp_path / 'v.model')
  assert _run_cli(['data', 'vocab', '--task', 'ddtp_translate_en_de', '--size', '200',
                   '--output', output, '--data-dir', data_dir]) == 0
  assert vocabulary.get_vocabulary(output).vocab_size == 300
  with pytest.raises(UserError, match='unknown task'):
    _run_cli(['data', 'show', 'nope', '--data-dir', data_dir])
  tasks.register_paper_tasks()


def test_cli_show_names_the_splits_and_the_flag(registered, capsys):
  data_dir, _ = registered
  with pytest.raises(UserError, match="ddtp_summarize has no split 'nosuch'; its splits: test, "
                     'train, validation'):
    _run_cli(['data', 'show', 'ddtp_summarize', '--split', 'nosuch', '--data-dir', data_dir])
  with pytest.raises(UserError, match="ddtp_mixture has no split 'nosuch'; its splits: train, validation$"):
    _run_cli(['data', 'show', 'ddtp_mixture', '--split', 'nosuch', '--data-dir', data_dir])
  with pytest.raises(SystemExit):
    _run_cli(['data', 'show', 'ddtp_summarize', '-n', '-3', '--data-dir', data_dir])
  assert 'argument -n: must be >= 1, got -3' in capsys.readouterr().err


def test_cli_prepare_on_missing_dir(tmp_path):
  with pytest.raises(UserError, match='data fetch'):
    _run_cli(['data', 'prepare', '--lists-dir', str(tmp_path / 'none'),
              '--data-dir', str(tmp_path / 'out')])


def test_registration_needs_no_data(registered, tmp_path):
  absent = str(tmp_path / 'absent')
  tasks.register_ddtp_tasks(absent)
  try:
    vocab = tasks.get('ddtp_summarize').output_features['targets'].vocabulary
    assert vocab.sentencepiece_model_file == os.path.join(absent, 'sentencepiece.model')
  finally:
    tasks.register_ddtp_tasks(registered[0])
