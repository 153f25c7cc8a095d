"""The decoder interface the decoding loops drive, and its T5 binding.

A decoder is a hashable, static object (a `jax.jit` static argument) whose methods act on an
explicit state pytree (parameters + cache):

  tokens_to_logits(state, tokens [b, k], positions=None, mask=None) -> (logits [b, k, V], state)
      append k >= 1 tokens at each row's index, advance the index by k;
  rollback(state, index [b]) -> state      move each row's index (back: forget what came after);
  index(state) -> [b]                      tokens cached per row;
  cache_length(state) -> int               slots (static);
  move_slots(state, start [b], source [b, P]) -> state
                                           copy slots source to start..start+P-1 (tree decoding);
  reorder(state, rows [b]) -> state        gather rows (beam search only);
  tokens_to_logits_and_hidden(...) -> (logits, hidden [b, k, D], state)   optional (Chimera).

`T5Decoder` binds `gqa_spec.models.decode_cache`; the tests drive the loops with a stub of fixed
next-token tables (`tests/decoding/conftest.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Protocol, Tuple

import flax
import jax
import jax.numpy as jnp

from gqa_spec.models import decode_cache
from gqa_spec.models.t5 import Transformer
from gqa_spec.decoding import xla_options

PyTree = Any


def cache_length(max_decode_len: int, call_tokens: int = 1) -> int:
  """The slots a target's cache needs so that no write clamps: one per output token, plus the
  overhang of the widest call past the last one (`call_tokens`: 1 autoregressive decoding,
  gamma + 1 a chain's verification, N + 1 an N-node tree's)."""
  return max_decode_len + call_tokens


class Decoder(Protocol):
  """Incremental decoder with a per-row, rollback-able index (see the module docstring)."""

  def tokens_to_logits(self, state: PyTree, tokens: jax.Array, positions: Optional[jax.Array] = None,
                       mask: Optional[jax.Array] = None) -> Tuple[jax.Array, PyTree]:
    ...

  def rollback(self, state: PyTree, index: jax.Array) -> PyTree:
    ...

  def index(self, state: PyTree) -> jax.Array:
    ...


@flax.struct.dataclass
class T5State:
  params: PyTree
  cache: PyTree


@dataclasses.dataclass(frozen=True)
class T5Decoder:
  """The T5 `Transformer`'s decoder with its decode cache."""

  model: Transformer

  def init(self, params: PyTree, encoder_input_tokens: jax.Array, cache_length: int) -> T5State:
    """Encodes `[b, S]` inputs once and creates a cache of `cache_length` slots (index 0). The
    state holds `params` themselves, not a copy (`t5_cache`)."""
    return T5State(params=params, cache=t5_cache(
        self.model, params, jnp.asarray(encoder_input_tokens, jnp.int32), cache_length))

  def tokens_to_logits(self, state: T5State, tokens: jax.Array, positions=None, mask=None):
    logits, cache = decode_cache.decode_tokens(self.model, state.params, state.cache, tokens,
                                               positions, mask)  # [b, k, V]
    return logits, self._with_cache(state, cache)

  def tokens_to_logits_and_hidden(self, state: T5State, tokens: jax.Array, positions=None,
                                  mask=None):
    """`tokens_to_logits` also returning the final hidden states `[b, k, emb]` (same pass)."""
    logits, hidden, cache = decode_cache.decode_tokens_with_hidden(
        self.model, state.params, state.cache, tokens, positions, mask)  # [b, k, V], [b, k, D]
    return logits, hidden, self._with_cache(state, cache)

  def rollback(self, state: T5State, index: jax.Array) -> T5State:
    return self._with_cache(state, decode_cache.set_cache_index(state.cache, index))

  def index(self, state: T5State) -> jax.Array:
    return decode_cache.cache_index(state.cache)

  def cache_length(self, state: T5State) -> int:
    return decode_cache.cache_length(state.cache)

  def move_slots(self, state: T5State, start: jax.Array, source: jax.Array) -> T5State:
    """Copies slots `source [b, P]` to `start [b] + 0..P-1` (tree decoding's path compaction)."""
    return self._with_cache(state, decode_cache.move_slots(state.cache, start, source))

  def reorder(self, state: T5State, rows: jax.Array) -> T5State:
    # Every cache leaf is batch-major (K/V, index, positions, encoder mask); params are not.
    return self._with_cache(state, jax.tree_util.tree_map(lambda x: x[rows], state.cache))

  def _with_cache(self, state: T5State, cache: PyTree) -> T5State:
    """`state` holding `cache`, as every method returns it (`mesh.MeshT5Decoder` places it)."""
    return state.replace(cache=cache)


@functools.partial(xla_options.jit, static_argnames=('model', 'cache_length'))
def t5_cache(model: Transformer, params: PyTree, encoder_input_tokens: jax.Array,
             cache_length: int) -> PyTree:
  """The decode cache of `[b, S]` inputs (their encoding, `cache_length` empty slots). Only the
  cache: a jitted function's outputs are new buffers, and when `init` returned the parameters
  from here too, every state held its own copy of them (every batch of a `generate` run)."""
  encoded = model.apply({'params': params}, encoder_input_tokens,
                        method=Transformer.encode)  # [b, S, emb]
  return decode_cache.init_decode_cache(model, params, encoded, encoder_input_tokens, cache_length)
