"""The papers' tasks end to end through the feature converter, on `tfds.testing.mock_data`.

TFDS builders for these datasets define their features in code, so `MockPolicy.USE_CODE` mocks
them offline (no dataset_info.json, no download). Mocked splits have no sizes, so
`num_input_examples` (only used by seqio to decide on in-memory caching) is patched to None. Mock text is random, so the checks are on the
T5 prefixes (from the pretokenized features), lengths, EOS and feature names.
"""

import contextlib
import json
from unittest import mock

import pytest
import seqio
import tensorflow_datasets as tfds

from gqa_spec.data import mediasum
from gqa_spec.data import batches as pipeline
from gqa_spec.data import tasks
from gqa_spec.data import vocabulary

PREFIXES = {
    'cnn_dailymail': 'summarize: ', 'arxiv': 'summarize: ', 'pubmed': 'summarize: ',
    'multi_news': 'summarize: ', 'xsum': 'summarize: ', 'mediasum': 'summarize: ',
    'wmt14_en_de': 'translate English to German: ', 'trivia_qa': 'trivia_qa question: ',
}
LENGTHS = {'inputs': 48, 'targets': 16}


@contextlib.contextmanager
def mock_tfds(num_examples=3):
  with tfds.testing.mock_data(num_examples=num_examples, policy=tfds.testing.MockPolicy.USE_CODE), \
      mock.patch.object(seqio.TfdsDataSource, 'num_input_examples', return_value=None):
    yield


@pytest.fixture(scope='module')
def mediasum_dir(tmp_path_factory):
  """A two-interview MediaSum release, converted to the JSONL layout."""
  root = tmp_path_factory.mktemp('mediasum')
  interviews = [{'id': f'NPR-{i}', 'program': 'p', 'date': 'd', 'url': 'u', 'title': 't',
                 'summary': f'Summary {i}.', 'utt': ['Hello there.', 'Hi.'],
                 'speaker': ['HOST', 'GUEST']} for i in range(2)]
  (root / 'news_dialogue.json').write_text(json.dumps(interviews))
  (root / 'split.json').write_text(json.dumps({'train': ['NPR-0'], 'val': ['NPR-1'], 'test': []}))
  sizes = mediasum.convert(str(root / 'news_dialogue.json'), str(root / 'split.json'),
                           str(root / 'out'))
  assert sizes == {'train': 1, 'validation': 1, 'test': 0}
  return str(root / 'out')


@pytest.fixture(scope='module', autouse=True)
def paper_tasks(mediasum_dir):
  tasks.register_paper_tasks(vocabulary.test_vocabulary_path(), mediasum_dir)
  yield
  tasks.register_paper_tasks()


@pytest.mark.parametrize('name', sorted(PREFIXES))
def test_task_preprocessing_and_feature_conversion(name):
  with mock_tfds():
    task = tasks.get(name)
    examples = list(task.get_dataset(LENGTHS, split='validation', shuffle=False)
                    .as_numpy_iterator())
    assert examples
    for ex in examples:
      assert ex['inputs_pretokenized'].decode().startswith(PREFIXES[name])
      assert ex['inputs'][-1] == 1 and len(ex['inputs']) <= LENGTHS['inputs']
      assert ex['targets'][-1] == 1 and len(ex['targets']) <= LENGTHS['targets']
    if name not in ('cnn_dailymail', 'wmt14_en_de', 'trivia_qa'):
      return  # the feature converter is the same for every task: one of each preprocessing kind
    batch = next(pipeline.get_dataset(name, 'validation', LENGTHS, batch_size=1, pack=False)
                 .as_numpy_iterator())
    assert batch['encoder_input_tokens'].shape == (1, LENGTHS['inputs'])
    assert batch['decoder_target_tokens'].shape == (1, LENGTHS['targets'])
    packed = next(pipeline.get_dataset(name, 'validation', LENGTHS, batch_size=1, pack=True)
                  .as_numpy_iterator())
    assert 'encoder_segment_ids' in packed


def test_mediasum_transcript_lines():
  task = tasks.get('mediasum')
  ex = next(task.get_dataset({'inputs': 64, 'targets': 16}, split='train', shuffle=False)
            .as_numpy_iterator())
  assert ex['inputs_pretokenized'].decode() == 'summarize: HOST: Hello there.\nGUEST: Hi.'
  assert ex['targets_pretokenized'].decode() == 'Summary 0.'


def test_trivia_qa_keeps_aliases_for_the_metric():
  with mock_tfds(2):
    task = tasks.get('trivia_qa')
    ex = next(task.get_dataset(LENGTHS, split='validation', shuffle=False).as_numpy_iterator())
  answers = task.postprocess_fn('ignored', example=ex, is_target=True)
  assert answers[0] == ex['targets_pretokenized'].decode()
  assert task.metric_fns[0]([answers], [answers[0]]) == {'em': 100.0, 'f1': 100.0}


def test_default_feature_lengths_follow_the_gqa_paper():
  assert tasks.feature_lengths('cnn_dailymail') == {'inputs': 512, 'targets': 256}
  assert tasks.feature_lengths('wmt14_en_de') == {'inputs': 512, 'targets': 256}
  assert tasks.feature_lengths('arxiv') == {'inputs': 2048, 'targets': 512}
  assert tasks.feature_lengths('trivia_qa') == {'inputs': 2048, 'targets': 32}
