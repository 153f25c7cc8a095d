"""`gqa-spec generate` on text: `--vocab` for a checkpoint without one, `--task` applying the task's
own input preprocessing, the `output` text beside `output_ids`; `--vocab` on `convert`."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec import cli
from gqa_spec.checkpoints import native
from gqa_spec.data import corpus, tasks, text_inputs
from gqa_spec.data.vocabulary import get_vocabulary
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

TASK = 'ddtp_translate_en_de'
PREFIX = 'translate English to German: '
TEXTS = ['Real-time strategy game of ancient warfare', 'A free game.']


@pytest.fixture(scope='module')
def workdir(tiny_data_dir, tmp_path_factory):
  """A tiny random checkpoint for the tiny corpus's vocabulary, written without it."""
  tasks.register_ddtp_tasks(tiny_data_dir)
  d = tmp_path_factory.mktemp('generate_text')
  config = T5Config(vocab_size=512, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                    num_encoder_layers=1, num_decoder_layers=1)
  tokens = jnp.ones((1, 3), jnp.int32)
  params = jax.jit(lambda: Transformer(config).init(
      jax.random.PRNGKey(0), tokens, tokens, tokens, enable_dropout=False)['params'])()
  params = jax.tree.map(np.asarray, params)
  params['decoder']['logits_dense']['kernel'] = params['decoder']['logits_dense']['kernel'] * 8
  native.save_checkpoint(str(d / 'ckpt'), config, params)
  yield d, corpus.vocab_path(tiny_data_dir)
  tasks.register_ddtp_tasks()  # back to the default data dir for other modules


def _write(path, lines):
  with open(path, 'w') as f:
    f.writelines(json.dumps(line) + '\n' for line in lines)
  return str(path)


def _generate(d, inputs, name, *extra):
  out = str(d / f'{name}.jsonl')
  argv = ['generate', '--model', str(d / 'ckpt'), '--inputs', inputs, '--out', out,
          '--max-decode-len', '6', '--batch-size', '2', *extra]
  assert cli.main(argv) == 0
  return [json.loads(line) for line in open(out)]


def test_task_inputs_apply_the_tasks_prefix_and_eos(workdir):
  _, vocab_path = workdir
  vocab = get_vocabulary(vocab_path)
  ids = text_inputs.task_inputs(TASK, TEXTS)
  assert [vocab.decode(i) for i in ids] == [PREFIX + t for t in TEXTS]
  assert all(i[-1] == 1 and 1 not in i[:-1] for i in ids)
  assert text_inputs.vocab_file(TASK) == vocab_path
  with pytest.raises(UserError, match='does not tokenize text inputs|makes no inputs'):
    text_inputs.task_inputs('ddtp_span_corruption', TEXTS)


def test_text_in_text_out(workdir, tmp_path):
  d, vocab_path = workdir
  vocab = get_vocabulary(vocab_path)
  texts = _write(tmp_path / 'text.jsonl', [{'inputs': t} for t in TEXTS])
  prefixed = _write(tmp_path / 'prefixed.jsonl', [{'inputs': PREFIX + t} for t in TEXTS])
  by_task = _generate(d, texts, 'task', '--task', TASK)  # the task's vocabulary, its prefix
  by_vocab = _generate(d, prefixed, 'vocab', '--vocab', vocab_path)
  assert [l['output_ids'] for l in by_task] == [l['output_ids'] for l in by_vocab]
  for line in by_task + by_vocab:
    assert set(line) == {'output_ids', 'output'}
    assert line['output'] == vocab.decode(line['output_ids'])
  assert any(l['output_ids'] for l in by_task)
  # Without --task the text is encoded as it stands: other inputs, so (here) other outputs.
  plain = _generate(d, texts, 'plain', '--vocab', vocab_path)
  assert len(plain) == 2 and [l['output_ids'] for l in plain] != [l['output_ids'] for l in by_task]


def test_vocab_errors_are_one_line(workdir, tmp_path, capsys):
  d, vocab_path = workdir
  texts = _write(tmp_path / 'text.jsonl', [{'inputs': TEXTS[0]}])
  out = str(tmp_path / 'out.jsonl')
  base = ['generate', '--model', str(d / 'ckpt'), '--inputs', texts, '--out', out]
  assert cli.main(base) == 2
  assert 'carries none; pass --vocab or --task' in capsys.readouterr().err
  assert cli.main(base + ['--vocab', str(tmp_path / 'missing.model')]) == 2
  assert 'missing.model: vocabulary file not found' in capsys.readouterr().err
  garbage = tmp_path / 'garbage.model'
  garbage.write_bytes(b'not a model')
  assert cli.main(base + ['--vocab', str(garbage)]) == 2
  assert capsys.readouterr().err.startswith(f'gqa-spec: error: {garbage}: not a SentencePiece model')
  # convert --vocab: the result carries it; then another --vocab is refused.
  carried = str(tmp_path / 'carried')
  assert cli.main(['convert', str(d / 'ckpt'), carried, '--kv-heads', '1', '--method', 'mean',
                   '--vocab', vocab_path]) == 0
  assert native.vocab_path(carried) and open(native.vocab_path(carried), 'rb').read() == open(
      vocab_path, 'rb').read()
  other = tmp_path / 'other.model'
  other.write_bytes(b'not the same')
  assert cli.main(['generate', '--model', carried, '--inputs', texts, '--out', out,
                   '--vocab', str(other)]) == 2
  err = capsys.readouterr().err
  assert 'carries another vocabulary' in err and len(err.strip().splitlines()) == 1
  assert cli.main(['generate', '--model', carried, '--inputs', texts, '--out', out,
                   '--max-decode-len', '4']) == 0  # its own vocabulary: text in, text out
  assert 'output' in json.loads(open(out).readline())


def test_vocab_larger_than_the_models_embedding_is_refused(workdir, tmp_path, capsys):
  """`--vocab` with more ids than the model embeds is refused in one line, as `eval` and `infer`
  refuse such a task (`data.vocab_fit`), even for `input_ids` inputs, and no output is written."""
  _, vocab_path = workdir
  config = T5Config(vocab_size=32, emb_dim=8, num_heads=1, head_dim=8, mlp_dim=8,
                    num_encoder_layers=1, num_decoder_layers=1)
  tokens = jnp.ones((1, 3), jnp.int32)
  params = jax.tree.map(np.asarray, Transformer(config).init(
      jax.random.PRNGKey(0), tokens, tokens, tokens, enable_dropout=False)['params'])
  small = str(tmp_path / 'small')
  native.save_checkpoint(small, config, params)
  inputs = _write(tmp_path / 'ids.jsonl', [{'input_ids': [5, 6, 1]}])
  out = tmp_path / 'out.jsonl'
  size = get_vocabulary(vocab_path).vocab_size
  assert size > 32
  assert cli.main(['generate', '--model', small, '--inputs', inputs, '--out', str(out),
                   '--vocab', vocab_path]) == 2
  err = capsys.readouterr().err
  assert err == (f'gqa-spec: error: --vocab {vocab_path} has a vocabulary of {size} ids, but '
                 f'{small} embeds only 32: the model was trained for another vocabulary\n')
  assert not out.exists()


def test_missing_chimera_directory_is_named_and_help_lists_chimera(tmp_path, capsys):
  missing = tmp_path / 'no_such_chimera'
  assert cli.main(['generate', '--model', str(tmp_path), '--inputs', str(tmp_path / 'in.jsonl'),
                   '--out', str(tmp_path / 'out.jsonl'), '--draft', f'chimera:{missing}']) == 2
  err = capsys.readouterr().err
  assert err == (f'gqa-spec: error: --draft chimera:{missing}: Chimera draft directory not found: '
                 f'{missing}\n')
  with pytest.raises(SystemExit):
    cli.main(['generate', '--help'])
  assert 'chimera:DIR' in capsys.readouterr().out
