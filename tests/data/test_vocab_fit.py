"""A model knows its data: a vocabulary mismatch names the data dir the model's run trained on."""

import os

import pytest

from gqa_spec.data import vocab_fit
from gqa_spec.errors import UserError


def _layout(root, same=True):
  """A reproduction's work dir: data/ beside models/, the checkpoint carrying its vocabulary."""
  ckpt = root / 'runs' / 'smoke' / 'models' / 'finetune' / 'task' / 'mha_g4' / 'best'
  (ckpt / 'vocab').mkdir(parents=True)
  (ckpt / 'vocab' / 'sentencepiece.model').write_bytes(b'smoke vocabulary')
  (root / 'runs' / 'smoke' / 'data').mkdir()
  (root / 'runs' / 'smoke' / 'data' / 'sentencepiece.model').write_bytes(
      b'smoke vocabulary' if same else b'another vocabulary')
  return ckpt


def test_the_data_dir_is_the_one_with_the_checkpoints_vocabulary(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  ckpt = _layout(tmp_path)
  assert vocab_fit.recorded_data_dir(str(ckpt)) == os.path.join('runs', 'smoke', 'data')
  with pytest.raises(UserError) as error:
    vocab_fit.check({'ddtp_translate_en_de': 8100}, 512, str(ckpt), checkpoint=str(ckpt))
  message = str(error.value)
  assert message.startswith('task ddtp_translate_en_de has a vocabulary of 8100 ids, but ')
  assert 'set GQA_SPEC_DATA_DIR=runs/smoke/data' in message and '\n' not in message


def test_without_a_recorded_data_dir_the_message_names_the_variables(tmp_path):
  ckpt = _layout(tmp_path, same=False)  # a data/ of another vocabulary is not the model's
  assert vocab_fit.recorded_data_dir(str(ckpt)) is None
  assert vocab_fit.recorded_data_dir(str(tmp_path / 'none')) is None
  assert vocab_fit.recorded_data_dir(None) is None
  with pytest.raises(UserError, match='point GQA_SPEC_DATA_DIR .* at the data it was trained on'):
    vocab_fit.check({'t': 8100}, 512, 'model_config')
  vocab_fit.check({'t': 512}, 512, 'model_config')  # fits: no error
