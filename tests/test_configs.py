"""Every gin file in configs/ parses; the T5.1.1 model gins equal `PRESETS`; gin errors are clear."""

import glob
import os

import gin
import pytest

from gqa_spec.errors import UserError
from gqa_spec.models import config
from gqa_spec.training import gin_utils

CONFIGS = gin_utils.CONFIGS_DIR
ALL_GIN = sorted(os.path.relpath(p, CONFIGS)
                 for p in glob.glob(os.path.join(CONFIGS, '**', '*.gin'), recursive=True))


def _model_config(files, bindings=()):
  gin_utils.parse(files, bindings, finalize=False)
  try:
    return gin.get_configurable(config.T5Config)()
  finally:
    gin.clear_config()


def test_configs_exist():
  for required in ('runs/pretrain.gin', 'runs/finetune.gin', 'runs/uptrain.gin', 'runs/eval.gin',
                   'models/attention/mha.gin', 'models/attention/gqa.gin',
                   'models/attention/mqa.gin'):
    assert required in ALL_GIN
  assert any(p.startswith('experiments/') for p in ALL_GIN)


@pytest.mark.parametrize('path', ALL_GIN)
def test_every_gin_file_parses(path):
  files = [path]
  if path.startswith('models/attention/') or path.startswith('runs/'):
    files = ['models/t5_1_1/nano.gin', path]  # attention and run configs follow a model config
  gin_utils.parse(files, finalize=False)
  gin.clear_config()


@pytest.mark.parametrize('name', sorted(config.PRESETS))
def test_t5_1_1_gin_equals_preset(name):
  assert _model_config([f'models/t5_1_1/{name}.gin']) == config.PRESETS[name]


@pytest.mark.parametrize('attention,kv_heads', [('mha', 4), ('gqa', 2), ('mqa', 1)])
def test_attention_configs_set_num_kv_heads(attention, kv_heads):
  got = _model_config(['models/t5_1_1/nano.gin', f'models/attention/{attention}.gin'])
  assert got == config.preset('nano', num_kv_heads=kv_heads)
  assert _model_config(['models/t5_1_1/xxl.gin', 'models/attention/gqa.gin'],
                       ['NUM_KV_HEADS = 8']).num_kv_heads == 8


def test_experiment_layers_model_run_and_macros():
  gin_utils.parse(['experiments/nano_finetune_translate_ddtp.gin'], finalize=False)
  try:
    assert gin.query_parameter('%DROPOUT_RATE') == 0.1  # the run config overrides the model's
    assert gin.query_parameter('%MIXTURE_OR_TASK_NAME') == 'ddtp_translate_en_de'
    assert gin.get_configurable(config.T5Config)().dropout_rate == 0.1
  finally:
    gin.clear_config()


def test_found_from_any_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert _model_config(['models/t5_1_1/nano.gin']) == config.PRESETS['nano']
  assert _model_config(['configs/models/t5_1_1/mini.gin']) == config.PRESETS['mini']
  (tmp_path / 'extra').mkdir()
  (tmp_path / 'extra' / 'tiny.gin').write_text(
      "include 'models/t5_1_1/nano.gin'\nconfig.T5Config.num_encoder_layers = 1\n"
      'from gqa_spec.models import config\n')
  gin_utils.parse(['tiny.gin'], extra_search_paths=[str(tmp_path / 'extra')], finalize=False)
  try:
    assert gin.get_configurable(config.T5Config)().num_encoder_layers == 1
  finally:
    gin.clear_config()


@pytest.mark.parametrize('text,match', [
    ("FOO = (1,\n", 'EOF in multi-line statement'),
    ("include 'models/t5_1_1/nano.gin'\nBAR = @nothing.here()\n", 'No configurable'),
    ("include 'models/t5_1_1/nope.gin'\n", 'nope.gin'),
])
def test_malformed_gin_is_one_line_user_error(tmp_path, text, match):
  path = tmp_path / 'bad.gin'
  path.write_text(text)
  with pytest.raises(UserError, match=match) as info:
    gin_utils.parse([str(path)])
  assert '\n' not in str(info.value)


def test_macro_flags():
  argv, bindings = gin_utils.split_macro_flags(
      ['--gin_file=a.gin', "--gin.MODEL_DIR='/tmp/x'", '--gin.TRAIN_STEPS', '5'])
  assert argv == ['--gin_file=a.gin']
  assert bindings == ["MODEL_DIR = '/tmp/x'", 'TRAIN_STEPS = 5']
  with pytest.raises(UserError):
    gin_utils.split_macro_flags(['--gin.X'])


def test_unset_required_macro_is_a_user_error():
  with pytest.raises(UserError, match='MODEL_DIR.*REQUIRED') as info:
    gin_utils.parse(['experiments/nano_mha_pretrain_ddtp.gin'])  # MODEL_DIR left unset
  assert '\n' not in str(info.value)
