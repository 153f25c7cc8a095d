"""Native orbax checkpoints: bit-identical round trip and one clear error per kind of bad input."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.checkpoints import native
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

TINY = T5Config(vocab_size=40, emb_dim=16, num_heads=4, num_kv_heads=2, head_dim=4, mlp_dim=24,
                num_encoder_layers=1, num_decoder_layers=2)


def _params(config=TINY, seed=0):
  tokens = jnp.ones((1, 3), jnp.int32)
  return jax.jit(lambda: Transformer(config).init(jax.random.PRNGKey(seed), tokens, tokens, tokens,
                                                  enable_dropout=False)['params'])()


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('native') / 'ckpt')
  vocab = tmp_path_factory.mktemp('vocab') / 'spm.model'
  vocab.write_bytes(b'\x00sentencepiece bytes')
  params = _params()
  native.save_checkpoint(directory, TINY, params, str(vocab))
  return directory, params


@pytest.mark.parametrize('param_dtype', ['float32', 'bfloat16'])
def test_round_trip_is_bit_identical(tmp_path, param_dtype):
  config = TINY.replace(param_dtype=param_dtype)
  params = _params(config)
  native.save_checkpoint(str(tmp_path / 'ckpt'), config, params)
  loaded_config, loaded, vocab = native.load_checkpoint(str(tmp_path / 'ckpt'))
  assert loaded_config == config and vocab is None
  assert jax.tree.structure(loaded) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    assert a.dtype == b.dtype == jnp.dtype(param_dtype)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_vocabulary_travels_with_the_checkpoint(saved):
  directory, _ = saved
  _, _, vocab = native.load_checkpoint(directory)
  assert vocab == os.path.join(directory, 'vocab', 'sentencepiece.model')
  with open(vocab, 'rb') as f:
    assert f.read() == b'\x00sentencepiece bytes'


def test_refuses_to_overwrite(saved):
  directory, params = saved
  with pytest.raises(UserError, match='already exists'):
    native.save_checkpoint(directory, TINY, params)


def test_save_checks_params_against_config(tmp_path):
  with pytest.raises(UserError, match=r'decoder/layers_0/\w+/key/kernel has shape \(16, 8\)'):
    native.save_checkpoint(str(tmp_path / 'c'), TINY.replace(num_kv_heads=4), _params())
  assert not (tmp_path / 'c').exists()


def _copy(saved, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  directory = str(tmp_path / 'copy')
  shutil.copytree(saved[0], directory)
  return directory


def test_missing_directory(tmp_path):
  with pytest.raises(UserError, match='checkpoint directory not found'):
    native.load_checkpoint(str(tmp_path / 'nothing'))


def test_missing_config(saved, tmp_path):
  directory = _copy(saved, tmp_path)
  os.remove(os.path.join(directory, 'config.json'))
  with pytest.raises(UserError, match=r'config.json: missing'):
    native.load_checkpoint(directory)


@pytest.mark.parametrize('text,match', [('{"emb_dim": ', 'not valid JSON'),
                                        ('{"emb_dims": 3}', 'unknown T5Config fields'),
                                        ('[1, 2]', 'must be an object'),
                                        ('{"num_heads": 0}', 'positive integer')])
def test_corrupt_config(saved, tmp_path, text, match):
  directory = _copy(saved, tmp_path)
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    f.write(text)
  with pytest.raises(UserError, match=f'config.json: corrupt model config: .*{match}'):
    native.load_checkpoint(directory)


def test_config_shape_mismatch_names_the_parameter(saved, tmp_path):
  directory = _copy(saved, tmp_path)
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    f.write(TINY.replace(mlp_dim=32).to_json())
  with pytest.raises(UserError, match=r'params: parameter decoder/layers_0/mlp/wi_0/kernel has '
                     r'shape \(16, 24\), the model config needs \(16, 32\)'):
    native.load_checkpoint(directory)
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    f.write(TINY.replace(num_decoder_layers=3).to_json())
  with pytest.raises(UserError, match='parameter decoder/layers_2/.* is missing'):
    native.load_checkpoint(directory)


def test_missing_params(saved, tmp_path):
  directory = _copy(saved, tmp_path)
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(os.path.join(directory, 'params'))
  with pytest.raises(UserError, match='params: missing'):
    native.load_checkpoint(directory)


def test_corrupt_params(saved, tmp_path):
  directory = _copy(saved, tmp_path)
  params_dir = os.path.join(directory, 'params')
  for root, _, files in os.walk(params_dir):
    for name in files:
      with open(os.path.join(root, name), 'wb') as f:
        f.write(b'garbage')
  with pytest.raises(UserError, match='params: (unreadable|corrupt) orbax checkpoint'):
    native.load_checkpoint(directory)


def test_config_json_is_the_model_config(saved):
  with open(os.path.join(saved[0], 'config.json')) as f:
    assert T5Config.from_dict(json.load(f)) == TINY


@pytest.mark.parametrize('every', [5000, 50])
def test_flipped_bytes_name_the_checkpoint_and_the_parameter(saved, tmp_path, capfd, every):
  # As the corruption: one byte in `every` flipped in the OCDBT data files (over 1 KB; the
  # small files are the index). Where the flips land decides how it shows: data that still
  # decompresses (zstd keeps incompressible floats as raw blocks) fails its checksum; a damaged
  # compressed chunk fails orbax's read (one in 50 always does). Both name the parameter. Flipping
  # only the largest file missed every compressed chunk in 1 save of 25: orbax sometimes splits
  # the arrays over two data files.
  directory = _copy(saved, tmp_path)
  data = os.path.join(directory, 'params', 'ocdbt.process_0', 'd')
  for path in (os.path.join(data, n) for n in os.listdir(data)):
    if os.path.getsize(path) > 1024:
      raw = bytearray(open(path, 'rb').read())
      for i in range(100, len(raw), every):
        raw[i] ^= 0xff
      open(path, 'wb').write(bytes(raw))
  with pytest.raises(UserError, match=f'{directory}: parameter [\\w/]+ is corrupt') as info:
    native.load_checkpoint(directory)
  assert '\n' not in str(info.value)
  if every == 50:
    assert 'its stored data cannot be read' in str(info.value)
  import gc  # pylint: disable=g-import-not-at-top
  gc.collect()
  assert 'never retrieved' not in capfd.readouterr().err  # orbax's orphaned reads stay quiet


def test_truncated_manifest_is_one_line(saved, tmp_path, capfd):
  directory = _copy(saved, tmp_path)
  path = os.path.join(directory, 'params', 'manifest.ocdbt')
  raw = open(path, 'rb').read()
  open(path, 'wb').write(raw[:len(raw) // 2])
  with pytest.raises(UserError,
                     match='params: corrupt orbax checkpoint .its OCDBT index: .*manifest.ocdbt'):
    native.load_checkpoint(directory)
  import gc  # pylint: disable=g-import-not-at-top
  gc.collect()  # orbax's leftover asyncio callbacks used to raise here ("Event loop is closed")
  assert 'Traceback' not in capfd.readouterr().err


def test_checkpoint_without_checksums_loads_with_a_note(saved, tmp_path, caplog):
  directory = _copy(saved, tmp_path)
  os.remove(os.path.join(directory, native.INTEGRITY_FILE))  # as written before checksums
  _, params, _ = native.load_checkpoint(directory)
  np.testing.assert_array_equal(np.asarray(params['token_embedder']['embedding']),
                                np.asarray(saved[1]['token_embedder']['embedding']))
  assert 'cannot be verified' in caplog.text


def test_hf_folder_suggests_import_hf(tmp_path):
  (tmp_path / 'config.json').write_text('{"d_model": 32}')
  (tmp_path / 'model.safetensors').write_bytes(b'')
  with pytest.raises(UserError, match=f'`gqa-spec import-hf {tmp_path} OUT_DIR`'):
    native.load_checkpoint(str(tmp_path))
