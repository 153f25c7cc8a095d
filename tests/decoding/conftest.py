"""Tiny random-init T5 models shared by the decoding tests (module-level caches keep compiles few)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

VOCAB = 32
MAX_LEN = 10

# A ragged batch of 4: different input lengths (0 = padding, 1 = EOS).
INPUTS = np.array([[5, 6, 7, 8, 9, 10, 1, 0],
                   [3, 4, 5, 1, 0, 0, 0, 0],
                   [9, 9, 8, 7, 6, 5, 4, 1],
                   [12, 1, 0, 0, 0, 0, 0, 0]], np.int32)


def tiny_config(num_kv_heads, **overrides):
  base = dict(vocab_size=VOCAB, emb_dim=32, num_heads=4, num_kv_heads=num_kv_heads, head_dim=8,
              mlp_dim=64, num_encoder_layers=1, num_decoder_layers=2)
  base.update(overrides)
  return T5Config(**base)


@functools.partial(jax.jit, static_argnames=('model',))
def _init(model, rng):
  tokens = jnp.asarray(INPUTS)
  return model.init(rng, tokens, tokens[:, :3], tokens[:, :3], enable_dropout=False)['params']


@functools.lru_cache(maxsize=None)
def model_and_params(num_kv_heads, seed=0, **overrides):
  model = Transformer(tiny_config(num_kv_heads, **overrides))
  params = _init(model, jax.random.PRNGKey(seed))
  # Sharpen the output distribution (random init is near uniform) so greedy paths are stable and
  # agreement between perturbed copies is partial rather than accidental.
  params = jax.tree_util.tree_map(lambda x: x, params)
  params['decoder']['logits_dense']['kernel'] = params['decoder']['logits_dense']['kernel'] * 4.0
  return model, params


def perturbed(params, scale, seed=1):
  leaves, treedef = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return jax.tree_util.tree_unflatten(treedef, noisy)


class FakeClock:
  """Each reading one second after the one before: every timed run reads as exactly 1 s, so the
  calibration's times are functions of its programs' iteration counts, not of this machine."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    self.now += 1.0
    return self.now
