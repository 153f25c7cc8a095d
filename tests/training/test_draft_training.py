"""Drafts trained against a frozen target: the target stays bit-identical, losses fall, resume is exact."""

import argparse
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec import rundir
from gqa_spec.checkpoints import drafts as draft_records
from gqa_spec.checkpoints import native
from gqa_spec.errors import UserError
from gqa_spec.models import chimera
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from gqa_spec.training import draft_commands, draft_training, optimizer, trainer
from gqa_spec.checkpoints.load import load_any
from gqa_spec.training.data import DatasetConfig, get_batches
from gqa_spec.training.train_step import init_params

# The synthetic pipeline draws tokens below 256.
TARGET = T5Config(vocab_size=256, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                  num_encoder_layers=1, num_decoder_layers=1)
DATA = DatasetConfig('synthetic', {'inputs': 12, 'targets': 8}, batch_size=4, pack=False)


@pytest.fixture(scope='module')
def target_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('target') / 'ckpt')
  params = init_params(TARGET, jax.random.PRNGKey(3))
  params['decoder']['logits_dense']['kernel'] = params['decoder']['logits_dense']['kernel'] * 4.0
  native.save_checkpoint(path, TARGET, params)
  return path


def _batch(i=0):
  batches = get_batches(DATA, skip_batches=i)
  return next(batches)


@pytest.mark.parametrize('kind', ['chimera', 'model'])
def test_target_is_bit_identical_and_the_draft_learns(target_dir, kind):
  _, target_params, _ = load_any(target_dir)
  before = jax.tree_util.tree_map(np.array, target_params)
  draft_config = (chimera.ChimeraConfig.for_target(TARGET, num_draft_heads=3) if kind == 'chimera'
                  else TARGET.replace(emb_dim=16, num_heads=2, num_kv_heads=2, mlp_dim=32))
  step = draft_training.DraftTrainStep.create(
      kind, draft_config, TARGET, target_params, draft_training.adam(), optimizer.constant(3e-3),
      kl_weight=0.5 if kind == 'model' else 0.0)
  state = step.init(jax.random.PRNGKey(0))
  start = jax.tree_util.tree_map(np.array, state.params)
  batch = step.partitioner.shard_batch(_batch())
  losses = []
  for _ in range(6):  # one batch, repeatedly: the draft must fit the target's labels better
    state, metrics = step(state, batch)
    losses.append(float(metrics['loss_sum']) / float(metrics['weight_sum']))
  assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
  jax.tree_util.tree_map(np.testing.assert_array_equal, step.target_params, before)
  jax.tree_util.tree_map(np.testing.assert_array_equal, target_params, before)
  changed = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      lambda a, b: bool(np.any(np.asarray(a) != b)), state.params, start))
  assert all(changed) if kind == 'model' else any(changed)


def test_greedy_labels_are_the_targets_own_decoding(target_dir):
  from gqa_spec.decoding import autoregressive  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.targets import T5Decoder  # pylint: disable=g-import-not-at-top
  _, params, _ = load_any(target_dir)
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  labels = draft_training.target_labels(Transformer(TARGET), params, batch, 'target')
  decoder = T5Decoder(Transformer(TARGET))
  result = autoregressive.decode(decoder, decoder.init(params, batch['encoder_input_tokens'], 8),
                                 jax.random.PRNGKey(0), max_decode_len=8)
  np.testing.assert_array_equal(labels, result.sequences[:, 1:])
  # Each greedy label is the argmax of the teacher-forced target at its position.
  _, logits, _ = draft_training.target_forward(Transformer(TARGET), params,
                                               batch['encoder_input_tokens'], labels)
  real = labels > 0
  np.testing.assert_array_equal(np.argmax(logits, -1)[real], np.asarray(labels)[real])


def test_chimera_trained_on_data_labels_fits_the_datasets_tokens(target_dir):
  """The Chimera paper's Eq. 4: heads and the MSE term on the dataset's target tokens."""
  _, params, _ = load_any(target_dir)
  config = chimera.ChimeraConfig.for_target(TARGET, num_draft_heads=2)
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  data = batch['decoder_target_tokens']  # [b, L]
  draft = chimera.init_params(config, TARGET, params, jax.random.PRNGKey(0))
  draft['heads'] = draft['heads'] + 0.1 * jax.random.normal(jax.random.PRNGKey(1),
                                                          draft['heads'].shape)
  step = draft_training.DraftTrainStep.create(
      'chimera', config, TARGET, params, draft_training.adam(), optimizer.constant(3e-3),
      label_source='data')
  objective, metrics = jax.jit(step.loss)(draft, params, batch)

  @jax.jit
  def on_data(draft, params, batch):  # Eq. 4 by hand: teacher-forced on the data's targets
    inputs, _, hidden = draft_training.target_forward(Transformer(TARGET), params,
                                                      batch['encoder_input_tokens'], data)
    return draft_training.chimera_loss(draft, config, params['token_embedder']['embedding'],
                                       inputs, hidden, data, 1e-4, 1.0)[0]

  np.testing.assert_allclose(objective, on_data(draft, params, batch), rtol=1e-5)
  # Head i's labels are the data's s_{j+i}: 2 heads x the real tokens, less one per row.
  real = np.asarray(data > 0).sum(axis=1)
  assert float(metrics['weight_sum']) == float(np.sum(2 * real - 1))


def _cli(target_dir, model_dir, steps, *extra):
  parser = argparse.ArgumentParser(prog='gqa-spec')
  draft_commands.register(parser.add_subparsers())
  args = parser.parse_args(
      ['train-draft', '--kind', 'chimera', '--target', target_dir, '--task', 'synthetic',
       f"--gin.MODEL_DIR='{model_dir}'", f'--gin.TRAIN_STEPS={steps}', '--gin.BATCH_SIZE=4',
       "--gin.TASK_FEATURE_LENGTHS={'inputs': 12, 'targets': 8}", '--gin.NUM_DRAFT_HEADS=2',
       '--gin_bindings=trainer.CheckpointConfig.save_period = 2',
       '--gin_bindings=trainer.CheckpointConfig.asynchronous = False', *extra])
  return args.func(args)


@pytest.mark.slow
def test_cli_trains_saves_and_resumes_exactly(target_dir, tmp_path):
  reference, resumed = str(tmp_path / 'reference'), str(tmp_path / 'resumed')
  assert _cli(target_dir, reference, 4) == 0
  assert _cli(target_dir, resumed, 2) == 0
  assert _cli(target_dir, resumed, 4) == 0  # resumes at step 2
  assert os.path.isfile(os.path.join(resumed, 'config.gin'))
  config, params_ref, target_path = draft_records.load_chimera(reference)
  _, params_res, _ = draft_records.load_chimera(resumed)
  assert config.num_draft_heads == 2 and target_path == os.path.abspath(target_dir)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params_res, params_ref)
  with pytest.raises(UserError, match='trains a different draft'):
    draft_records.write_draft_file(resumed, 'model', target_dir, TARGET)
  # The run plugs into `generate` / the evaluator through the draft factory.
  from gqa_spec.decoding.drafts import ChimeraDraft, factory  # pylint: disable=g-import-not-at-top
  factory.check_spec(f'chimera:{reference}')
  draft, init, description = factory.make_draft(f'chimera:{reference}', TARGET, 2, 8)
  assert isinstance(draft, ChimeraDraft) and 'chimera' in description
  assert init(np.ones((3, 5), np.int32)).hidden.shape == (3, 2 + 8 + 2, 32)
  with pytest.raises(UserError, match='gamma 3: the Chimera draft has 2 heads'):
    factory.make_draft(f'chimera:{reference}', TARGET, 3, 8)
  with pytest.raises(UserError, match='Chimera draft directory not found: /nonexistent'):
    factory.check_spec('chimera:/nonexistent')
  # ... and as a tree proposer (`generate --tree`, the evaluator's TREE).
  from gqa_spec.decoding.drafts import ChimeraTreeDraft  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.tree import TreeShape  # pylint: disable=g-import-not-at-top
  draft, init, description = factory.make_tree_draft(f'chimera:{reference}', TARGET,
                                                     TreeShape.topk(2, 2), 8)
  assert isinstance(draft, ChimeraTreeDraft) and 'tree topk:2,2' in description
  with pytest.raises(UserError, match='tree depth 3: the Chimera draft has 2 heads'):
    factory.make_tree_draft(f'chimera:{reference}', TARGET, TreeShape.topk(1, 1, 1), 8)


def test_head_topk_accuracy_of_untrained_heads(target_dir):
  # Untrained heads all output the target's logits from h_{j-1}, i.e. its guess for s_j: head i
  # is right exactly where s_{j+i} == s_j, and top-k accuracy cannot fall as k grows.
  _, params, _ = load_any(target_dir)
  config = chimera.ChimeraConfig.for_target(TARGET, num_draft_heads=2)
  draft = chimera.init_params(config, TARGET, params, jax.random.PRNGKey(0))
  batch = _batch()
  rows = draft_training.head_topk_accuracy(config, draft, TARGET, params, [batch], max_k=3)
  labels = np.asarray(draft_training.target_labels(
      Transformer(TARGET), params, {k: jnp.asarray(v) for k, v in batch.items()}, 'target'))
  seq = np.concatenate([np.zeros((4, 1), np.int32), labels, np.zeros((4, 2), np.int32)], axis=1)
  for row in rows:
    i = row['head']
    valid = seq[:, i:i + 8] > 0  # s_{j+i} for j = 0..7 (seq[:, m] = s_m)
    same = (seq[:, i:i + 8] == seq[:, :8]) & valid
    same[:, 0] = False  # j = 0: h_{-1} = 0, all logits tie
    assert row['labels'] == valid.sum()
    assert row['top1'] >= same.sum() / valid.sum() - 1e-9
    assert row['top1'] <= row['top2'] <= row['top3'] <= 1.0


def test_model_draft_starts_from_an_initial_checkpoint_and_a_chimera_cannot(target_dir, tmp_path):
  small = TARGET.replace(emb_dim=16, num_heads=2, num_kv_heads=2, mlp_dim=32)
  start = str(tmp_path / 'independent')
  start_params = init_params(small, jax.random.PRNGKey(7))
  native.save_checkpoint(start, small, start_params)
  target = str(tmp_path / 'target_with_vocab')  # the target's vocabulary goes to the draft
  vocab = tmp_path / 'spm.model'
  vocab.write_bytes(b'spm')
  shutil.copytree(target_dir, target)
  os.makedirs(os.path.join(target, 'vocab'))
  shutil.copyfile(vocab, os.path.join(target, 'vocab', 'sentencepiece.model'))
  ckpt = trainer.CheckpointConfig(save_period=100, keep=1, asynchronous=False)
  run = str(tmp_path / 'distilled')
  # One step at learning rate 0 leaves the initial parameters exactly (a random start would not).
  draft_training.train_draft(kind='model', target_checkpoint=target, model_dir=run,
                             train_dataset_cfg=DATA, total_steps=1, draft_model_config=small,
                             checkpoint_cfg=ckpt, initial_checkpoint_path=start,
                             learning_rate_fn=optimizer.constant(0.0))
  _, exported, exported_vocab = native.load_checkpoint(os.path.join(run, rundir.DRAFT_EXPORT_DIR))
  assert open(exported_vocab, 'rb').read() == b'spm'
  jax.tree_util.tree_map(np.testing.assert_array_equal, exported, start_params)
  # The run resumes from its own step-1 checkpoint and trains on.
  result = draft_training.train_draft(
      kind='model', target_checkpoint=target, model_dir=run, train_dataset_cfg=DATA,
      total_steps=3, draft_model_config=small, checkpoint_cfg=ckpt, initial_checkpoint_path=start)
  assert result.step == 3
  _, trained, _ = native.load_checkpoint(os.path.join(run, rundir.DRAFT_EXPORT_DIR))
  assert any(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      lambda a, b: bool(np.any(np.asarray(a) != b)), trained, start_params)))
  with pytest.raises(UserError, match='initial_checkpoint_path is for --kind model'):
    draft_training.train_draft(kind='chimera', target_checkpoint=target_dir,
                               model_dir=str(tmp_path / 'chimera'), train_dataset_cfg=DATA,
                               total_steps=1, checkpoint_cfg=ckpt, initial_checkpoint_path=start)
  assert not os.path.exists(tmp_path / 'chimera')  # refused: nothing written


def test_a_refused_run_writes_nothing(target_dir, tmp_path):
  """A draft of another vocabulary is refused before MODEL_DIR exists (no draft.json left behind
  to name a draft never trained), in one line that says what to set."""
  run = tmp_path / 'refused'
  with pytest.raises(UserError) as error:
    draft_training.train_draft(kind='model', target_checkpoint=target_dir, model_dir=str(run),
                               train_dataset_cfg=DATA, total_steps=1,
                               draft_model_config=TARGET.replace(vocab_size=512))
  assert str(error.value) == (
      "draft vocabulary 512 != target vocabulary 256: a draft shares its target's vocabulary; "
      "after the model gin add --gin_bindings='config.T5Config.vocab_size = 256'")
  assert not os.path.exists(run)
  run.mkdir()  # an existing, empty MODEL_DIR stays empty
  with pytest.raises(UserError, match='draft vocabulary 512'):
    draft_training.train_draft(kind='model', target_checkpoint=target_dir, model_dir=str(run),
                               train_dataset_cfg=DATA, total_steps=1,
                               draft_model_config=TARGET.replace(vocab_size=512))
  assert not os.listdir(run)


def test_a_model_drafts_topk_accuracy_is_its_teacher_forced_next_token_accuracy(target_dir):
  # The target as its own "model draft": teacher-forced on its greedy outputs, its argmax is the
  # label at every position, so top-1 accuracy is exactly 1 (one head).
  _, params, _ = load_any(target_dir)
  rows = draft_training.head_topk_accuracy(TARGET, params, TARGET, params, [_batch()], max_k=2)
  assert len(rows) == 1 and rows[0]['head'] == 1 and rows[0]['labels'] > 0
  assert rows[0]['top1'] == 1.0 and rows[0]['top2'] == 1.0
  other = init_params(TARGET, jax.random.PRNGKey(11))
  rows = draft_training.head_topk_accuracy(TARGET, other, TARGET, params, [_batch()], max_k=2)
  assert rows[0]['top1'] < 0.5  # a random draft mostly disagrees
