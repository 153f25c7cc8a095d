"""`data.vocab_fit`: a vocabulary larger than the model's embedding table is refused in one line,
naming both sizes (the check every command that decodes text shares)."""

import pytest

from gqa_spec.data import vocab_fit
from gqa_spec.errors import UserError


def test_a_task_vocabulary_larger_than_the_model_is_refused():
  vocab_fit.check({'small': 384, 'smaller': 200}, 384, 'the model')  # fits exactly
  with pytest.raises(UserError, match=r'^task ddtp has a vocabulary of 8200 ids, but the model '
                                      r'embeds only 384: the model was trained for another '):
    vocab_fit.check({'small': 100, 'ddtp': 8200}, 384, 'the model')


def test_a_named_vocabulary_larger_than_the_model_is_refused():
  """Issue 61, case 4: `generate --vocab SPM` with 8,100 pieces (+ 100 extra ids) on a 384-token
  model; `generate` calls this once its vocabulary is read."""
  vocab_fit.check_vocabulary('--vocab spm.model', 384, 384, 'ckpt')
  with pytest.raises(UserError) as e:
    vocab_fit.check_vocabulary('--vocab spm.model', 8100 + vocab_fit.EXTRA_IDS, 384, 'ckpt')
  assert str(e.value) == ('--vocab spm.model has a vocabulary of 8200 ids, but ckpt embeds only '
                          '384: the model was trained for another vocabulary')
