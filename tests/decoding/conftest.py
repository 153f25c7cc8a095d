"""Tiny random-init T5 models shared by the decoding tests (module-level caches keep compiles few),
and `TableDecoder`, a stub target / draft of fixed next-token tables."""

import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

VOCAB = 32
MAX_LEN = 10

# A ragged batch of 4: different input lengths (0 = padding, 1 = EOS).
INPUTS = np.array([[5, 6, 7, 8, 9, 10, 1, 0],
                   [3, 4, 5, 1, 0, 0, 0, 0],
                   [9, 9, 8, 7, 6, 5, 4, 1],
                   [12, 1, 0, 0, 0, 0, 0, 0]], np.int32)


def tiny_config(num_kv_heads, **overrides):
  base = dict(vocab_size=VOCAB, emb_dim=32, num_heads=4, num_kv_heads=num_kv_heads, head_dim=8,
              mlp_dim=64, num_encoder_layers=1, num_decoder_layers=2)
  base.update(overrides)
  return T5Config(**base)


@functools.partial(jax.jit, static_argnames=('model',))
def _init(model, rng):
  tokens = jnp.asarray(INPUTS)
  return model.init(rng, tokens, tokens[:, :3], tokens[:, :3], enable_dropout=False)['params']


@functools.lru_cache(maxsize=None)
def model_and_params(num_kv_heads, seed=0, **overrides):
  model = Transformer(tiny_config(num_kv_heads, **overrides))
  params = _init(model, jax.random.PRNGKey(seed))
  # Sharpen the output distribution (random init is near uniform) so greedy paths are stable and
  # agreement between perturbed copies is partial rather than accidental.
  params = jax.tree_util.tree_map(lambda x: x, params)
  params['decoder']['logits_dense']['kernel'] = params['decoder']['logits_dense']['kernel'] * 4.0
  return model, params


def perturbed(params, scale, seed=1):
  leaves, treedef = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return jax.tree_util.tree_unflatten(treedef, noisy)


def batch_lengths(rows, length):
  """`theory.Lengths` of one batch of `rows` rows that each need `length` tokens."""
  return ((float(length),) * rows,)


class FakeClock:
  """Each reading one second after the one before: every timed run reads as exactly 1 s, so the
  calibration's times are functions of its programs' iteration counts, not of this machine."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    self.now += 1.0
    return self.now


@flax.struct.dataclass
class TableState:
  table: jax.Array  # [T, V, V] next-token logits by (position, current token)
  tokens: jax.Array  # [b, L] tokens fed so far (slot = position)
  cache_index: jax.Array  # [b]


@dataclasses.dataclass(frozen=True)
class TableDecoder:
  """Stub decoder: logits of the token at position t are `table[min(t, T-1), token]`."""

  def init(self, table: jax.Array, batch: int, cache_length: int) -> TableState:
    return TableState(table=jnp.asarray(table, jnp.float32),
                      tokens=jnp.zeros((batch, cache_length), jnp.int32),
                      cache_index=jnp.zeros((batch,), jnp.int32))

  def tokens_to_logits(self, state: TableState, tokens: jax.Array, positions=None, mask=None):
    del mask  # the table conditions on the current token only
    if positions is None:
      positions = state.cache_index[:, None] + jnp.arange(tokens.shape[1], dtype=jnp.int32)
    pos = jnp.minimum(positions, state.table.shape[0] - 1)  # [b, k]
    written = jax.vmap(lambda row, new, i: jax.lax.dynamic_update_slice(row, new, (i,)))(
        state.tokens, tokens.astype(jnp.int32), state.cache_index)  # [b, L]
    return state.table[pos, tokens], state.replace(  # [b, k, V]
        tokens=written, cache_index=state.cache_index + tokens.shape[1])

  def rollback(self, state: TableState, index: jax.Array) -> TableState:
    return state.replace(cache_index=jnp.asarray(index, jnp.int32))

  def index(self, state: TableState) -> jax.Array:
    return state.cache_index

  def cache_length(self, state: TableState) -> int:
    return state.tokens.shape[1]

  def move_slots(self, state: TableState, start: jax.Array, source: jax.Array) -> TableState:
    moved = jnp.take_along_axis(state.tokens, source, axis=1)  # [b, P]
    return state.replace(tokens=jax.vmap(lambda row, upd, i: jax.lax.dynamic_update_slice(
        row, upd, (i,)))(state.tokens, moved, start))

  def reorder(self, state: TableState, rows: jax.Array) -> TableState:
    return state.replace(tokens=state.tokens[rows], cache_index=state.cache_index[rows])
