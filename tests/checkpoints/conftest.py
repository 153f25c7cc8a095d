"""Shared fixtures: a tiny randomly initialised HF T5.1.1 model saved to disk, and a batch."""

import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.models.t5 import Transformer

VOCAB = 96


@pytest.fixture(scope='session')
def hf_model():
  """A tiny untied gated-GELU HF T5 (T5.1.1 architecture), float32, eval mode."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  config = transformers.T5Config(
      vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3,
      num_heads=4, feed_forward_proj='gated-gelu', tie_word_embeddings=False, dropout_rate=0.0,
      relative_attention_num_buckets=32, relative_attention_max_distance=32,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  torch.manual_seed(0)
  model = transformers.T5ForConditionalGeneration(config)
  # transformers 5 ties lm_head to shared in a fresh model; T5.1.1 has its own.
  model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 32))
  return model.eval()


@pytest.fixture(scope='session')
def hf_dir(hf_model, tmp_path_factory):
  """`hf_model` saved with `save_pretrained` (config.json + model.safetensors)."""
  path = tmp_path_factory.mktemp('hf') / 'model'
  hf_model.save_pretrained(path)
  return str(path)


@pytest.fixture(scope='session')
def batch():
  """`(enc [3, 40], dec [3, 12])` int32: encoder rows padded at different lengths, longer than the
  relative-position clip distance (32); decoder inputs start with the start token 0."""
  rng = np.random.default_rng(0)
  enc = rng.integers(2, VOCAB, (3, 40))
  enc[1, 29:] = 0
  enc[2, 6:] = 0
  dec = rng.integers(2, VOCAB, (3, 12))
  dec[:, 0] = 0
  return enc.astype(np.int32), dec.astype(np.int32)


def hf_logits(model, enc, dec):
  """HF logits `[b, k, V]` as numpy."""
  import torch  # pylint: disable=g-import-not-at-top; fixtures above skip without torch
  with torch.no_grad():
    out = model(input_ids=torch.as_tensor(enc, dtype=torch.long),
                attention_mask=torch.as_tensor(enc > 0, dtype=torch.long),
                decoder_input_ids=torch.as_tensor(dec, dtype=torch.long))
  return out.logits.numpy()


def our_logits(config, params, enc, dec):
  """Our teacher-forced logits `[b, k, V]` as numpy."""
  out = Transformer(config).apply({'params': params}, jnp.asarray(enc), jnp.asarray(dec),
                                  jnp.ones_like(jnp.asarray(dec)), enable_dropout=False)
  return np.asarray(out)


@pytest.fixture(scope='session')
def logits_fns():
  """`(hf_logits, our_logits)`, the two models' logits on the same batch."""
  return hf_logits, our_logits
