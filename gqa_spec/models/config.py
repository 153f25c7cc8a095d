"""T5.1.1 model configuration and presets.

`T5Config` is a frozen dataclass (as flaxformer's `t5_1_1.py` presets) so a config can be a static
argument of `jax.jit` and be saved as JSON beside a checkpoint. `num_kv_heads` is the GQA knob: it
sets the number of key/value heads of the decoder's self- and encoder-decoder attention (the encoder
always stays multi-head): `num_kv_heads == num_heads` is MHA, `1` is MQA, anything between is GQA-G.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import typing
from typing import Any, Optional, Sequence

import jax.numpy as jnp

_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyper-parameters of a T5.1.1 encoder-decoder.

  Attributes:
    vocab_size: size of the (input and output) vocabulary.
    emb_dim: model width d_model.
    num_heads: query heads H, in every attention layer.
    num_kv_heads: key/value heads G of the decoder's self- and cross-attention; None means H.
    head_dim: per-head width (T5.1.1 uses 64 at every size).
    mlp_dim: hidden width of the gated MLP.
    num_encoder_layers: encoder depth.
    num_decoder_layers: decoder depth.
    dropout_rate: dropout after embeddings, attention, MLP and final norm (T5: 0.1 fine-tuning, 0 pre-training).
    mlp_activations: activations of the gated MLP; ('gelu', 'linear') is T5.1.1's gated-GELU.
    dtype: activation dtype name ('float32' or 'bfloat16').
    param_dtype: parameter dtype name.
    relative_attention_num_buckets: relative position buckets (T5: 32).
    relative_attention_max_distance: distance where the log buckets end (T5: 128).
    logits_via_embedding: tie the output logits to the input embedding (False in T5.1.1).
    float32_attention_logits: compute attention logits and softmax in float32.
    layer_norm_epsilon: RMSNorm epsilon.
    scan_layers: run each stack's layers as one `nn.scan` (parameters and decode cache stacked on a
      `layers` axis, `encoder/layers/...`) instead of a Python loop (`encoder/layers_0/...`): same
      function, compile time independent of depth (`models/layout.py` converts between the two).
    remat_policy: what the backward pass of training keeps per layer: 'none' (everything),
      'minimal' (dots without batch dimensions; the rest is recomputed) or 'full' (only the layer's
      inputs). Inference ignores it.
  """

  vocab_size: int = 32128
  emb_dim: int = 512
  num_heads: int = 6
  num_kv_heads: Optional[int] = None
  head_dim: int = 64
  mlp_dim: int = 1024
  num_encoder_layers: int = 8
  num_decoder_layers: int = 8
  dropout_rate: float = 0.0
  mlp_activations: Sequence[str] = ('gelu', 'linear')
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  logits_via_embedding: bool = False
  float32_attention_logits: bool = True
  layer_norm_epsilon: float = 1e-6
  scan_layers: bool = False
  remat_policy: str = 'none'

  def __post_init__(self):
    check_types(self)
    object.__setattr__(self, 'mlp_activations', tuple(self.mlp_activations))
    if self.num_kv_heads is None:
      object.__setattr__(self, 'num_kv_heads', self.num_heads)
    for name in ('vocab_size', 'emb_dim', 'num_heads', 'num_kv_heads', 'head_dim', 'mlp_dim',
                 'num_encoder_layers', 'num_decoder_layers', 'relative_attention_num_buckets',
                 'relative_attention_max_distance'):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f'T5Config.{name} must be a positive integer, got {value!r}')
    if self.num_heads % self.num_kv_heads != 0:
      raise ValueError(
          f'num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}: '
          'grouped-query attention needs every group to hold the same number of query heads')
    if not self.layer_norm_epsilon > 0:
      raise ValueError(f'T5Config.layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon!r}')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate!r}')
    for name in ('dtype', 'param_dtype'):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f'T5Config.{name} must be one of {sorted(_DTYPES)}, got {getattr(self, name)!r}')
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f'T5Config.scan_layers must be True or False, got {self.scan_layers!r}')
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f'T5Config.remat_policy must be one of {list(REMAT_POLICIES)}, '
                       f'got {self.remat_policy!r}')
    for act in self.mlp_activations:
      if act not in _ACTIVATIONS:
        raise ValueError(f'unknown MLP activation {act!r}; known: {sorted(_ACTIVATIONS)}')

  @property
  def queries_per_kv_head(self) -> int:
    return self.num_heads // self.num_kv_heads

  @property
  def activation_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def parameter_dtype(self):
    return _DTYPES[self.param_dtype]

  def replace(self, **changes: Any) -> 'T5Config':
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d['mlp_activations'] = list(self.mlp_activations)
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict) -> 'T5Config':
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f'unknown T5Config fields {unknown}; known fields: {sorted(known)}')
    return cls(**d)

  @classmethod
  def from_json(cls, text: str) -> 'T5Config':
    try:
      d = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f'model config is not valid JSON: {e}') from None
    if not isinstance(d, dict):
      raise ValueError('model config JSON must be an object')
    return cls.from_dict(d)


def check_types(config) -> None:
  """Raises `ValueError` naming the first field of the dataclass `config` whose value is not of
  its annotated type: `T5Config.dropout_rate must be a number, got '0.1' (a string)`.

  A config.json written by hand holds JSON types: `"0.1"` is no number and `"false"` no boolean
  (Python reads that string as true). Integers are numbers; booleans are neither; floats are
  finite.
  """
  hints = typing.get_type_hints(type(config))
  for field in dataclasses.fields(config):
    value, expected = getattr(config, field.name), hints[field.name]
    if not _has_type(value, expected):
      got = {bool: 'a boolean', float: 'a number', type(None): 'null'}.get(type(value))
      raise ValueError(f'{type(config).__name__}.{field.name} must be {_describe(expected)}, got '
                       f'{value!r} ({got or _describe(type(value))})')


def _has_type(value, expected) -> bool:
  origin, args = typing.get_origin(expected), typing.get_args(expected)
  if origin is typing.Union:
    return any(_has_type(value, arg) for arg in args)
  if origin is not None:  # Sequence[str]: a list or tuple of them, not a string
    return (isinstance(value, (list, tuple)) and
            all(_has_type(item, args[0]) for item in value))
  if expected is type(None):
    return value is None
  if expected is bool:
    return isinstance(value, bool)
  if expected is int:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
  if expected is float:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool) and
            math.isfinite(value))
  return isinstance(value, expected)


def _describe(kind) -> str:
  origin, args = typing.get_origin(kind), typing.get_args(kind)
  if origin is typing.Union:
    return ' or '.join(_describe(arg) for arg in args)
  if origin is not None:
    return f'a list of {_describe(args[0])[2:]}s'
  return {bool: 'true or false', int: 'an integer', float: 'a finite number', str: 'a string',
          type(None): 'null', list: 'a list', dict: 'an object', tuple: 'a list'}.get(
              kind, f'a {getattr(kind, "__name__", kind)}')


REMAT_POLICIES = ('none', 'minimal', 'full')
_ACTIVATIONS = ('gelu', 'linear', 'relu', 'silu', 'gelu_exact')

# Vocabulary of the CPU presets: an 8000-piece SentencePiece model plus T5's 100 sentinels, rounded up
# to a multiple of 128 as T5 does (32000 + 100 -> 32128).
CPU_VOCAB_SIZE = 8192

PRESETS = {
    # CPU-scale presets. `mini` is the target-sized model, `nano` the draft-sized one: per generated
    # token nano's decoder does ~11x fewer FLOPs than mini's (see tests/models/test_config.py).
    'nano': T5Config(vocab_size=CPU_VOCAB_SIZE, emb_dim=64, num_heads=4, head_dim=16, mlp_dim=128,
                     num_encoder_layers=2, num_decoder_layers=2),
    'mini': T5Config(vocab_size=CPU_VOCAB_SIZE, emb_dim=256, num_heads=8, head_dim=32, mlp_dim=1024,
                     num_encoder_layers=4, num_decoder_layers=4),
    # Between the two: mini's 8 heads and 4 + 4 layers (so every GQA grouping of the study exists)
    # at half its width, ~1/4 of its non-embedding FLOPs. The calibration's target-size sweep
    # compares it with mini at equal training time.
    'micro': T5Config(vocab_size=CPU_VOCAB_SIZE, emb_dim=128, num_heads=8, head_dim=16, mlp_dim=512,
                      num_encoder_layers=4, num_decoder_layers=4),
    # The public T5.1.1 sizes (t5x/examples/t5/t5_1_1/*.gin).
    'small': T5Config(emb_dim=512, num_heads=6, head_dim=64, mlp_dim=1024,
                      num_encoder_layers=8, num_decoder_layers=8),
    'base': T5Config(emb_dim=768, num_heads=12, head_dim=64, mlp_dim=2048,
                     num_encoder_layers=12, num_decoder_layers=12),
    'large': T5Config(emb_dim=1024, num_heads=16, head_dim=64, mlp_dim=2816,
                      num_encoder_layers=24, num_decoder_layers=24),
    'xl': T5Config(emb_dim=2048, num_heads=32, head_dim=64, mlp_dim=5120,
                   num_encoder_layers=24, num_decoder_layers=24),
    'xxl': T5Config(emb_dim=4096, num_heads=64, head_dim=64, mlp_dim=10240,
                    num_encoder_layers=24, num_decoder_layers=24),
}


def preset(name: str, **overrides: Any) -> T5Config:
  """Returns the named preset, with fields overridden."""
  if name not in PRESETS:
    raise ValueError(f'unknown model preset {name!r}; known presets: {sorted(PRESETS)}')
  return PRESETS[name].replace(**overrides)


def decoder_flops_per_token(config: T5Config, encoder_length: int = 0, decoded_length: int = 0) -> int:
  """Multiply-adds of one decoder step (projections, MLP, logits; attention scores over lengths)."""
  d, h, g, hd = config.emb_dim, config.num_heads, config.num_kv_heads, config.head_dim
  per_layer = (
      d * h * hd * 2 + d * g * hd * 2  # self-attention q, o and k, v
      + d * h * hd * 2  # cross-attention q, o (k, v are cached once per input)
      + d * config.mlp_dim * len(config.mlp_activations) + config.mlp_dim * d
      + h * hd * 2 * (decoded_length + encoder_length))
  return per_layer * config.num_decoder_layers + d * config.vocab_size
