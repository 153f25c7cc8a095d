"""`eval` / `infer` feature lengths one device cannot take (issue 34): refused in one line before
anything compiles, naming the length, the limit and the memory; nothing is written."""

import jax
import jax.numpy as jnp
import pytest

from gqa_spec.checkpoints import native
from gqa_spec.data import tasks
from gqa_spec.decoding import memory
from gqa_spec.errors import UserError
from gqa_spec.evaluation import evaluator, infer
from gqa_spec.models.config import T5Config

CONFIG = T5Config(vocab_size=512, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                  num_encoder_layers=1, num_decoder_layers=1)
LENGTHS = {'inputs': 64, 'targets': 8}


@pytest.fixture(scope='module')
def checkpoint(tiny_data_dir, tmp_path_factory):
  tasks.register_ddtp_tasks(tiny_data_dir)
  params = jax.tree.map(lambda x: jnp.full(x.shape, 0.5, x.dtype),  # no init to compile
                        native.abstract_params(CONFIG))
  path = str(tmp_path_factory.mktemp('lengths') / 'ckpt')
  native.save_checkpoint(path, CONFIG, params)
  yield path
  tasks.register_ddtp_tasks()  # back to the default data dir for other modules


def test_eval_and_infer_refuse_inputs_longer_than_the_device_takes(checkpoint, tmp_path,
                                                                   monkeypatch):
  estimate = memory.estimator(CONFIG, batch=2, cache_length=LENGTHS['targets'] + 1)
  monkeypatch.setattr(memory, 'device_bytes', lambda: estimate(24))  # 24 tokens fit, not 64
  message = (f'^task_feature_lengths inputs=64: more than the 24 tokens one device can take at '
             rf'batch_size 2 \(about {estimate(64) / 2**30:.3g} GiB of '
             rf'{estimate(24) / 2**30:.3g} GiB\); lower it or batch_size$')
  out = tmp_path / 'out'
  with pytest.raises(UserError, match=message):
    evaluator.evaluate_checkpoint(checkpoint, 'ddtp_summarize', str(out),
                                  task_feature_lengths=LENGTHS, num_examples=2, batch_size=2)
  with pytest.raises(UserError, match=message):
    infer.infer(checkpoint, 'ddtp_summarize', str(out), task_feature_lengths=LENGTHS,
                num_examples=2, batch_size=2)
  assert not out.exists()
