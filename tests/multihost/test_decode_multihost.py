"""eval, infer and generate over two processes x 4 virtual CPU devices give the one-process (8
devices) outputs, and only process 0 writes and prints: `gqa-spec eval` with beam search on a 4x2
mesh spanning both processes, `gqa-spec infer` with beam search (each process on one device),
`gqa-spec generate` with a token tree on a 4x2 mesh (`decode.py` runs them; three processes side
by side, each under a timeout)."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.checkpoints import native
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from tests.multihost.test_multihost import env, free_port, run_all

pytestmark = pytest.mark.slow  # ~50 s: three processes, TensorFlow and four compiled loops in each

DECODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'decode.py')
EVAL = 'predictions-ddtp_translate_en_de.jsonl'
INFER = 'ddtp_translate_en_de-predict.jsonl-00000-of-00001'


@pytest.fixture(scope='module')
def runs(tiny_data_dir, tmp_path_factory):
  root = tmp_path_factory.mktemp('decode')
  # tests/evaluation/test_infer.py's checkpoint: the tiny corpus's vocabulary, logits sharpened so
  # that greedy and beam meet no near-tie
  config = T5Config(vocab_size=512, emb_dim=16, num_heads=2, num_kv_heads=2, head_dim=8,
                    mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1)
  tokens = jnp.ones((1, 3), jnp.int32)
  params = jax.tree.map(np.asarray, jax.jit(lambda: Transformer(config).init(
      jax.random.PRNGKey(0), tokens, tokens, tokens, enable_dropout=False)['params'])())
  params['decoder']['logits_dense']['kernel'] = params['decoder']['logits_dense']['kernel'] * 8
  ckpt = str(root / 'ckpt')
  native.save_checkpoint(ckpt, config, params)
  one, two = root / 'one', root / 'two'
  one.mkdir()
  two.mkdir()
  port = free_port()
  data = {'GQA_SPEC_DATA_DIR': tiny_data_dir}
  codes = run_all(
      [([sys.executable, DECODE, str(one), ckpt, '1', '0', '0'], dict(env(8), **data),
        one / 'log0')]
      + [([sys.executable, DECODE, str(two), ckpt, '2', str(i), str(port)], dict(env(4), **data),
          two / f'log{i}') for i in (0, 1)])
  logs = [(one / 'log0').read_text()] + [(two / f'log{i}').read_text() for i in (0, 1)]
  assert codes == [0, 0, 0], '\n'.join(log[-3000:] for log in logs)
  return one, two


def _lines(path):
  return path.read_text().splitlines()


def test_eval_beam_equals_one_process(runs):
  one, two = runs
  got = _lines(two / 'eval_beam' / EVAL)
  assert len(got) == 5 and got == _lines(one / 'eval_beam' / EVAL)
  report_two, report_one = (json.loads((run / 'eval_beam' / 'metrics.json').read_text())
                            for run in (two, one))
  quality = lambda r: {k: v for k, v in r['metrics'].items() if not k.startswith('timing/')}
  assert quality(report_two) == quality(report_one) and 'bleu' in report_two['metrics']
  assert report_two['mesh'] == report_one['mesh'] == {'data': 4, 'model': 2}


def test_infer_beam_and_generate_tree_equal_one_process(runs):
  one, two = runs
  got = _lines(two / 'infer_beam' / INFER)
  assert len(got) == 5 and got == _lines(one / 'infer_beam' / INFER)
  got = _lines(two / 'tree.jsonl')
  assert len(got) == 5 and got == _lines(one / 'tree.jsonl')
  stats = [json.loads((run / 'tree_stats.json').read_text()) for run in (two, one)]
  assert stats[0]['mesh'] == stats[1]['mesh'] == {'data': 4, 'model': 2}
  for key in ('tokens', 'target_calls', 'accept_histogram', 'accepted_per_position', 'proposed',
              'accepted', 'draft_calls'):
    assert stats[0][key] == stats[1][key], key
  assert stats[0]['tree'] == 'topk:2,2' and stats[0]['accepted'] > 0


def test_only_process_zero_writes_and_prints(runs):
  _, two = runs
  written = sorted(p.name for p in two.iterdir() if p.name.startswith('p1_'))
  assert written == ['p1_eval_beam.stdout', 'p1_infer_beam.stdout', 'p1_tree.stdout']
  for name in written:
    assert (two / name).read_text() == '', name
  for name in ('eval_beam', 'infer_beam'):
    assert (two / f'{name}.stdout').read_text() != ''
