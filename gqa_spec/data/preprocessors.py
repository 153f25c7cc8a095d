"""T5's text preprocessors for the papers' tasks: raw source features -> `inputs`/`targets` strings.

Each is a pure `tf.data` map, usable on a three-example dataset:

  summarize(ds, 'article', 'highlights')      inputs 'summarize: <article>', targets '<highlights>'
  translate(ds, 'en', 'de')                   inputs 'translate English to German: <en>'
  trivia_qa_nocontext(ds)                     inputs 'trivia_qa question: <q>', targets the answer,
                                              plus `answers` (all aliases) for the metric
"""

from __future__ import annotations

import seqio
import tensorflow as tf

LANGUAGE_NAMES = {'en': 'English', 'de': 'German', 'fr': 'French', 'ro': 'Romanian'}


def summarize(dataset: tf.data.Dataset, article_key: str, summary_key: str) -> tf.data.Dataset:
  """`summarize: ` + article -> summary (T5's `summarize` preprocessor)."""

  @seqio.map_over_dataset
  def fn(x):
    return {'inputs': tf.strings.join(['summarize:', x[article_key]], separator=' '),
            'targets': x[summary_key]}

  return fn(dataset)


def translate(dataset: tf.data.Dataset, source_language: str,
              target_language: str) -> tf.data.Dataset:
  """`translate English to German: ` + source -> target; features named by language code."""
  prefix = (f'translate {LANGUAGE_NAMES[source_language]} to '
            f'{LANGUAGE_NAMES[target_language]}:')

  @seqio.map_over_dataset
  def fn(x):
    return {'inputs': tf.strings.join([prefix, x[source_language]], separator=' '),
            'targets': x[target_language]}

  return fn(dataset)


def trivia_qa_nocontext(dataset: tf.data.Dataset,
                        prefix: str = 'trivia_qa question:') -> tf.data.Dataset:
  """TriviaQA without evidence: question -> answer value; `answers` keeps every alias.

  The answer value is in the aliases of TFDS's TriviaQA (it is in the released JSON), but the value
  is added to `answers` anyway so the metric never scores the reference target as wrong.
  """

  @seqio.map_over_dataset
  def fn(x):
    answer = x['answer']
    return {'inputs': tf.strings.join([prefix, x['question']], separator=' '),
            'targets': answer['value'],
            'answers': tf.concat([[answer['value']], answer['aliases']], axis=0)}

  return fn(dataset.filter(lambda x: tf.strings.length(x['answer']['value']) > 0))


def mediasum_transcript(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """MediaSum interview -> `summarize: ` + one `speaker: utterance` line per turn, -> summary."""

  @seqio.map_over_dataset
  def fn(x):
    turns = tf.strings.join([x['speaker'], x['utt']], separator=': ')  # [num_turns]
    return {'inputs': tf.strings.join(
                ['summarize:', tf.strings.reduce_join(turns, separator='\n')], separator=' '),
            'targets': x['summary']}

  return fn(dataset)
