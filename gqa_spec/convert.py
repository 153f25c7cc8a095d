"""Multi-head -> grouped-query / multi-query checkpoint conversion (Ainslie et al. 2023, Sec. 2.1).

Only the key and value projections of the decoder's self- and encoder-decoder attention change;
the encoder, queries, outputs, MLPs and embeddings are untouched. Query head `h` belongs to K/V
group `h // R` with `R = H / G` (consecutive heads form a group, as `models/attention.py`
computes), so group `g` is built from source heads `g*R .. g*R + R - 1`:
  mean    mean-pool the R heads' K and V projection matrices (the paper's choice)
  first   keep the first head of each group, `g*R`
  random  discard them: fresh kernels from the model's own initialiser, seeded

`repeat_kv_heads` is the inverse map used by HF export: repeating every group's head R times gives
an MHA model that computes exactly the same function as the GQA one.
"""

from __future__ import annotations

from typing import Any, Tuple

import jax
import numpy as np

from gqa_spec.errors import UserError
from gqa_spec.models import layout
from gqa_spec.models.config import T5Config
from gqa_spec.models.layers import default_kernel_init

Params = Any

METHODS = ('mean', 'first', 'random')
DECODER_KV_ATTENTION = ('self_attention', 'encoder_decoder_attention')


def group_kv_heads(kernel: np.ndarray, head_dim: int, num_kv_heads: int, method: str) -> np.ndarray:
  """Pools `[d, H*hd]` K or V kernel columns into `[d, G*hd]`, R = H/G consecutive heads a group.

  Args:
    kernel: joined projection kernel `[d, H*hd]` (head h in columns `h*hd:(h+1)*hd`).
    head_dim: hd.
    num_kv_heads: G; must divide H.
    method: 'mean' or 'first'.

  Returns:
    `[d, G*hd]` kernel in the input's dtype.
  """
  d, width = kernel.shape
  heads = width // head_dim
  if heads % num_kv_heads:
    raise UserError(f'--kv-heads {num_kv_heads} does not divide the number of heads {heads}')
  grouped = np.asarray(kernel).reshape(d, num_kv_heads, heads // num_kv_heads,
                                       head_dim)  # [d, G, R, hd]
  if method == 'mean':
    # float64 keeps the mean exact when a group's heads are equal (e.g. 3a/3 == a).
    pooled = grouped.astype(np.float64).mean(axis=2)  # [d, G, hd]
  elif method == 'first':
    pooled = grouped[:, :, 0]  # [d, G, hd]
  else:
    raise UserError(f'unknown pooling method {method!r}; known: mean, first')
  return pooled.reshape(d, num_kv_heads * head_dim).astype(kernel.dtype)


def repeat_kv_heads(kernel: np.ndarray, head_dim: int, num_heads: int) -> np.ndarray:
  """`[d, G*hd]` -> `[d, H*hd]`: group g's head becomes heads `g*R .. g*R+R-1` (R = H/G)."""
  d, width = kernel.shape
  groups = width // head_dim
  if num_heads % groups:
    raise UserError(f'cannot repeat {groups} K/V heads into {num_heads} heads')
  heads = np.asarray(kernel).reshape(d, groups, 1, head_dim)  # [d, G, 1, hd]
  return np.broadcast_to(heads, (d, groups, num_heads // groups, head_dim)).reshape(
      d, num_heads * head_dim)


def convert_params(params: Params, config: T5Config, num_kv_heads: int, method: str,
                   seed: int = 0) -> Tuple[Params, T5Config]:
  """Converts the decoder attention of an MHA (or GQA) checkpoint to `num_kv_heads` K/V heads.

  Args:
    params: the flax 'params' tree of a model with `config`.
    config: its config; `config.num_kv_heads` must be a multiple of `num_kv_heads`.
    num_kv_heads: G of the result (H for MHA, 1 for MQA).
    method: 'mean', 'first' or 'random' (see the module docstring).
    seed: PRNG seed of 'random'.

  Returns:
    `(params, config)` of the converted model; leaves other than the decoder K/V kernels are the
    input's own arrays.
  """
  if method not in METHODS:
    raise UserError(f'unknown conversion method {method!r}; known: {", ".join(METHODS)}')
  if (not isinstance(num_kv_heads, int) or num_kv_heads < 1
      or config.num_heads % num_kv_heads):
    raise UserError(f'--kv-heads {num_kv_heads} must be a positive divisor of the number of heads '
                    f'{config.num_heads}')
  if config.num_kv_heads % num_kv_heads and method != 'random':
    raise UserError(f'cannot pool {config.num_kv_heads} K/V heads into {num_kv_heads} groups; '
                    'the target must divide the source (or use --method random)')
  new_config = config.replace(num_kv_heads=num_kv_heads)
  if num_kv_heads == config.num_kv_heads and method != 'random':
    return params, new_config
  rng = jax.random.PRNGKey(seed)
  params = layout.unstack_layers(params)  # layers by T5X name; restacked below when scanned
  decoder = dict(params['decoder'])
  for i in range(config.num_decoder_layers):
    layer = dict(decoder[f'layers_{i}'])
    for attention in DECODER_KV_ATTENTION:
      block = dict(layer[attention])
      for projection in ('key', 'value'):
        kernel = np.asarray(block[projection]['kernel'])  # [d, G_in*hd]
        if method == 'random':
          rng, key = jax.random.split(rng)
          shape = (kernel.shape[0], num_kv_heads * config.head_dim)
          new = np.asarray(default_kernel_init(key, shape, config.parameter_dtype))
        else:
          new = group_kv_heads(kernel, config.head_dim, num_kv_heads, method)
        block[projection] = {'kernel': new}  # [d, G*hd]
      layer[attention] = block
    decoder[f'layers_{i}'] = layer
  return layout.to_layout({**params, 'decoder': decoder}, config.scan_layers), new_config
