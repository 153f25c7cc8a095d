"""A model meeting a task whose vocabulary it cannot embed, and arguments checked before a run
directory exists (issue 26's cases 1 and 11): one-line errors, and nothing left on disk."""

import os

import jax
import jax.numpy as jnp
import pytest

from gqa_spec.checkpoints import native
from gqa_spec.data import tasks
from gqa_spec.errors import UserError
from gqa_spec.evaluation import evaluator, infer
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from gqa_spec.reproduce import pipeline
from gqa_spec.training import trainer
from gqa_spec.training.data import DatasetConfig

# The tiny corpus's vocabulary: 300 pieces + 100 extra ids = 400 ids, more than 384 embeddings.
SMALL = T5Config(vocab_size=384, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                 num_encoder_layers=1, num_decoder_layers=1)
LENGTHS = {'inputs': 32, 'targets': 16}
MISFIT = 'task ddtp_summarize has a vocabulary of 400 ids, but {} embeds only 384'


@pytest.fixture(scope='module')
def small_checkpoint(tiny_data_dir, tmp_path_factory):
  tasks.register_ddtp_tasks(tiny_data_dir)
  tokens = jnp.ones((1, 3), jnp.int32)
  params = jax.jit(lambda: Transformer(SMALL).init(jax.random.PRNGKey(0), tokens, tokens, tokens,
                                                   enable_dropout=False)['params'])()
  path = str(tmp_path_factory.mktemp('small') / 'ckpt')
  native.save_checkpoint(path, SMALL, params)
  yield path
  tasks.register_ddtp_tasks()  # back to the default data dir for other modules


def test_eval_and_infer_refuse_a_task_the_model_cannot_embed(small_checkpoint, tmp_path):
  out = tmp_path / 'eval'
  with pytest.raises(UserError, match=MISFIT.format('the model')):
    evaluator.evaluate_checkpoint(small_checkpoint, 'ddtp_summarize', str(out),
                                  task_feature_lengths=LENGTHS, num_examples=2, batch_size=2)
  with pytest.raises(UserError, match=MISFIT.format(small_checkpoint)):
    infer.infer(small_checkpoint, 'ddtp_summarize', str(out), task_feature_lengths=LENGTHS,
                num_examples=2, batch_size=2)
  assert not out.exists()  # no metrics.json with BLEU 0 and empty predictions


def test_train_checks_the_task_before_the_run_directory(small_checkpoint, tmp_path):
  model_dir = tmp_path / 'run'
  for name, match in [('ddtp_summarize', MISFIT.format('model_config')),
                      ('no_such_task', "unknown task 'no_such_task'")]:
    with pytest.raises(UserError, match=match):
      trainer.train(model_dir=str(model_dir), model_config=SMALL,
                    train_dataset_cfg=DatasetConfig(name, LENGTHS, batch_size=2),
                    total_steps=1, initial_checkpoint_path=small_checkpoint)
    assert not model_dir.exists()


@pytest.mark.parametrize('override,match', [
    ('pretrain_steps=-10', 'preset field pretrain_steps must be > 0, got -10'),
    ('vocab_pieces=8000', r'task ddtp \(8000 pieces \+ 100 extra ids\) has a vocabulary of 8100 '
                          'ids, '
                          "but the preset's target embeds only 512")])
def test_reproduce_checks_the_preset_before_writing(tmp_path, override, match):
  with pytest.raises(UserError, match=match):
    pipeline.run('smoke', str(tmp_path / 'out'), str(tmp_path / 'work'), overrides=[override])
  assert not (tmp_path / 'out').exists() and not (tmp_path / 'work').exists()


def test_train_draft_checks_the_task_before_the_run_directory(small_checkpoint, tmp_path):
  from gqa_spec.training import draft_training  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / 'draft'
  with pytest.raises(UserError, match=MISFIT.format(f'the target {small_checkpoint}')):
    draft_training.train_draft(kind='chimera', target_checkpoint=small_checkpoint,
                               model_dir=str(model_dir), total_steps=1,
                               train_dataset_cfg=DatasetConfig('ddtp_summarize', LENGTHS,
                                                               batch_size=2, pack=False))
  assert not model_dir.exists()  # no draft.json naming a draft never trained
