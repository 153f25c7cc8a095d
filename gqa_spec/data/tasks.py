"""seqio registrations: the papers' tasks (TFDS / MediaSum files) and the local DDTP tasks.

Importing this module registers every task with the default locations (nothing is read until a
dataset is requested, so the import needs neither the data nor the network):
  DDTP data dir  `$GQA_SPEC_DATA_DIR`, else `~/.cache/gqa_spec/ddtp` (see `gqa_spec.data.corpus`)
  vocabulary     `$GQA_SPEC_VOCAB`, else `<DDTP data dir>/sentencepiece.model`
  MediaSum       `$GQA_SPEC_MEDIASUM_DIR`, else `~/.cache/gqa_spec/mediasum`

Point them elsewhere by re-registering (replaces the tasks of the same names):
  register_ddtp_tasks(data_dir, vocab_path=None)     # vocab default: data_dir/sentencepiece.model
  register_paper_tasks(vocab_path, mediasum_dir=None)

Tasks (name: default feature lengths {inputs, targets}, metrics):
  ddtp_translate_en_de   256/256  bleu          synopsis pairs + paragraph pairs (aligned by position)
  ddtp_summarize         512/64   rouge         English long description -> synopsis
  ddtp_span_corruption   512/114  -             en+de text; its 'train' split is the train records only
  ddtp_mixture           -                      the three above, rates by example count (stats.json)
  ddtp_translate_summarize -                    translate + summarize, 1:1 (multi-task fine-tuning)
  cnn_dailymail          512/256  rouge         cnn_dailymail:3.4.0
  arxiv, pubmed          2048/512 rouge         scientific_papers/{arxiv,pubmed}:1.1.1
  multi_news             2048/512 rouge         multi_news:2.1.0
  mediasum               2048/512 rouge         JSONL files, see `gqa_spec.data.mediasum`
  xsum                   2048/512 rouge         xsum:1.1.0
  wmt14_en_de            512/256  bleu          wmt14_translate/de-en:1.0.0
  trivia_qa              2048/32  trivia_qa     trivia_qa/unfiltered.nocontext:1.1.0

`feature_lengths(name)` gives the defaults; `gqa_spec.data.batches.get_dataset` applies them.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import seqio
import tensorflow as tf

from gqa_spec.data import corpus
from gqa_spec.data import ddtp
from gqa_spec.data import mediasum
from gqa_spec.data import metrics
from gqa_spec.data import preprocessors
from gqa_spec.data import span_corruption
from gqa_spec.data import vocabulary as vocabulary_lib
from gqa_spec.errors import UserError

DDTP_TASKS = ('ddtp_translate_en_de', 'ddtp_summarize', 'ddtp_span_corruption')
DDTP_MIXTURE = 'ddtp_mixture'
DDTP_FINETUNE_MIXTURE = 'ddtp_translate_summarize'

_FEATURE_LENGTHS: Dict[str, Mapping[str, int]] = {
    'ddtp_translate_en_de': {'inputs': 256, 'targets': 256},
    'ddtp_summarize': {'inputs': 512, 'targets': 64},
    'ddtp_span_corruption': {'inputs': 512, 'targets': 114},
    'ddtp_mixture': {'inputs': 512, 'targets': 256},
    'ddtp_translate_summarize': {'inputs': 512, 'targets': 256},
    'cnn_dailymail': {'inputs': 512, 'targets': 256},
    'wmt14_en_de': {'inputs': 512, 'targets': 256},
    'arxiv': {'inputs': 2048, 'targets': 512},
    'pubmed': {'inputs': 2048, 'targets': 512},
    'multi_news': {'inputs': 2048, 'targets': 512},
    'mediasum': {'inputs': 2048, 'targets': 512},
    'xsum': {'inputs': 2048, 'targets': 512},
    'trivia_qa': {'inputs': 2048, 'targets': 32},
}

_SUMMARIZATION_TFDS = {
    'cnn_dailymail': ('cnn_dailymail:3.4.0', 'article', 'highlights'),
    'arxiv': ('scientific_papers/arxiv:1.1.1', 'article', 'abstract'),
    'pubmed': ('scientific_papers/pubmed:1.1.1', 'article', 'abstract'),
    'multi_news': ('multi_news:2.1.0', 'document', 'summary'),
    'xsum': ('xsum:1.1.0', 'document', 'summary'),
}


def default_vocab_path() -> str:
  """`$GQA_SPEC_VOCAB`, else the vocabulary of the default DDTP data dir."""
  return os.environ.get('GQA_SPEC_VOCAB') or corpus.vocab_path(corpus.default_data_dir())


def feature_lengths(name: str) -> Dict[str, int]:
  """Default {inputs, targets} lengths of a registered task or mixture (GQA paper's for its tasks)."""
  get(name)
  return dict(_FEATURE_LENGTHS[name])


def get(name: str):
  """The registered seqio Task or Mixture.

  Raises:
    UserError: unknown name; the message lists the registered ones.
  """
  if name in seqio.TaskRegistry.names():
    return seqio.TaskRegistry.get(name)
  if name in seqio.MixtureRegistry.names():
    return seqio.MixtureRegistry.get(name)
  registered = sorted(set(_FEATURE_LENGTHS) & (set(seqio.TaskRegistry.names())
                                               | set(seqio.MixtureRegistry.names())))
  raise UserError(f'unknown task {name!r}; registered: {", ".join(registered)}')


def output_features(vocab_path: str) -> Dict[str, seqio.Feature]:
  # seqio loads the model lazily, so a vocabulary that does not exist yet can be registered.
  vocab = seqio.SentencePieceVocabulary(vocab_path, extra_ids=vocabulary_lib.EXTRA_IDS)
  return {'inputs': seqio.Feature(vocab, add_eos=True, required=False),
          'targets': seqio.Feature(vocab, add_eos=True)}


def _add_task(name: str, **kwargs) -> seqio.Task:
  seqio.TaskRegistry.remove(name)
  return seqio.TaskRegistry.add(name, **kwargs)


def _supervised(source, features, text_preprocessors: Sequence[Callable], metric_fns,
                postprocess_fn=None) -> Dict:
  return dict(source=source, output_features=features,
              preprocessors=[*text_preprocessors, seqio.preprocessors.tokenize,
                             seqio.CacheDatasetPlaceholder(),
                             seqio.preprocessors.append_eos_after_trim],
              metric_fns=metric_fns, postprocess_fn=postprocess_fn)


def _records_source(data_dir: str, make_examples: Callable[[ddtp.Record], List[Sequence[str]]],
                    keys: Sequence[str], splits: Sequence[str] = ddtp.SPLITS):
  """A seqio source of string examples made, per split, from the prepared DDTP records."""

  def dataset_fn(split: str, shuffle_files: bool, seed: Optional[int] = None) -> tf.data.Dataset:
    del shuffle_files, seed  # one file per split; seqio shuffles the examples
    examples = [e for record in corpus.load_split(data_dir, split) for e in make_examples(record)]
    return tf.data.Dataset.from_tensor_slices(
        {k: tf.constant([e[i] for e in examples], tf.string, shape=[len(examples)])
         for i, k in enumerate(keys)})

  return seqio.FunctionDataSource(dataset_fn, splits=splits)


def _stats_rate(data_dir: str, key: str) -> Callable[[seqio.Task], float]:
  """A mixing rate read lazily from stats.json: the task's training examples."""

  def rate(task: seqio.Task) -> float:
    del task
    stats = corpus.load_stats(data_dir)
    if stats is None:
      raise UserError(f'no stats.json in {data_dir}; run `gqa-spec data prepare --data-dir '
                      f'{data_dir}` first')
    return float(stats['splits']['train'][key])

  return rate


_ddtp_data_dir: Optional[str] = None  # the data dir the DDTP tasks read


def use_data_of(checkpoint: Optional[str]) -> Optional[str]:
  """Re-points the DDTP tasks at the data dir `checkpoint`'s run trained on, when it can be told
  (`vocab_fit.recorded_data_dir`: e.g. the smoke reproduction's `runs/smoke/data`) and neither
  `$GQA_SPEC_DATA_DIR` nor `$GQA_SPEC_VOCAB` names other data; one line on stderr says so.

  For commands that name a task against a model (`generate --task`, `eval`, `infer`): a model
  knows its data. Returns the data dir now used, or None (nothing changed).
  """
  import sys  # pylint: disable=g-import-not-at-top
  from gqa_spec.data import vocab_fit  # pylint: disable=g-import-not-at-top
  if os.environ.get('GQA_SPEC_DATA_DIR') or os.environ.get('GQA_SPEC_VOCAB'):
    return None
  recorded = vocab_fit.recorded_data_dir(checkpoint)
  if recorded is None or os.path.realpath(recorded) == os.path.realpath(
      _ddtp_data_dir or corpus.default_data_dir()):
    return None  # the tasks read it already
  register_ddtp_tasks(recorded)
  sys.stderr.write(f'gqa-spec: {checkpoint}: the DDTP tasks read the data its run trained on, '
                   f'{recorded} (GQA_SPEC_DATA_DIR names other data)\n')
  return recorded


def register_ddtp_tasks(data_dir: Optional[str] = None, vocab_path: Optional[str] = None):
  """Registers (or re-registers) the DDTP tasks and `ddtp_mixture` over a prepared data dir.

  Args:
    data_dir: a directory written by `gqa_spec.data.corpus.prepare` (default: the default one).
    vocab_path: SentencePiece model (default: `data_dir/sentencepiece.model`).
  """
  global _ddtp_data_dir
  data_dir = data_dir or corpus.default_data_dir()
  _ddtp_data_dir = data_dir  # what `use_data_of` compares with
  features = output_features(vocab_path or corpus.vocab_path(data_dir))
  _add_task('ddtp_translate_en_de', **_supervised(
      _records_source(data_dir, ddtp.translation_pairs, ('en', 'de')), features,
      [lambda ds: preprocessors.translate(ds, 'en', 'de')], [metrics.bleu]))
  _add_task('ddtp_summarize', **_supervised(
      _records_source(data_dir, lambda r: [e for e in [ddtp.summarization_example(r)] if e],
                      ('description', 'synopsis')),
      features, [lambda ds: preprocessors.summarize(ds, 'description', 'synopsis')],
      [metrics.rouge]))
  _add_task(
      'ddtp_span_corruption',
      source=_records_source(data_dir, lambda r: [(t,) for t in ddtp.pretraining_texts(r)],
                             ('text',), splits=('train', 'validation')),
      output_features=features,
      preprocessors=[
          lambda ds: ds.map(lambda x: {'targets': x['text']}),
          seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
          span_corruption.span_corruption, seqio.preprocessors.append_eos_after_trim],
      metric_fns=[])
  seqio.MixtureRegistry.remove(DDTP_MIXTURE)
  seqio.MixtureRegistry.add(DDTP_MIXTURE, [
      ('ddtp_span_corruption', _stats_rate(data_dir, 'pretraining_documents')),
      ('ddtp_translate_en_de', _stats_rate(data_dir, 'translate_en_de_pairs')),
      ('ddtp_summarize', _stats_rate(data_dir, 'summarize_examples'))])
  seqio.MixtureRegistry.remove(DDTP_FINETUNE_MIXTURE)
  seqio.MixtureRegistry.add(DDTP_FINETUNE_MIXTURE, [('ddtp_translate_en_de', 1.0),
                                                    ('ddtp_summarize', 1.0)])


def register_paper_tasks(vocab_path: Optional[str] = None, mediasum_dir: Optional[str] = None):
  """Registers (or re-registers) the papers' evaluation tasks.

  Args:
    vocab_path: SentencePiece model, e.g. T5's `cc_all.32000/sentencepiece.model` (default:
      `default_vocab_path()`).
    mediasum_dir: directory of MediaSum `{train,validation,test}.jsonl` (default:
      `mediasum.default_dir()`).
  """
  features = output_features(vocab_path or default_vocab_path())
  for name, (tfds_name, article, summary) in _SUMMARIZATION_TFDS.items():
    _add_task(name, **_supervised(
        seqio.TfdsDataSource(tfds_name=tfds_name), features,
        [lambda ds, a=article, s=summary: preprocessors.summarize(ds, a, s)], [metrics.rouge]))
  _add_task('mediasum', **_supervised(
      mediasum.source(mediasum_dir or mediasum.default_dir()), features,
      [preprocessors.mediasum_transcript], [metrics.rouge]))
  _add_task('wmt14_en_de', **_supervised(
      seqio.TfdsDataSource(tfds_name='wmt14_translate/de-en:1.0.0'), features,
      [lambda ds: preprocessors.translate(ds, 'en', 'de')], [metrics.bleu]))
  _add_task('trivia_qa', **_supervised(
      seqio.TfdsDataSource(tfds_name='trivia_qa/unfiltered.nocontext:1.1.0'), features,
      [preprocessors.trivia_qa_nocontext], [metrics.trivia_qa],
      postprocess_fn=metrics.answers_postprocessor))


register_ddtp_tasks()
register_paper_tasks()
