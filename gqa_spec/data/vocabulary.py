"""SentencePiece vocabularies, as T5: pad=0, eos=1, unk=2, no bos, 100 sentinel extra ids.

Every task uses `seqio.SentencePieceVocabulary(path, extra_ids=100)`. The sentinels `<extra_id_0>` ..
`<extra_id_99>` take the top ids in reverse order (`<extra_id_0>` = vocab_size - 1), which is what
span corruption relies on.

  vocab = get_vocabulary('/path/sentencepiece.model')        # a trained or T5's cc_all.32000 model
  vocab = get_vocabulary(test_vocabulary_path())              # seqio's bundled test model, offline
  train_sentencepiece(texts, '/dir/sentencepiece.model', vocab_size=8000)

The CPU presets use vocab_size 8192: 8000 pieces + 100 extra ids = 8100, padded to a multiple of 128
(`padded_vocab_size`).
"""

from __future__ import annotations

import functools
import io
import os
from typing import Iterable, Iterator, Optional

import seqio
import sentencepiece as spm

from gqa_spec.data.vocab_fit import EXTRA_IDS  # pylint: disable=unused-import  (defined seqio-free)
from gqa_spec import atomic
from gqa_spec.errors import UserError

DEFAULT_VOCAB_SIZE = 8000  # pieces, before the extra ids


def test_vocabulary_path() -> str:
  """seqio's bundled SentencePiece test model (a real model, available offline)."""
  return os.path.join(os.path.dirname(seqio.__file__), 'test_data', 'sentencepiece',
                      'sentencepiece.model')


@functools.lru_cache(maxsize=None)
def get_vocabulary(path: str, extra_ids: int = EXTRA_IDS) -> seqio.SentencePieceVocabulary:
  """The seqio vocabulary of a SentencePiece model file (cached per path).

  Raises:
    UserError: the file does not exist.
  """
  if not os.path.exists(path):
    raise UserError(f'no SentencePiece model at {path}; train one with `gqa-spec data vocab` or '
                    'pass the path of T5\'s cc_all.32000/sentencepiece.model')
  return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)


def padded_vocab_size(vocabulary: seqio.Vocabulary, multiple: int = 128) -> int:
  """The model's embedding rows: the vocabulary size rounded up to a multiple (T5X pads to 128)."""
  return -(-vocabulary.vocab_size // multiple) * multiple


def train_sentencepiece(texts: Iterable[str], output_path: str,
                        vocab_size: int = DEFAULT_VOCAB_SIZE,
                        character_coverage: float = 0.99995,
                        max_sentences: Optional[int] = 2_000_000,
                        num_threads: Optional[int] = None) -> str:
  """Trains a unigram SentencePiece model with T5's special ids and writes it.

  Args:
    texts: training text; each item is split on newlines into sentences.
    output_path: where to write the `.model` file (its directory is created).
    vocab_size: pieces, before the 100 extra ids the vocabulary adds.
    character_coverage: fraction of characters covered by single pieces (rest -> unk); high
      enough to keep German capitals such as `Ä`.
    max_sentences: sentences SentencePiece samples for training (None: all).
    num_threads: trainer threads (default: the CPU count).

  Returns:
    output_path.

  Raises:
    UserError: no text, or too little text for the vocabulary size.
  """
  def sentences() -> Iterator[str]:
    for text in texts:
      for line in text.split('\n'):
        if line.strip():
          yield line

  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences(), model_writer=model, model_type='unigram',
        vocab_size=vocab_size, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        character_coverage=character_coverage, input_sentence_size=max_sentences or 0,
        shuffle_input_sentence=True, num_threads=num_threads or os.cpu_count() or 1,
        minloglevel=2)
  except RuntimeError as e:
    raise UserError(f'SentencePiece training failed: {str(e).strip().splitlines()[-1]}') from e
  os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
  with atomic.open_for_write(output_path, 'wb') as f:
    f.write(model.getvalue())
  get_vocabulary.cache_clear()
  return output_path
