"""Every gin file in configs/ parses; the T5.1.1 model gins equal `PRESETS`; gin errors are clear."""

import glob
import os
import shutil
import subprocess
import sys
import zipfile

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


def test_unquoted_string_value_names_the_binding_and_the_quoting():
  _, bindings = gin_utils.split_macro_flags(['--gin.CHECKPOINT_PATH=/tmp/ckpt', '--gin.STEPS=5'])
  with pytest.raises(UserError) as info:
    gin_utils.parse(['experiments/nano_mha_pretrain_ddtp.gin'], bindings, finalize=False)
  assert str(info.value) == (
      'gin: cannot parse the value of CHECKPOINT_PATH: /tmp/ckpt; a gin string needs its own '
      'quotes inside the shell\'s, e.g. --gin.CHECKPOINT_PATH="\'/tmp/ckpt\'"')


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


_CONFIG_LIKE = ('runs/smoke/models', 'models/t5_1_1', 'models/attention', 'experiments', 'configs',
                'runs/pretrain.gin')  # the last: even a *directory* named like a config file


def _config_like_directories(root):
  """What `gqa-spec reproduce` and users leave in a working directory: names that match includes."""
  for name in _CONFIG_LIKE:
    (root / name).mkdir(parents=True, exist_ok=True)


@pytest.fixture
def cluttered_cwd(tmp_path, monkeypatch):
  """A working directory with config-like directories that is also on sys.path.

  `python -c`, `python -m` and `.pth`-based editable installs put the working directory (or the
  repository root) on sys.path; that is what let gin's package-resource reader import `./runs`
  as a namespace package and crash.
  """
  _config_like_directories(tmp_path)
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))
  yield tmp_path
  for name in list(sys.modules):  # the namespace packages imported from tmp_path
    if name.split('.')[0] in ('runs', 'models', 'experiments', 'configs'):
      del sys.modules[name]


@pytest.mark.parametrize('path', ALL_GIN)
def test_every_gin_file_parses_beside_config_like_directories(path, cluttered_cwd):
  # Issue 16: a `runs/` directory in the working directory (the reproduction's default work dir)
  # made every `include 'runs/...'` fail inside gin's package-resource reader.
  files = [path]
  if path.startswith('models/attention/') or path.startswith('runs/'):
    files = ['models/t5_1_1/nano.gin', path]
  gin_utils.parse(files, finalize=False)
  gin.clear_config()


def test_a_real_config_file_in_the_working_directory_still_wins(cluttered_cwd):
  # cwd first is gin's and t5x's rule: a user's own models/t5_1_1/nano.gin shadows ours on purpose.
  (cluttered_cwd / 'models' / 't5_1_1' / 'nano.gin').write_text(
      "include 'models/t5_1_1/mini.gin'\n")
  assert _model_config(['experiments/nano_mha_pretrain_ddtp.gin']).emb_dim == (
      config.PRESETS['mini'].emb_dim)


def test_missing_include_names_the_include_and_the_paths_tried(cluttered_cwd):
  tmp_path = cluttered_cwd
  (tmp_path / 'mine.gin').write_text("include 'runs/no_such_run.gin'\n")
  with pytest.raises(UserError) as info:
    gin_utils.parse(['mine.gin'])
  message = str(info.value)
  assert "include 'runs/no_such_run.gin' not found" in message
  assert 'mine.gin' in message and gin_utils.CONFIGS_DIR in message and str(tmp_path) in message
  assert '\n' not in message


def test_configs_ship_in_the_wheel(tmp_path):
  """A non-editable install (`pip install .`) resolves every config with no --gin_search_paths."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  src = tmp_path / 'src'  # a copy: setuptools' build/ in the checkout may hold stale files
  src.mkdir()
  for name in ('pyproject.toml', 'setup.py', 'README.md'):
    shutil.copy(os.path.join(repo, name), src / name)
  for name in ('gqa_spec', 'configs'):
    shutil.copytree(os.path.join(repo, name), src / name,
                    ignore=shutil.ignore_patterns('__pycache__', '*.egg-info'))
  subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation',
                  '-w', str(tmp_path / 'wheel'), str(src)], check=True, capture_output=True)
  wheel, = (tmp_path / 'wheel').glob('gqa_spec-*.whl')
  with zipfile.ZipFile(wheel) as z:
    shipped = {n[len('gqa_spec/configs/'):] for n in z.namelist()
               if n.startswith('gqa_spec/configs/') and n.endswith('.gin')}
    z.extractall(tmp_path / 'site')
  assert shipped == set(ALL_GIN)
  cwd = tmp_path / 'elsewhere'
  _config_like_directories(cwd)
  script = ('from gqa_spec.training import gin_utils\n'
            'print(gin_utils.CONFIGS_DIR)\n'
            "gin_utils.parse(['experiments/nano_uptrain_gqa2_ddtp.gin'], finalize=False)\n")
  out = subprocess.run([sys.executable, '-c', script], cwd=cwd, check=True, capture_output=True,
                       text=True, env={**os.environ, 'PYTHONPATH': str(tmp_path / 'site')})
  assert out.stdout.strip() == str(tmp_path / 'site' / 'gqa_spec' / 'configs')


@pytest.mark.parametrize('command', ['eval', 'infer'])
def test_param_dtype_and_layout_flags_reach_the_function_when_the_gin_file_does_not_bind_them(
    tmp_path, monkeypatch, command):
  """A user's gin file that configures eval/infer without `param_dtype = %PARAM_DTYPE`: the flag
  still applies (it set the macro alone, a silent no-op, before). Likewise `--layout`."""
  from gqa_spec import cli  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import commands  # pylint: disable=g-import-not-at-top
  calls = []
  monkeypatch.setattr(commands.gin_utils, 'call',
                      lambda fn, **kwargs: calls.append((fn.__name__, kwargs)) or {})
  path = tmp_path / 'mine.gin'
  path.write_text('MODEL_DIR = None\n')  # binds nothing of eval/infer
  try:
    assert cli.main([command, f'--gin_file={path}', '--param-dtype', 'bfloat16',
                     '--layout', 'scanned']) == 0
    assert calls == [({'eval': 'evaluate_checkpoint', 'infer': 'infer'}[command],
                      {'param_dtype': 'bfloat16', 'layout': 'scanned'})]
    calls.clear()
    assert cli.main([command, f'--gin_file={path}']) == 0
    assert calls[0][1] == {}  # no flag: the gin files decide
  finally:
    gin.clear_config()
