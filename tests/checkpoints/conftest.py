"""Shared fixtures: a tiny random HF T5.1.1 model on disk, a batch, both models' logits, fresh
parameters of a config, and a writer of T5X legacy checkpoints in t5x's own layout."""

import os

from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

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
  apply = jax.jit(lambda p, e, d: Transformer(config).apply({'params': p}, e, d, jnp.ones_like(d),
                                                           enable_dropout=False))
  return np.asarray(apply(params, jnp.asarray(enc), jnp.asarray(dec)))


@pytest.fixture(scope='session')
def logits_fns():
  """`(hf_logits, our_logits)`, the two models' logits on the same batch."""
  return hf_logits, our_logits


@pytest.fixture(scope='session')
def init_params():
  """`init_params(config)`: freshly initialised parameters of `config` as numpy arrays (seed 0)."""
  def init(config):
    tokens = jnp.ones((1, 3), jnp.int32)
    params = jax.jit(lambda: Transformer(config).init(  # one compilation, not one per op
        jax.random.PRNGKey(0), tokens, tokens, tokens, enable_dropout=False)['params'])()
    return jax.tree.map(np.asarray, params)
  return init


def _flatten(tree, prefix=()):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _flatten(value, prefix + (key,))
    else:
      yield prefix + (key,), value


def _unflatten(flat):
  tree = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def _write_t5x_checkpoint(model_dir, step, params, dtype=np.float32, inline=('scale',)):
  """Writes `params` as t5x's `Checkpointer.save` does (format version 3).

  Parameters whose last name is in `inline` go into the msgpack file itself (as t5x does for
  unpartitioned arrays); all others into gzip zarr TensorStores named `target.<path with dots>`,
  referenced from the msgpack by their spec's JSON with a relative path. An Adafactor-like
  `state` (step + factored second moments, also in TensorStores) rides along.
  """
  ckpt_dir = os.path.join(model_dir, f'checkpoint_{step}')
  os.makedirs(ckpt_dir)

  def written(name, value):
    value = np.asarray(value).astype(dtype)
    if name.split('/')[-1] in inline:
      return value
    spec = {'driver': 'zarr', 'dtype': jnp.dtype(dtype).name,
            'kvstore': {'driver': 'file', 'path': name.replace('/', '.')},
            'metadata': {'compressor': {'id': 'gzip'}, 'shape': list(value.shape),
                         'chunks': list(value.shape)}}
    absolute = dict(spec, kvstore={'driver': 'file',
                                   'path': os.path.join(ckpt_dir, name.replace('/', '.'))})
    ts.open(absolute, create=True, open=True).result().write(value).result()
    return ts.Spec(spec).to_json()  # what flax serialises for a ts.Spec (orbax registration)

  target = {path: written('/'.join(('target',) + path), v) for path, v in _flatten(params)}
  param_states = {}
  for path, value in _flatten(params):
    name = '/'.join(('state', 'param_states') + path)
    param_states[path + ('v_row',)] = written(name + '/v_row', np.ones(value.shape[:1]))
    param_states[path + ('v_col',)] = np.zeros((0,), np.float32)
  optimizer = {'target': _unflatten(target),
               'state': {'step': np.asarray(step, np.int32),
                         'param_states': _unflatten(param_states)}}
  with open(os.path.join(ckpt_dir, 'checkpoint'), 'wb') as f:
    f.write(serialization.msgpack_serialize({'version': 3, 'optimizer': optimizer}))
  return ckpt_dir



@pytest.fixture(scope='session')
def t5x_writer():
  """`t5x_writer(model_dir, step, params, dtype=np.float32)` writes a T5X legacy checkpoint."""
  return _write_t5x_checkpoint
