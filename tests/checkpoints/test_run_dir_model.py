"""A training run directory is a model (issue 34): `generate`, `eval`, `infer`, `convert`,
`export-hf` and `--draft` take its `best/` when there is one, else its latest complete checkpoint,
and `RUN/checkpoints/N` for step N; each says in one line which one it took."""

import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec import cli
from gqa_spec.checkpoints import load, manager, native
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config

CONFIG = T5Config(vocab_size=32, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                  num_encoder_layers=1, num_decoder_layers=1)
KERNEL = lambda params: np.asarray(params['decoder']['logits_dense']['kernel'])


@pytest.fixture
def run_dir(tmp_path):
  """A run directory with train-state checkpoints at steps 2 and 4 (parameters + 2 and + 4)."""
  params = jax.tree.map(lambda x: jnp.full(x.shape, 0.5, x.dtype),  # no init to compile
                        native.abstract_params(CONFIG))
  run = str(tmp_path / 'run')
  ckpt = manager.Checkpointer(run, save_period=1, keep=None, asynchronous=False)
  for step in (2, 4):
    state = {'params': jax.tree.map(lambda x, s=step: x + s, params), 'step': jnp.asarray(step)}
    ckpt.save(step, state, {'model_config': CONFIG.to_dict(), 'data_start_step': 0})
  ckpt.close()
  return run, params


def test_latest_step_then_a_given_step_then_best(run_dir, tmp_path, capsys, caplog):
  run, params = run_dir
  config, loaded, vocab = load.load_model(run)
  assert config == CONFIG and vocab is None
  np.testing.assert_allclose(KERNEL(loaded), KERNEL(params) + 4)
  assert capsys.readouterr().err == (f'gqa-spec: {run}: a training run directory without best/; '
                                     'took its latest complete checkpoint, checkpoints/4\n')
  _, loaded, _ = load.load_model(os.path.join(run, 'checkpoints', '2'))  # what --model reads
  np.testing.assert_allclose(KERNEL(loaded), KERNEL(params) + 2)
  assert capsys.readouterr().err == (f'gqa-spec: {run}/checkpoints/2: took step 2 of the training '
                                     f'run {run}\n')
  inputs = tmp_path / 'in.jsonl'
  inputs.write_text('{"input_ids": [5, 6]}\n')
  assert cli.main(['generate', '--model', os.path.join(run, 'checkpoints', '3'), '--inputs',
                   str(inputs), '--out', str(tmp_path / 'out.jsonl')]) == 2
  assert capsys.readouterr().err == ('gqa-spec: error: model checkpoint directory not found: '
                                     f'{run}/checkpoints/3\n')
  os.makedirs(os.path.join(run, 'checkpoints', '3'))  # a directory orbax never committed
  with pytest.raises(UserError, match=r'checkpoints/3: not a complete checkpoint \(its state/ '
                                      r'and meta/ are missing\)$'):
    load.load_model(os.path.join(run, 'checkpoints', '3'))
  os.rmdir(os.path.join(run, 'checkpoints', '3'))
  # With best/ (as an evaluating trainer writes it), best/ is the model.
  native.save_checkpoint(os.path.join(run, 'best'), CONFIG, jax.tree.map(lambda x: x - 1, params))
  with open(os.path.join(run, 'best.json'), 'w') as f:
    json.dump({'step': 2, 'metric': 'bleu', 'value': 3.5}, f)
  out = str(tmp_path / 'gqa')
  assert cli.main(['convert', run, out, '--kv-heads', '1', '--method', 'mean']) == 0
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f'gqa-spec: {run}: a training run directory; took its best/ (bleu = 3.5 at '
                 'step 2)']
  assert native.load_config(out).num_kv_heads == 1
  # eval / infer (`load_any(model=True)`) take the same, and log it; an initial checkpoint (no
  # `model`) is still the run's latest step (uptraining continues its step count).
  with caplog.at_level(logging.INFO, 'gqa_spec.checkpoints.load'):
    _, loaded, step = load.load_any(run, model=True)
  np.testing.assert_allclose(KERNEL(loaded), KERNEL(params) - 1)
  assert [r.getMessage() for r in caplog.records
          if r.name == 'gqa_spec.checkpoints.load'] == [err[0][len('gqa-spec: '):]]
  _, loaded, step = load.load_any(run)
  assert step == 4
  np.testing.assert_allclose(KERNEL(loaded), KERNEL(params) + 4)


def test_a_run_directory_without_a_complete_checkpoint_is_one_line(tmp_path):
  os.makedirs(tmp_path / 'checkpoints' / '5.orbax-checkpoint-tmp-1')
  with pytest.raises(UserError, match=f'^{tmp_path}: a training run directory with no complete '
                                      'checkpoint yet$'):
    load.load_model(str(tmp_path))
