"""HF transformers T5.1.1 parity: import, export round trip, greedy decoding, GQA export."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.checkpoints import hf
from gqa_spec.convert import convert_params
from gqa_spec.errors import UserError
from gqa_spec.models import decode_cache as dc
from gqa_spec.models.attention import relative_position_bucket
from gqa_spec.models.t5 import Transformer

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')


def _greedy(config, params, enc, max_len):
  """Greedy decoding with the decode cache, one token per call; rows stop at EOS (1)."""
  model = Transformer(config)
  enc = jnp.asarray(enc)
  encoded = model.apply({'params': params}, enc, method=Transformer.encode)
  cache = dc.init_decode_cache(model, params, encoded, enc, max_len)
  step = jax.jit(lambda c, t: dc.decode_tokens(model, params, c, t))
  token = jnp.zeros((enc.shape[0], 1), jnp.int32)  # decoder start token
  out = []
  for _ in range(max_len):
    logits, cache = step(cache, token)  # [b, 1, V]
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [b, 1]
    out.append(np.asarray(token[:, 0]))
  return [_until_eos(row) for row in np.stack(out, axis=1)]


def _until_eos(tokens):
  tokens = [int(t) for t in tokens]
  return tokens[:tokens.index(1)] if 1 in tokens else tokens


def test_relative_position_buckets_match_hf():
  from transformers.models.t5.modeling_t5 import T5Attention  # pylint: disable=g-import-not-at-top
  relative = np.arange(-400, 401)  # every exact/log boundary and the clip at max_distance
  for bidirectional in (True, False):
    for buckets, max_distance in ((32, 128), (32, 32), (64, 256)):
      theirs = T5Attention._relative_position_bucket(  # pylint: disable=protected-access
          torch.tensor(relative), bidirectional=bidirectional, num_buckets=buckets,
          max_distance=max_distance).numpy()
      ours = relative_position_bucket(jnp.asarray(relative, jnp.int32), bidirectional, buckets,
                                      max_distance)
      np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_import_config_and_logits_match(hf_model, hf_dir, batch, logits_fns):
  config, params, vocab = hf.load_hf(hf_dir)
  assert vocab is None
  assert (config.emb_dim, config.num_heads, config.num_kv_heads, config.head_dim) == (32, 4, 4, 8)
  assert (config.num_encoder_layers, config.num_decoder_layers) == (2, 3)
  assert config.mlp_activations == ('gelu', 'linear') and not config.logits_via_embedding
  assert config.relative_attention_max_distance == 32
  hf_logits, our_logits = logits_fns
  enc, dec = batch
  np.testing.assert_allclose(our_logits(config, params, *batch), hf_logits(hf_model, enc, dec),
                             atol=1e-4, rtol=0)


def test_export_round_trip_is_identical(hf_model, hf_dir, tmp_path):
  config, params, _ = hf.load_hf(hf_dir)
  out = tmp_path / 'export'
  hf.save_hf(str(out), config, params)
  reloaded = transformers.T5ForConditionalGeneration.from_pretrained(out).state_dict()
  original = hf_model.state_dict()
  assert set(reloaded) == set(original)
  for name, value in original.items():
    assert torch.equal(reloaded[name], value), name
  with pytest.raises(UserError, match='already exists'):
    hf.save_hf(str(out), config, params)


def test_greedy_matches_hf_generate(hf_model, hf_dir, batch):
  config, params, _ = hf.load_hf(hf_dir)
  enc, _ = batch
  max_len = 10
  ours = _greedy(config, params, enc, max_len)
  with torch.no_grad():
    theirs = hf_model.generate(
        input_ids=torch.as_tensor(enc, dtype=torch.long),
        attention_mask=torch.as_tensor(enc > 0, dtype=torch.long), max_new_tokens=max_len,
        do_sample=False, num_beams=1, decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
        use_cache=False)  # transformers 5.23's cache assumes as many decoder as encoder layers
  assert ours == [_until_eos(row[1:]) for row in theirs.numpy()]  # row[0] is the start token


@pytest.mark.parametrize('kv_heads', [2, 1])
def test_gqa_export_reproduces_gqa_logits(hf_dir, batch, logits_fns, tmp_path, kv_heads):
  config, params, _ = hf.load_hf(hf_dir)
  params, config = convert_params(params, config, kv_heads, 'mean')
  out = tmp_path / 'gqa_hf'
  hf.save_hf(str(out), config, params)
  model = transformers.T5ForConditionalGeneration.from_pretrained(out).eval()
  hf_logits, our_logits = logits_fns
  enc, dec = batch
  np.testing.assert_allclose(hf_logits(model, enc, dec), our_logits(config, params, enc, dec),
                             atol=1e-4, rtol=0)


def test_pytorch_model_bin_import(hf_model, hf_dir, tmp_path):
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  # transformers 5 writes only safetensors; a .bin is a torch.save'd state dict (aliases included).
  torch.save(hf_model.state_dict(), bin_dir / 'pytorch_model.bin')
  (bin_dir / 'config.json').write_text(open(os.path.join(hf_dir, 'config.json')).read())
  (bin_dir / 'spiece.model').write_bytes(b'not really a sentencepiece model')
  config, params, vocab = hf.load_hf(str(bin_dir))
  ref_config, ref_params, _ = hf.load_hf(hf_dir)
  assert config == ref_config
  assert vocab == str(bin_dir / 'spiece.model')
  jax.tree.map(np.testing.assert_array_equal, params, ref_params)


def test_sharded_safetensors_import(hf_dir, tmp_path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  state = load_file(os.path.join(hf_dir, 'model.safetensors'))
  names = sorted(state)
  shards = {'model-00001-of-00002.safetensors': names[::2],
            'model-00002-of-00002.safetensors': names[1::2]}
  for file, keys in shards.items():
    save_file({k: state[k] for k in keys}, str(tmp_path / file))
  index = {'weight_map': {k: file for file, keys in shards.items() for k in keys}}
  (tmp_path / 'model.safetensors.index.json').write_text(json.dumps(index))
  (tmp_path / 'config.json').write_text(json.dumps(_hf_config(hf_dir)))
  _, params, _ = hf.load_hf(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, params, hf.load_hf(hf_dir)[1])


def test_bfloat16_import(hf_dir):
  config, params, _ = hf.load_hf(hf_dir, param_dtype='bfloat16')
  assert config.param_dtype == 'bfloat16'
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


def _hf_config(hf_dir):
  with open(os.path.join(hf_dir, 'config.json')) as f:
    return json.load(f)


def test_config_mapping_variants(hf_dir):
  base = _hf_config(hf_dir)
  relu = hf.config_from_hf({**base, 'feed_forward_proj': 'relu'})
  assert relu.mlp_activations == ('relu',)
  assert hf.config_to_hf(relu)['feed_forward_proj'] == 'relu'
  assert hf.config_from_hf({**base, 'feed_forward_proj': 'gated-silu'}).mlp_activations == (
      'silu', 'linear')
  # Original T5: tied and scaled logits, no separate lm_head.
  tied = hf.config_from_hf({**base, 'scale_decoder_outputs': True}, has_lm_head=False)
  assert tied.logits_via_embedding and hf.config_to_hf(tied)['tie_word_embeddings']
  with pytest.raises(UserError, match='feed_forward_proj'):
    hf.config_from_hf({**base, 'feed_forward_proj': 'gated-tanh'})
  with pytest.raises(UserError, match='lm_head'):
    hf.config_from_hf({**base, 'scale_decoder_outputs': True}, has_lm_head=True)
  with pytest.raises(UserError, match="lacks 'd_model'"):
    hf.config_from_hf({k: v for k, v in base.items() if k != 'd_model'})
  with pytest.raises(UserError, match='no HF T5 equivalent'):
    hf.config_to_hf(relu.replace(mlp_activations=('gelu_exact', 'linear')))


@pytest.mark.parametrize('scaled', [False, True])
def test_tied_models_import_as_the_same_function(hf_dir, batch, logits_fns, tmp_path, scaled):
  """Fresh transformers-5 models tie lm_head to shared: unscaled (a T5.1.1 config) it becomes a
  copy in logits_dense; scaled by d**-0.5 (original T5) it is `logits_via_embedding`."""
  keys = ('vocab_size', 'd_model', 'd_kv', 'd_ff', 'num_layers', 'num_decoder_layers', 'num_heads',
          'feed_forward_proj', 'dropout_rate', 'relative_attention_max_distance')
  hf_config = transformers.T5Config(**{k: _hf_config(hf_dir)[k] for k in keys},
                                    tie_word_embeddings=scaled)
  torch.manual_seed(1)
  model = transformers.T5ForConditionalGeneration(hf_config).eval()
  model.save_pretrained(tmp_path / 'tied')
  config, params, _ = hf.load_hf(str(tmp_path / 'tied'))
  assert config.logits_via_embedding == scaled
  hf_logits, our_logits = logits_fns
  np.testing.assert_allclose(our_logits(config, params, *batch), hf_logits(model, *batch),
                             atol=1e-4, rtol=0)


def test_bad_directories(tmp_path, hf_dir):
  with pytest.raises(UserError, match='not found'):
    hf.load_hf(str(tmp_path / 'missing'))
  with pytest.raises(UserError, match='config.json: missing'):
    hf.load_hf(str(tmp_path))
  (tmp_path / 'config.json').write_text(json.dumps(_hf_config(hf_dir)))
  with pytest.raises(UserError, match='no model.safetensors or pytorch_model.bin'):
    hf.load_hf(str(tmp_path))
  (tmp_path / 'model.safetensors').write_bytes(b'garbage')
  with pytest.raises(UserError, match='unreadable weights'):
    hf.load_hf(str(tmp_path))
  (tmp_path / 'config.json').write_text('{not json')
  with pytest.raises(UserError, match='unreadable JSON'):
    hf.load_hf(str(tmp_path))
