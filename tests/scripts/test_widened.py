"""benchmarks/widened.py: the widened target computes what its source computes, and the CLI writes
the target and the noisy drafts it names."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import widened, workloads
from gqa_spec.checkpoints import native
from gqa_spec.decoding import autoregressive
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models.config import preset
from gqa_spec.models.t5 import Transformer

L = 12


@pytest.fixture(scope='module')
def nano():
  config = preset('nano').replace(vocab_size=256)
  model = Transformer(config)
  inputs = jnp.asarray(workloads.synthetic_inputs(3, 16, 256, seed=0))  # [3, 16]
  return model, workloads.random_params(model, seed=3), inputs


def _greedy(model, params, inputs):
  dec = T5Decoder(model)
  r = autoregressive.decode(dec, dec.init(params, inputs, L + 1), jax.random.PRNGKey(0),
                            max_decode_len=L)
  return np.asarray(r.sequences), np.asarray(r.lengths)


@pytest.mark.parametrize('scan', [False, True])
def test_the_widened_model_computes_what_its_source_computes(nano, scan):
  model, params, inputs = nano
  if scan:
    model = Transformer(model.config.replace(scan_layers=True))
    params = workloads.random_params(model, seed=3)
  f = model.config.mlp_dim
  wide, config = widened.widen_mlp(params, model.config, 8 * f)
  assert config.mlp_dim == 8 * f and config.replace(mlp_dim=f) == model.config
  flat, flat_wide = native._flat(params), native._flat(wide)  # pylint: disable=protected-access
  grown = [k for k in flat if flat[k].shape != flat_wide[k].shape]
  assert grown and all('/mlp/' in k for k in grown)
  assert all((flat_wide[k] == 0).sum() >= 7 * flat[k].size for k in grown)  # new units 0
  targets = jnp.asarray(np.random.RandomState(0).randint(2, 256, size=(3, L)), jnp.int32)
  batch = {'encoder_input_tokens': inputs, 'decoder_input_tokens': targets,
           'decoder_target_tokens': targets}
  logits = model.apply({'params': params}, **batch, enable_dropout=False)
  wide_logits = Transformer(config).apply({'params': wide}, **batch, enable_dropout=False)
  np.testing.assert_allclose(wide_logits, logits, atol=1e-5, rtol=1e-5)
  seqs, lengths = _greedy(model, params, inputs)
  wide_seqs, wide_lengths = _greedy(Transformer(config), wide, inputs)
  np.testing.assert_array_equal(wide_lengths, lengths)
  np.testing.assert_array_equal(wide_seqs, seqs)
  with pytest.raises(SystemExit, match='narrower'):
    widened.widen_mlp(params, model.config, f - 1)


def test_the_cli_writes_the_target_and_the_noisy_drafts(nano, tmp_path):
  model, params, inputs = nano
  source, out = str(tmp_path / 'source'), str(tmp_path / 'pair')
  native.save_checkpoint(source, model.config, params)
  widened.main([source, out, '--mlp-dim', str(4 * model.config.mlp_dim),
                '--draft-noise', '0,0.3'])
  assert sorted(os.listdir(out)) == ['noise_0', 'noise_0.3', 'target']
  config, wide, _ = native.load_checkpoint(os.path.join(out, 'target'))
  assert config.mlp_dim == 4 * model.config.mlp_dim
  np.testing.assert_array_equal(_greedy(Transformer(config), wide, inputs)[0],
                                _greedy(model, params, inputs)[0])
  same = native.load_checkpoint(os.path.join(out, 'noise_0'))[1]
  noisy = native.load_checkpoint(os.path.join(out, 'noise_0.3'))[1]
  for a, b, n in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(same),
                     jax.tree_util.tree_leaves(noisy)):
    np.testing.assert_array_equal(b, a)
    spread = np.std(np.asarray(n) - np.asarray(a)) / max(float(np.std(a)), 1e-12)
    assert np.std(a) == 0 or 0.2 < spread < 0.4  # 0.3 x the array's std
  with pytest.raises(SystemExit, match='already exists'):
    widened.main([source, out, '--mlp-dim', '8'])
