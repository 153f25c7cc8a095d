"""Model configs: validation, JSON round trip, preset sizes and golden parameter shapes.

Golden files (as flaxformer's testdata) make any change of checkpoint layout visible in review.
Regenerate them deliberately with: GQA_SPEC_UPDATE_GOLDENS=1 pytest tests/models/test_config.py
"""

import dataclasses
import json
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import pytest

from gqa_spec.models.config import PRESETS, T5Config, decoder_flops_per_token, preset
from gqa_spec.models.t5 import Transformer

GOLDEN_DIR = pathlib.Path(__file__).parents[1] / 'testdata' / 'param_shapes'
GOLDEN_CASES = {name: (name, None, False) for name in PRESETS}
GOLDEN_CASES.update({'mini_gqa2': ('mini', 2, False), 'mini_mqa': ('mini', 1, False),
                     'xxl_gqa8': ('xxl', 8, False),
                     # The scanned layout (T5Config.scan_layers): layers stacked at axis 1.
                     'mini_gqa2_scanned': ('mini', 2, True), 'xxl_gqa8_scanned': ('xxl', 8, True)})


def param_shapes(config: T5Config) -> dict:
  """Flattened `{'decoder/layers_0/...': [shapes]}` without allocating parameters."""
  tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  abstract = jax.eval_shape(
      lambda e, d: Transformer(config).init(jax.random.PRNGKey(0), e, d, d, enable_dropout=False),
      tokens, tokens)['params']
  flat = jax.tree_util.tree_flatten_with_path(abstract)[0]
  return {'/'.join(k.key for k in path): list(leaf.shape) for path, leaf in flat}


@pytest.mark.parametrize('case', sorted(GOLDEN_CASES))
def test_parameter_shapes_match_golden_file(case):
  name, kv_heads, scan_layers = GOLDEN_CASES[case]
  shapes = param_shapes(preset(name, num_kv_heads=kv_heads, scan_layers=scan_layers))
  path = GOLDEN_DIR / f'{case}.json'
  if os.environ.get('GQA_SPEC_UPDATE_GOLDENS'):
    lines = [f'  {json.dumps(k)}: {json.dumps(v)}' for k, v in sorted(shapes.items())]
    path.write_text('{\n' + ',\n'.join(lines) + '\n}\n')  # one parameter per line
  assert shapes == json.loads(path.read_text())


def test_public_t5_1_1_sizes():
  expected = {  # (d_model, heads, layers, mlp) of the public T5.1.1 checkpoints
      'small': (512, 6, 8, 1024), 'base': (768, 12, 12, 2048), 'large': (1024, 16, 24, 2816),
      'xl': (2048, 32, 24, 5120), 'xxl': (4096, 64, 24, 10240)}
  for name, (d, h, layers, mlp) in expected.items():
    c = PRESETS[name]
    assert (c.emb_dim, c.num_heads, c.num_encoder_layers, c.num_decoder_layers, c.mlp_dim) == (
        d, h, layers, layers, mlp)
    assert c.head_dim == 64 and c.vocab_size == 32128 and c.num_kv_heads == h


def test_draft_preset_is_ten_to_twenty_times_cheaper_than_target_preset():
  ratio = decoder_flops_per_token(PRESETS['mini']) / decoder_flops_per_token(PRESETS['nano'])
  assert 10 <= ratio <= 20


def test_json_round_trip_and_bad_fields():
  config = preset('mini', num_kv_heads=2, dtype='bfloat16')
  assert T5Config.from_json(config.to_json()) == config
  with pytest.raises(ValueError, match='unknown T5Config fields'):
    T5Config.from_dict({'emb_dim': 8, 'n_heads': 2})
  with pytest.raises(ValueError, match='not valid JSON'):
    T5Config.from_json('{"emb_dim": ')
  with pytest.raises(ValueError, match='dtype'):
    T5Config(dtype='float8')
  with pytest.raises(ValueError, match='unknown model preset'):
    preset('huge')
  with pytest.raises(ValueError, match='num_kv_heads must be a positive integer'):
    T5Config(num_kv_heads=0)


@pytest.mark.parametrize('field, value, message', [
    # issue 61, case 10: a config.json written by hand
    ('dropout_rate', '0.1', "dropout_rate must be a finite number, got '0.1' (a string)"),
    ('logits_via_embedding', 'false',
     "logits_via_embedding must be true or false, got 'false' (a string)"),
    ('num_kv_heads', '2', "num_kv_heads must be an integer or null, got '2' (a string)"),
    ('emb_dim', 64.0, 'emb_dim must be an integer, got 64.0 (a number)'),
    ('num_heads', True, 'num_heads must be an integer, got True (a boolean)'),
    ('mlp_activations', 'gelu', "mlp_activations must be a list of strings, got 'gelu'"),
    ('mlp_activations', ['gelu', 1], 'mlp_activations must be a list of strings'),
    ('dtype', ['float32'], "dtype must be a string, got ['float32'] (a list)"),
    ('layer_norm_epsilon', float('nan'), 'layer_norm_epsilon must be a finite number, got nan'),
    ('layer_norm_epsilon', 0, 'layer_norm_epsilon must be > 0, got 0'),
    ('scan_layers', 1, 'scan_layers must be true or false, got 1 (an integer)'),
    ('remat_policy', None, 'remat_policy must be a string, got None (null)'),
])
def test_every_field_is_checked_for_type(field, value, message):
  config = preset('nano').to_dict()
  config[field] = value
  with pytest.raises(ValueError, match=re.escape(f'T5Config.{message}')):
    T5Config.from_json(json.dumps(config))


def test_every_field_has_a_type_check():
  """Each field of T5Config refuses a value of another JSON type (a string where a number or a
  boolean belongs; a number where a string does), so no field is left out of `check_types`."""
  for field in dataclasses.fields(T5Config):
    config = preset('nano').to_dict()
    config[field.name] = {} if isinstance(config[field.name], str) else 'x'
    with pytest.raises(ValueError, match=f'^T5Config.{field.name} must be '):
      T5Config.from_dict(config)


def test_a_wrong_type_in_a_checkpoint_is_one_line(tmp_path):
  """`gqa-spec generate --model M` whose config.json says `"dropout_rate": "0.1"`: exit 2 and one
  line naming the file and the field, not a comparison's TypeError."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  model = tmp_path / 'model'
  (model / 'params').mkdir(parents=True)
  config = preset('nano').to_dict()
  config['dropout_rate'] = '0.1'
  (model / 'config.json').write_text(json.dumps(config))
  (tmp_path / 'in.jsonl').write_text('{"input_ids": [5, 1]}\n')
  result = subprocess.run([sys.executable, '-m', 'gqa_spec', 'generate', '--model', str(model),
                           '--inputs', str(tmp_path / 'in.jsonl'), '--out',
                           str(tmp_path / 'o.jsonl')], capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      f"gqa-spec: error: {model}/config.json: corrupt model config: T5Config.dropout_rate must be "
      "a finite number, got '0.1' (a string)"]
