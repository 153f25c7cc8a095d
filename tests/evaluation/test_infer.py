"""`gqa-spec infer` at batch > 1 on rows of different lengths, through seqio and an export: the
last batch padded and its padding rows dropped, and the same predictions at every batch size."""

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.checkpoints import native
from gqa_spec.data import commands as data_commands
from gqa_spec.data import tasks
from gqa_spec.errors import UserError
from gqa_spec.evaluation import infer
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

TASK = 'ddtp_translate_en_de'
LENGTHS = {'inputs': 48, 'targets': 6}


@pytest.fixture(scope='module')
def setup(tiny_data_dir, tmp_path_factory):
  """(a tiny random native checkpoint for the tiny corpus's 400-id vocabulary, an export dir)."""
  tasks.register_ddtp_tasks(tiny_data_dir)
  root = tmp_path_factory.mktemp('infer')
  config = T5Config(vocab_size=512, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                    num_encoder_layers=1, num_decoder_layers=1)
  ckpt = str(root / 'ckpt')
  tokens = jnp.ones((1, 3), jnp.int32)
  params = jax.jit(lambda: Transformer(config).init(
      jax.random.PRNGKey(0), tokens, tokens, tokens, enable_dropout=False)['params'])()
  params = jax.tree.map(np.asarray, params)
  # Sharpen the near-uniform output of a random init: greedy picks no near-tie.
  params['decoder']['logits_dense']['kernel'] = params['decoder']['logits_dense']['kernel'] * 8
  native.save_checkpoint(ckpt, config, params)
  export = str(root / 'export')
  parser = argparse.ArgumentParser()
  data_commands.register(parser.add_subparsers())
  args = parser.parse_args(['data', 'export', TASK, '--out', export, '--lengths', '48,6',
                            '--data-dir', tiny_data_dir])
  assert args.func(args) == 0
  yield ckpt, export
  tasks.register_ddtp_tasks()  # back to the default data dir for other modules


def _infer(ckpt, task, out, batch_size):
  path = infer.infer(ckpt, task, out, task_feature_lengths=LENGTHS, batch_size=batch_size,
                     num_examples=5)[TASK]
  return [json.loads(line) for line in open(path)]


def test_batches_of_rows_of_different_lengths(setup, tmp_path):
  ckpt, export = setup
  lines = _infer(ckpt, TASK, str(tmp_path / 'b3'), 3)  # 5 rows: a full batch and a padded one
  assert len(lines) == 5
  texts = [line['inputs']['inputs_pretokenized'] for line in lines]
  assert all(t.startswith('translate English to German: ') for t in texts)
  assert len({len(t) for t in texts}) > 1  # rows of different lengths in one batch
  one = _infer(ckpt, TASK, str(tmp_path / 'b1'), 1)
  assert [l['prediction'] for l in one] == [l['prediction'] for l in lines]
  exported = _infer(ckpt, f'exported:{export}/{TASK}', str(tmp_path / 'e3'), 3)
  assert exported == lines


def test_rerun_names_the_files_it_replaces_and_a_missing_checkpoint(setup, tmp_path, capsys):
  ckpt, _ = setup
  out = str(tmp_path / 'again')
  first = _infer(ckpt, TASK, out, 3)
  assert 'replacing' not in capsys.readouterr().err
  assert _infer(ckpt, TASK, out, 3) == first  # replaced, with one line naming the file
  assert capsys.readouterr().err == (f'gqa-spec: replacing 1 existing file(s) in {out}: '
                                     f'{TASK}-predict.jsonl-00000-of-00001\n')
  with pytest.raises(UserError, match=r'^\S*/nope: checkpoint not found$'):
    infer.infer(str(tmp_path / 'nope'), TASK, out)


def test_aux_scores_and_speculative_decoding_through_the_decode_fn(setup, tmp_path):
  """`predict_with_aux`: greedy rows carry their log-probability; speculative decoding (a copy
  draft through `t5x_compat.speculative_sample`, infer's DecodeFnCallable) gives the greedy
  predictions with null scores (the loop computes none)."""
  ckpt, _ = setup
  run = lambda out, **kw: [json.loads(line) for line in open(infer.infer(
      ckpt, TASK, str(tmp_path / out), task_feature_lengths=LENGTHS, batch_size=2, num_examples=3,
      mode='predict_with_aux', **kw)[TASK])]
  greedy = run('greedy')
  assert len(greedy) == 3 and all(set(l) == {'inputs', 'prediction', 'aux'} for l in greedy)
  assert all(l['aux']['scores'] < 0 for l in greedy)
  speculative = run('speculative', decoding='speculative', draft='copy', gamma=2)
  assert [l['prediction'] for l in speculative] == [l['prediction'] for l in greedy]
  assert all(l['aux']['scores'] is None for l in speculative)
