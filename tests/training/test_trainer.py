"""The training loop on synthetic batches: non-finite stop, best-checkpoint selection, uptraining."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.checkpoints import native
from gqa_spec.models.config import T5Config
from gqa_spec.training import commands, data, optimizer, trainer, uptrain
from gqa_spec.checkpoints.load import load_any

TINY = T5Config(vocab_size=256, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                num_encoder_layers=1, num_decoder_layers=1)
DATA = data.DatasetConfig('synthetic', {'inputs': 16, 'targets': 8}, batch_size=4)


def _train(model_dir, total_steps, model_config=TINY, **kwargs):
  kwargs.setdefault('learning_rate_fn', optimizer.rsqrt_decay(warmup_steps=10))
  kwargs.setdefault('log_period', 100)
  return trainer.train(model_dir=str(model_dir), model_config=model_config, train_dataset_cfg=DATA,
                       total_steps=total_steps,
                       optimizer=optimizer.adafactor(min_dim_size_to_factor=16),
                       checkpoint_cfg=trainer.CheckpointConfig(save_period=5, keep=2,
                                                               asynchronous=False),
                       progress_bar=False, **kwargs)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  # The learning rate turns NaN at step 7, so the parameters are NaN from step 8 on and the first
  # non-finite loss is the one computed at step 8 (reported as the 9th completed step).
  poison = lambda step: jnp.where(step >= 7, jnp.nan, 0.01)
  with pytest.raises(trainer.NonFiniteLossError, match=r'at step 9\b.*last good checkpoint is '
                     r'step 5') as info:
    _train(tmp_path, 20, learning_rate_fn=poison)
  assert '\n' not in str(info.value)
  steps = sorted(int(d) for d in os.listdir(tmp_path / 'checkpoints') if d.isdigit())
  assert steps == [5]  # step 10 was never saved: its state was non-finite


def test_evaluation_selects_and_exports_best_checkpoint(tmp_path):
  scores = {5: 1.0, 10: 3.0, 15: 2.0}
  calls = []

  def evaluator(params, step):
    calls.append(step)
    assert 'decoder' in params
    return {'bleu': scores[step]}

  result = _train(tmp_path, 15, evaluator=evaluator, eval_period=5, best_metric='bleu')
  assert calls == [5, 10, 15]
  assert result.best['step'] == 10 and result.best['value'] == 3.0
  with open(tmp_path / 'best.json') as f:
    assert json.load(f)['step'] == 10
  config, params, _ = native.load_checkpoint(str(tmp_path / 'best'))
  assert config == TINY and params['decoder']['logits_dense']['kernel'].shape == (32, 256)
  records = [json.loads(l) for l in open(tmp_path / 'train_log.jsonl')]
  assert [r['step'] for r in records if r['split'] == 'eval'] == [5, 10, 15]
  assert os.listdir(tmp_path / 'train') and os.listdir(tmp_path / 'eval')  # TensorBoard events


def test_uptrain_converts_and_continues_the_schedule(tmp_path, capsys):
  _train(tmp_path / 'mha', 20)
  again = _train(tmp_path / 'mha', 20)  # a finished run, run again: one clear line, no step
  assert again.step == 20 and not again.train_metrics
  commands._print_result(again)
  assert capsys.readouterr().out == ('step 20: the run is already at its last step; nothing to '
                                     'train (raise TRAIN_STEPS to train on)\n')
  result = uptrain.uptrain(model_dir=str(tmp_path / 'gqa'), model_config=TINY.replace(num_kv_heads=2),
                           initial_checkpoint_path=str(tmp_path / 'mha'), alpha=0.25,
                           train_fn=lambda **kw: _train(**kw, log_period=1))
  assert result.step == 25  # from the MHA run's step 20, for ceil(0.25 * 20) steps
  record = json.load(open(tmp_path / 'gqa' / 'converted' / 'uptrain.json'))
  assert record['original_train_steps'] == 20 and record['num_kv_heads'] == 2
  logs = [json.loads(l) for l in open(tmp_path / 'gqa' / 'train_log.jsonl')]
  assert logs[0]['step'] == 21
  np.testing.assert_allclose(logs[0]['learning_rate'], 20 ** -0.5, rtol=1e-6)  # not re-warmed
  config, params, step = load_any(str(tmp_path / 'gqa'))
  assert step == 25 and config.num_kv_heads == 2
  assert params['decoder']['layers_0']['self_attention']['key']['kernel'].shape == (32, 16)


def test_train_steps_with_equal_settings_share_one_compiled_step():
  """`TrainStep`s of equal config, optimizer arguments and schedule values share their jitted
  step (the reproduction's many jobs trace it once); another learning rate is another step."""
  import jax  # pylint: disable=g-import-not-at-top
  from gqa_spec.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.train_step import TrainStep  # pylint: disable=g-import-not-at-top
  part = Partitioner.create(TINY)
  make = lambda lr: TrainStep(TINY, optimizer.adafactor(min_dim_size_to_factor=16),
                              optimizer.constant(lr), part)
  a, b, c = make(0.1), make(0.1), make(0.2)
  assert optimizer.constant(0.1) == optimizer.constant(0.1) != optimizer.constant(0.2)
  assert optimizer.rsqrt_decay(2.0, 10) == optimizer.rsqrt_decay(2.0, 10)
  batch = part.shard_batch(next(data.get_batches(DATA)))
  params = [s(s.init(jax.random.PRNGKey(0)), batch)[0].params for s in (a, b, c)]
  assert a._jitted is b._jitted and a._jitted is not c._jitted  # pylint: disable=protected-access
  jax.tree.map(np.testing.assert_array_equal, params[0], params[1])
  assert not np.array_equal(params[0]['decoder']['logits_dense']['kernel'],
                            params[2]['decoder']['logits_dense']['kernel'])
