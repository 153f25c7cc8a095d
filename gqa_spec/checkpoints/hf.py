"""HF transformers T5 (T5.1.1) checkpoints: import into our parameter tree and export back.

An HF directory holds `config.json` and `model.safetensors` (or `pytorch_model.bin`, or sharded
versions with an `*.index.json`); `spiece.model`, when present, is the vocabulary. Torch is needed
only to read `pytorch_model.bin` (loaded with `weights_only=True`).

Name map, HF -> ours (HF torch `Linear.weight` is `[out, in]`, our kernels are `[in, out]`):
  shared.weight [V, d]                          token_embedder/embedding [V, d]
  S.block.0.layer.0.SelfAttention.
      relative_attention_bias.weight [32, H]    S/relpos_bias/rel_embedding [H, 32]  (S: stack)
  encoder.block.i.layer.0.SelfAttention.q|k|v|o encoder/layers_i/attention/query|key|value|out
  encoder.block.i.layer.0|1.layer_norm          encoder/layers_i/pre_attention|mlp_layer_norm
  encoder.block.i.layer.1.DenseReluDense.X      encoder/layers_i/mlp/X  (X: wi_0, wi_1, wo)
  decoder.block.i.layer.0.SelfAttention         decoder/layers_i/self_attention
  decoder.block.i.layer.1.EncDecAttention       decoder/layers_i/encoder_decoder_attention
  decoder.block.i.layer.2.DenseReluDense        decoder/layers_i/mlp
  S.final_layer_norm                            S/S_norm
  lm_head.weight [V, d]                         decoder/logits_dense/kernel [d, V]

HF's T5 is multi-head only, so exporting a GQA/MQA model repeats each K/V head over its group
(`convert.repeat_kv_heads`); HF then computes exactly our function.

Tied logits. transformers 5 always ties `lm_head` to `shared` in a fresh model and saves only
`shared.weight`; whether the decoder output is scaled by d**-0.5 (original T5) is the config's
`scale_decoder_outputs` (older configs: `tie_word_embeddings`, True by default). So:
  not scaled, `lm_head.weight` stored (T5.1.1)  -> untied `logits_dense`
  not scaled, no `lm_head.weight`               -> `logits_dense` = `shared.T` (same function)
  scaled, no or equal `lm_head.weight` (T5)     -> `logits_via_embedding=True`
  scaled, a different `lm_head.weight`          -> rejected: no T5 variant computes that
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from gqa_spec import atomic
from gqa_spec.checkpoints.native import cast_params, check_params
from gqa_spec.models import layout
from gqa_spec.convert import repeat_kv_heads
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config

Params = Any

HF_VOCAB_FILE = 'spiece.model'

# HF activation name (`dense_act_fn`) -> ours.
_ACTIVATIONS = {'gelu_new': 'gelu', 'gelu_pytorch_tanh': 'gelu', 'gelu': 'gelu_exact',
                'relu': 'relu', 'silu': 'silu', 'swish': 'silu'}
# Ours -> HF `feed_forward_proj`, gated and not. HF reads 'gated-gelu' as tanh GELU, so a gated
# exact GELU has no HF name.
_HF_GATED = {'gelu': 'gated-gelu', 'relu': 'gated-relu', 'silu': 'gated-silu'}
_HF_PLAIN = {'gelu': 'gelu_new', 'gelu_exact': 'gelu', 'relu': 'relu', 'silu': 'silu'}

_ATTENTION = {'query': 'q', 'key': 'k', 'value': 'v', 'out': 'o'}


def config_from_hf(hf: Mapping[str, Any], param_dtype: str = 'float32',
                   has_lm_head: bool = True) -> T5Config:
  """Maps an HF `T5Config` dict (config.json) to ours; rejects what we cannot compute exactly.

  Args:
    hf: the parsed config.json.
    param_dtype: parameter dtype of the result.
    has_lm_head: whether the weights hold a separate `lm_head.weight` (see the module docstring).

  Returns:
    The equivalent `T5Config`.
  """
  if hf.get('model_type', 't5') != 't5':
    raise UserError(f'model_type {hf.get("model_type")!r} is not T5')
  proj = str(hf.get('feed_forward_proj', 'relu'))
  parts = proj.split('-')
  gated = len(parts) == 2 and parts[0] == 'gated'
  if len(parts) > 2 or (len(parts) == 2 and not gated):
    raise UserError(f'unsupported feed_forward_proj {proj!r}')
  act = 'gelu_new' if proj == 'gated-gelu' else parts[-1]
  if act not in _ACTIVATIONS:
    raise UserError(f'unsupported feed_forward_proj {proj!r}: activation {act!r} has no '
                    f'equivalent here (known: {sorted(_ACTIVATIONS)})')
  activations = (_ACTIVATIONS[act], 'linear') if gated else (_ACTIVATIONS[act],)
  scaled = hf.get('scale_decoder_outputs')
  if scaled is None:
    scaled = hf.get('tie_word_embeddings', True) is not False
  if scaled and has_lm_head:
    raise UserError('config.json scales the decoder output (tied embeddings) but the weights hold '
                    'a separate lm_head.weight: not a T5 or T5.1.1 model')
  try:
    num_layers = int(hf['num_layers'])
    return T5Config(
        vocab_size=int(hf['vocab_size']), emb_dim=int(hf['d_model']),
        num_heads=int(hf['num_heads']), head_dim=int(hf['d_kv']), mlp_dim=int(hf['d_ff']),
        num_encoder_layers=num_layers,
        num_decoder_layers=int(hf.get('num_decoder_layers') or num_layers),
        dropout_rate=float(hf.get('dropout_rate', 0.1)), mlp_activations=activations,
        param_dtype=param_dtype,
        relative_attention_num_buckets=int(hf.get('relative_attention_num_buckets', 32)),
        relative_attention_max_distance=int(hf.get('relative_attention_max_distance', 128)),
        logits_via_embedding=bool(scaled),
        layer_norm_epsilon=float(hf.get('layer_norm_epsilon', 1e-6)))
  except KeyError as e:
    raise UserError(f'HF config.json lacks {e.args[0]!r}') from None
  except (TypeError, ValueError) as e:
    raise UserError(f'HF config.json does not describe a valid T5 model: {e}') from None


def config_to_hf(config: T5Config) -> Dict[str, Any]:
  """Our config as an HF T5 config.json (multi-head: HF T5 has no grouped K/V)."""
  activations = config.mlp_activations
  if len(activations) == 2 and activations[1] == 'linear':
    proj = _HF_GATED.get(activations[0])
  else:
    proj = _HF_PLAIN.get(activations[0]) if len(activations) == 1 else None
  if proj is None:
    raise UserError(f'mlp_activations {activations} have no HF T5 equivalent')
  return {
      'architectures': ['T5ForConditionalGeneration'], 'model_type': 't5',
      'vocab_size': config.vocab_size, 'd_model': config.emb_dim, 'd_kv': config.head_dim,
      'd_ff': config.mlp_dim, 'num_layers': config.num_encoder_layers,
      'num_decoder_layers': config.num_decoder_layers, 'num_heads': config.num_heads,
      'relative_attention_num_buckets': config.relative_attention_num_buckets,
      'relative_attention_max_distance': config.relative_attention_max_distance,
      'dropout_rate': config.dropout_rate, 'layer_norm_epsilon': config.layer_norm_epsilon,
      'initializer_factor': 1.0, 'feed_forward_proj': proj,
      'tie_word_embeddings': config.logits_via_embedding, 'is_encoder_decoder': True,
      'decoder_start_token_id': 0, 'pad_token_id': 0, 'eos_token_id': 1, 'use_cache': True,
  }


def _mlp_names(config: T5Config):
  return ('wi_0', 'wi_1', 'wo') if len(config.mlp_activations) > 1 else ('wi', 'wo')


def _layer_map(config: T5Config):
  """Yields `(our path, HF name, kind)`, kind 'linear' (transpose), 'norm' or 'relpos'."""
  yield ('token_embedder', 'embedding'), 'shared.weight', 'embed'
  for stack, layers in (('encoder', config.num_encoder_layers),
                        ('decoder', config.num_decoder_layers)):
    yield ((stack, 'relpos_bias', 'rel_embedding'),
           f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight', 'relpos')
    yield (stack, f'{stack}_norm', 'scale'), f'{stack}.final_layer_norm.weight', 'norm'
    if stack == 'encoder':
      blocks = (('attention', 'SelfAttention', 'pre_attention_layer_norm'),)
    else:
      blocks = (('self_attention', 'SelfAttention', 'pre_self_attention_layer_norm'),
                ('encoder_decoder_attention', 'EncDecAttention', 'pre_cross_attention_layer_norm'))
    for i in range(layers):
      ours, hf = (stack, f'layers_{i}'), f'{stack}.block.{i}.layer'
      for j, (attention, hf_attention, norm) in enumerate(blocks):
        yield ours + (norm, 'scale'), f'{hf}.{j}.layer_norm.weight', 'norm'
        for name, hf_name in _ATTENTION.items():
          yield (ours + (attention, name, 'kernel'),
                 f'{hf}.{j}.{hf_attention}.{hf_name}.weight', 'linear')
      j = len(blocks)
      yield ours + ('pre_mlp_layer_norm', 'scale'), f'{hf}.{j}.layer_norm.weight', 'norm'
      for name in _mlp_names(config):
        yield ours + ('mlp', name, 'kernel'), f'{hf}.{j}.DenseReluDense.{name}.weight', 'linear'
  if not config.logits_via_embedding:
    yield ('decoder', 'logits_dense', 'kernel'), 'lm_head.weight', 'linear'


def _set(tree: dict, path, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: Params, path):
  for key in path:
    tree = tree[key]
  return np.asarray(tree)


def params_from_hf(state: Mapping[str, np.ndarray], config: T5Config) -> Params:
  """HF state dict (numpy, float) -> our parameter tree in `config.param_dtype` and layout."""
  state = dict(state)
  if 'lm_head.weight' not in state and not config.logits_via_embedding:
    state['lm_head.weight'] = state.get('shared.weight')  # tied but unscaled: same function
  params = {}
  for path, name, kind in _layer_map(config):
    value = state.get(name)
    if value is None:
      raise UserError(f'HF weights lack {name} (needed for {"/".join(path)})')
    _set(params, path, value.T if kind in ('linear', 'relpos') else value)
  check_params(params, config.replace(scan_layers=False), 'HF weights')
  return layout.to_layout(cast_params(params, config), config.scan_layers)


def params_to_hf(params: Params, config: T5Config) -> Dict[str, np.ndarray]:
  """Our parameters -> HF state dict, K/V heads repeated to multi-head.

  The `{en,de}coder.embed_tokens.weight` aliases of `shared.weight` are left out (HF ties them).
  Either layer layout exports to HF's one block per layer.
  """
  check_params(params, config, 'parameters to export')
  params = layout.unstack_layers(params)
  state = {}
  for path, name, kind in _layer_map(config):
    value = _get(params, path)
    if path[0] == 'decoder' and path[-2] in ('key', 'value'):
      value = repeat_kv_heads(value, config.head_dim, config.num_heads)  # [d, H*hd]
    state[name] = np.ascontiguousarray(value.T if kind in ('linear', 'relpos') else value)
  return state


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f'{path}: unreadable JSON: {e}') from None
  if not isinstance(data, dict):
    raise UserError(f'{path}: expected a JSON object')
  return data


def _weight_files(hf_dir: str):
  """The weight files to read and their format, 'safetensors' or 'torch'."""
  for base, kind in (('model.safetensors', 'safetensors'), ('pytorch_model.bin', 'torch')):
    if os.path.isfile(os.path.join(hf_dir, base)):
      return [os.path.join(hf_dir, base)], kind
    index = os.path.join(hf_dir, base + '.index.json')
    if os.path.isfile(index):
      weight_map = _read_json(index).get('weight_map')
      if not isinstance(weight_map, dict):
        raise UserError(f'{index}: no weight_map')
      return [os.path.join(hf_dir, f) for f in sorted(set(weight_map.values()))], kind
  raise UserError(f'{hf_dir}: no model.safetensors or pytorch_model.bin (nor a sharded index)')


def _read_weights(files, kind: str) -> Dict[str, np.ndarray]:
  state = {}
  for path in files:
    try:
      if kind == 'safetensors':
        from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
        state.update(load_file(path))
      else:
        state.update(_read_torch(path))
    except UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except; both readers raise assorted types
      raise UserError(f'{path}: unreadable weights ({type(e).__name__}: {e})') from None
  return state


def _read_torch(path: str) -> Dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError(f'{path}: reading pytorch_model.bin needs torch (pip install torch)') from None
  state = torch.load(path, map_location='cpu', weights_only=True)
  if not isinstance(state, dict):
    raise UserError(f'{path}: not a state dict')
  # numpy has no bfloat16: upcast torch's bf16 to float32 (exact); cast_params sets the dtype.
  return {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in state.items()
          if isinstance(v, torch.Tensor)}


def load_hf(hf_dir: str, param_dtype: str = 'float32',
            scan_layers: bool = False) -> Tuple[T5Config, Params, Optional[str]]:
  """Reads an HF T5 checkpoint directory.

  Args:
    hf_dir: directory with config.json and the weights.
    param_dtype: parameter dtype of the result ('float32', 'bfloat16').
    scan_layers: give the result the scanned layer layout (`T5Config.scan_layers`).

  Returns:
    `(config, params, vocab_path)`; `vocab_path` is its `spiece.model`, or None.
  """
  if not os.path.isdir(hf_dir):
    raise UserError(f'{hf_dir}: HF checkpoint directory not found')
  config_path = os.path.join(hf_dir, 'config.json')
  if not os.path.isfile(config_path):
    raise UserError(f'{config_path}: missing; not an HF checkpoint directory')
  hf_config = _read_json(config_path)
  state = _read_weights(*_weight_files(hf_dir))
  has_lm_head = 'lm_head.weight' in state and not (
      'shared.weight' in state and np.array_equal(state['lm_head.weight'], state['shared.weight']))
  config = config_from_hf(hf_config, param_dtype, has_lm_head).replace(scan_layers=scan_layers)
  params = params_from_hf(state, config)
  vocab = os.path.join(hf_dir, HF_VOCAB_FILE)
  return config, params, vocab if os.path.isfile(vocab) else None


def save_hf(hf_dir: str, config: T5Config, params: Params, vocab_path: Optional[str] = None,
            overwrite: bool = False) -> None:
  """Writes an HF T5 checkpoint: config.json, model.safetensors (float32), spiece.model.

  Args:
    hf_dir: output directory; must not exist unless `overwrite`.
    config: our config (any num_kv_heads: K/V heads are repeated for HF).
    params: our parameters.
    vocab_path: optional SentencePiece model copied to `spiece.model`.
    overwrite: replace an existing directory.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  hf_config = config_to_hf(config)
  state = params_to_hf(params, config)
  if os.path.exists(hf_dir) and not overwrite:
    raise UserError(f'{hf_dir}: output directory already exists (pass --overwrite to replace it)')
  with atomic.directory(hf_dir) as tmp:  # renamed to hf_dir when complete
    weights = os.path.join(tmp, 'model.safetensors')
    try:
      save_file({k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}, weights,
                metadata={'format': 'pt'})
    except Exception as e:  # pylint: disable=broad-except; SafetensorError: the errno in its text
      code = re.search(r'\(os error (\d+)\)', str(e))
      if not code:
        raise
      raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), weights) from e
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(weights, 0o666 & ~umask)  # safetensors writes 0600; the mode of the files beside it
    atomic.write_json(os.path.join(tmp, 'config.json'), hf_config, indent=2, sort_keys=True)
    if vocab_path is not None:
      shutil.copyfile(vocab_path, os.path.join(tmp, HF_VOCAB_FILE))
