"""`data.vocab_fit`: a vocabulary larger than the model's embedding table is refused in one line,
naming both sizes and the data dir the model's run trained on (the check every command that
decodes text shares)."""

import os

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
  vocab_fit.check({'spm.model': 384}, 384, 'ckpt', what='--vocab')
  with pytest.raises(UserError) as e:
    vocab_fit.check({'spm.model': 8100 + vocab_fit.EXTRA_IDS}, 384, 'ckpt', what='--vocab')
  assert str(e.value) == ('--vocab spm.model has a vocabulary of 8200 ids, but ckpt embeds only '
                          '384: the model was trained for another vocabulary')


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


def test_a_command_naming_a_task_reads_the_models_data(tmp_path, monkeypatch, capsys):
  """`tasks.use_data_of`: with GQA_SPEC_DATA_DIR unset the DDTP tasks read the data the model's
  run recorded (its vocabulary); set, the user's choice stands."""
  from gqa_spec.data import corpus, tasks  # pylint: disable=g-import-not-at-top  (TensorFlow)
  monkeypatch.chdir(tmp_path)
  data_dir = tmp_path / 'runs' / 'smoke' / 'data'
  corpus.prepare(corpus.SAMPLE_LISTS_DIR, str(data_dir), vocab_size=300,
                 fractions=corpus.SAMPLE_FRACTIONS)
  ckpt = tmp_path / 'runs' / 'smoke' / 'models' / 'finetune' / 'mha_g4'
  (ckpt / 'vocab').mkdir(parents=True)
  (ckpt / 'vocab' / 'sentencepiece.model').write_bytes(
      (data_dir / 'sentencepiece.model').read_bytes())
  monkeypatch.delenv('GQA_SPEC_VOCAB', raising=False)
  monkeypatch.setenv('GQA_SPEC_DATA_DIR', str(tmp_path / 'elsewhere'))
  assert tasks.use_data_of(str(ckpt)) is None  # the user's data dir stands
  monkeypatch.delenv('GQA_SPEC_DATA_DIR')
  try:
    assert tasks.use_data_of(str(ckpt)) == os.path.join('runs', 'smoke', 'data')
    assert 'runs/smoke/data' in capsys.readouterr().err
    vocab = tasks.get('ddtp_translate_en_de').output_features['targets'].vocabulary
    assert vocab.vocab_size == 400  # the smoke run's 300 pieces + 100 extra ids, not 8100
  finally:
    tasks.register_ddtp_tasks()  # back to the default data dir for other modules
