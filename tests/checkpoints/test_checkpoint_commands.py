"""`gqa-spec import-hf | export-hf | import-t5x | convert`: the steering bar end to end, and errors
that are one line with exit code 2, never a traceback."""

import importlib.util
import json
import os
import stat
import subprocess
import sys

import jax
import numpy as np
import pytest

from gqa_spec import cli
from gqa_spec.checkpoints import load, native
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

TINY = T5Config(vocab_size=40, emb_dim=16, num_heads=4, head_dim=4, mlp_dim=24,
                num_encoder_layers=1, num_decoder_layers=2)


@pytest.fixture
def run(capsys):
  """Runs `gqa-spec ARGS` in-process (`cli.main` registers only the named command's module,
  here the checkpoints commands'); returns `(exit code, stdout, stderr)`."""

  def _run(*args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err
  return _run


def _one_line_error(code, err, match):
  assert code == 2
  assert err.count('\n') == 1 and err.startswith('gqa-spec: error: '), err
  assert match in err, err


def test_bar_import_convert_export_reproduces_gqa_logits(run, hf_dir, batch, logits_fns, tmp_path):
  # In the scanned layout throughout: HF import stacks, convert works on it, export unstacks.
  ckpt, gqa, exported = tmp_path / 'ckpt', tmp_path / 'gqa', tmp_path / 'gqa_hf'
  vocab = tmp_path / 'spm.model'  # the HF dir has no spiece.model: --vocab supplies one
  vocab.write_bytes(b'spm')
  assert run('import-hf', hf_dir, ckpt, '--layout', 'scanned', '--vocab', vocab)[0] == 0
  assert run('convert', ckpt, gqa, '--kv-heads', 2, '--method', 'mean')[0] == 0
  assert open(native.vocab_path(str(gqa)), 'rb').read() == b'spm'  # it travels through convert
  assert run('export-hf', gqa, exported)[0] == 0
  modes = {f: stat.S_IMODE(os.stat(exported / f).st_mode) for f in os.listdir(exported)}
  umask = os.umask(0)
  os.umask(umask)
  assert modes == dict.fromkeys(['config.json', 'model.safetensors', 'spiece.model'],
                                0o666 & ~umask)
  config, params, _ = native.load_checkpoint(str(gqa))
  assert config.num_kv_heads == 2 and config.scan_layers and 'layers' in params['decoder']
  model = transformers.T5ForConditionalGeneration.from_pretrained(exported).eval()
  hf_logits, our_logits = logits_fns
  np.testing.assert_allclose(hf_logits(model, *batch), our_logits(config, params, *batch),
                             atol=1e-4, rtol=0)


def test_import_t5x_with_preset_and_config(run, init_params, t5x_writer, tmp_path):
  params = init_params(TINY)
  t5x_writer(str(tmp_path / 't5x'), 7, params)
  config_file = tmp_path / 'tiny.json'
  config_file.write_text(TINY.to_json())
  vocab = tmp_path / 'spm.model'
  vocab.write_bytes(b'spm')
  code, out, _ = run('import-t5x', tmp_path / 't5x', tmp_path / 'ckpt', '--config', config_file,
                     '--vocab', vocab)
  assert code == 0 and 'imported' in out
  config, loaded, vocab_path = native.load_checkpoint(str(tmp_path / 'ckpt'))
  assert config == TINY and vocab_path.endswith('sentencepiece.model')
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  # Into the scanned layout, and back to T5X's names when a native checkpoint is loaded unrolled.
  assert run('import-t5x', tmp_path / 't5x', tmp_path / 'scanned', '--config', config_file,
             '--layout', 'scanned')[0] == 0
  config, scanned, _ = native.load_checkpoint(str(tmp_path / 'scanned'))
  assert config == TINY.replace(scan_layers=True)
  np.testing.assert_array_equal(scanned['decoder']['layers']['mlp']['wo']['kernel'][:, 1],
                                params['decoder']['layers_1']['mlp']['wo']['kernel'])
  config, unrolled, _ = load.load_any(str(tmp_path / 'scanned'), scan_layers=False)
  assert config == TINY
  jax.tree.map(np.testing.assert_array_equal, unrolled, params)
  # The layout names eval/infer take (`layout=` / --layout): None keeps the stored layout.
  assert [load.scan_layers_of(x) for x in (None, 'unrolled', 'scanned')] == [None, False, True]
  with pytest.raises(UserError, match="layout must be one of unrolled, scanned .* got 'stacked'"):
    load.scan_layers_of('stacked')
  code, _, err = run('import-t5x', tmp_path / 't5x', tmp_path / 'ckpt2', '--preset', 'small')
  _one_line_error(code, err, 'parameter decoder/decoder_norm/scale has shape (16,), the model '
                  'config needs (512,)')
  code, _, err = run('import-t5x', tmp_path / 't5x', tmp_path / 'ckpt2', '--preset', 'huge')
  _one_line_error(code, err, "unknown model preset 'huge'")
  code, _, err = run('import-t5x', tmp_path / 't5x', tmp_path / 'ckpt2', '--config', vocab)
  _one_line_error(code, err, 'invalid model config')


def test_errors_are_one_line(run, hf_dir, tmp_path):
  ckpt = tmp_path / 'ckpt'
  _one_line_error(*run('import-hf', tmp_path / 'nope', ckpt)[::2],
                  'HF checkpoint directory not found')
  _one_line_error(*run('export-hf', tmp_path / 'nope', tmp_path / 'hf')[::2],
                  'checkpoint directory not found')
  (tmp_path / 't5x').mkdir()
  _one_line_error(*run('import-t5x', tmp_path / 't5x', ckpt, '--preset', 'small')[::2],
                  'no T5X checkpoint file')
  _one_line_error(*run('import-t5x', tmp_path, ckpt, '--preset', 'small')[::2],
                  f'OUT_DIR {ckpt} lies inside the input T5X_CKPT {tmp_path}; write elsewhere')
  assert run('import-hf', hf_dir, ckpt)[0] == 0
  _one_line_error(*run('import-hf', hf_dir, ckpt)[::2], 'already exists')
  assert run('import-hf', hf_dir, ckpt, '--overwrite')[0] == 0
  _one_line_error(*run('convert', ckpt, tmp_path / 'g', '--kv-heads', 3, '--method', 'mean')[::2],
                  '--kv-heads 3 must be a positive divisor of the number of heads 4')
  (ckpt / 'config.json').write_text('{"num_heads": 4')
  _one_line_error(*run('convert', ckpt, tmp_path / 'g', '--kv-heads', 2, '--method', 'first')[::2],
                  'corrupt model config')
  assert not (tmp_path / 'g').exists()


def test_bad_arguments_exit_2_without_traceback(run, capsys):
  with pytest.raises(SystemExit) as exit_info:
    run('convert', 'a', 'b', '--kv-heads', 2, '--method', 'median')
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "invalid choice: 'median'" in err and 'Traceback' not in err


@pytest.mark.skipif(importlib.util.find_spec('gqa_spec.decoding.commands') is None,
                    reason='the real CLI also registers gqa_spec.decoding.commands')
def test_console_entry_point_subprocess(hf_dir, tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env.pop('GQA_SPEC_DEBUG', None)
  ok = subprocess.run([sys.executable, '-m', 'gqa_spec.cli', 'import-hf', hf_dir, tmp_path / 'c'],
                      capture_output=True, text=True, env=env, check=False)
  assert ok.returncode == 0, ok.stderr
  assert json.loads((tmp_path / 'c' / 'config.json').read_text())['num_heads'] == 4
  bad = subprocess.run([sys.executable, '-m', 'gqa_spec.cli', 'convert', tmp_path / 'c',
                        tmp_path / 'g', '--kv-heads', '5', '--method', 'mean'],
                       capture_output=True, text=True, env=env, check=False)
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines()[-1].startswith('gqa-spec: error: --kv-heads 5')
  assert 'Traceback' not in bad.stderr


def test_outputs_checked_first_and_hf_folder_hint(run, hf_dir, tmp_path):
  _one_line_error(*run('convert', hf_dir, tmp_path / 'g', '--kv-heads', 2, '--method', 'mean')[::2],
                  f'it is a Hugging Face checkpoint: convert it first with `gqa-spec import-hf '
                  f'{hf_dir} OUT_DIR`')
  ckpt = tmp_path / 'ckpt'
  ckpt.mkdir()
  (ckpt / 'config.json').write_text('{}')  # never read: the output is refused first
  _one_line_error(*run('export-hf', ckpt, ckpt, '--overwrite')[::2],
                  f'HF_DIR {ckpt} would replace the input CKPT_DIR')
  _one_line_error(*run('convert', ckpt, tmp_path, '--kv-heads', 1, '--method', 'mean',
                       '--overwrite')[::2], 'would replace the input CKPT_DIR')
  (tmp_path / 'taken').mkdir()
  _one_line_error(*run('convert', ckpt, tmp_path / 'taken', '--kv-heads', 1, '--method',
                       'mean')[::2], 'already exists (pass --overwrite')
  assert (ckpt / 'config.json').read_text() == '{}'
