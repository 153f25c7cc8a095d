"""Partitioned inference: the decoding loops on a `data x model` mesh with explicit shardings.

The placement is the training's (`partitioning.Partitioner`): parameters as in training, the
decode cache with rows on `data` and K/V heads on `model` where G divides by it, else replicated.
`MeshT5Decoder` is `targets.T5Decoder` whose states are constrained to those shardings inside the
loops; a model draft gets its own (`draft_decoder`). `autoregressive`, `beam`, `speculative` and
`tree_speculative` run the library's jitted loops inside one `jax.jit` with explicit in / out
shardings, per-row outputs with rows on `data`. Results equal single-device decoding up to float
reassociation of model-sharded sums (`tests/decoding/test_mesh.py` checks token identity). With
several processes (`gqa_spec.distributed`) each process passes the same inputs; `shard_rows`
builds the global arrays from each process's rows.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from gqa_spec.decoding import autoregressive as ar_lib
from gqa_spec.decoding import beam_search as beam_lib
from gqa_spec.decoding import sampling
from gqa_spec.decoding import speculative as spec_lib
from gqa_spec.decoding import targets
from gqa_spec.decoding import tree_speculative as tree_lib
from gqa_spec.decoding import xla_options
from gqa_spec.decoding.targets import T5Decoder, T5State
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from gqa_spec.partitioning import Partitioner, logical_axis_rules, put

PyTree = Any
# Fields of the loops' results that hold one entry per row (rows on `data`); the rest replicate.
_PER_ROW = frozenset({'sequences', 'lengths', 'target_calls', 'proposed', 'accepted'})


@dataclasses.dataclass(frozen=True)
class MeshT5Decoder(T5Decoder):
  """`T5Decoder` whose parameters and cache live on `partitioner`'s mesh."""

  partitioner: Partitioner = None

  def __post_init__(self):
    if not isinstance(self.partitioner, Partitioner):
      raise ValueError(f'MeshT5Decoder needs a Partitioner, got {self.partitioner!r}')

  def state_shardings(self, state: T5State) -> T5State:
    """Shardings of a (possibly abstract or traced) state: parameters and cache by the rules."""
    part = self.partitioner
    return T5State(params=part.param_shardings(state.params),
                   cache=part.cache_shardings(state.cache))

  def init(self, params: PyTree, encoder_input_tokens: Any, cache_length: int) -> T5State:
    """Encodes `[b, S]` inputs (global rows, see `shard_rows`) and creates the cache on the mesh;
    the state holds the parameters as placed on the mesh, not a copy (`targets.t5_cache`)."""
    part = self.partitioner
    tokens = shard_rows(part, encoder_input_tokens)
    shardings = part.param_shardings(params)
    params = put(params, shardings)  # the same buffers where already placed so
    cache = _run(('init', self, cache_length),
                 lambda p, t: targets.t5_cache(self.model, p, t, cache_length),
                 (shardings, tokens.sharding), part.cache_shardings, (params, tokens))
    return T5State(params=params, cache=cache)

  def _with_cache(self, state: T5State, cache: PyTree) -> T5State:
    """Every new state constrained to the rules' shardings inside the loops."""
    state = state.replace(cache=cache)
    return jax.lax.with_sharding_constraint(state, self.state_shardings(state))


def params_partitioner(config: T5Config, params: PyTree) -> Optional[Partitioner]:
  """The partitioner of the `data x model` mesh `params` are sharded on (a sharded training
  run's), with `config`'s rules; None for unsharded or single-device parameters."""
  sharding = getattr(jax.tree_util.tree_leaves(params)[0], 'sharding', None)
  if (not isinstance(sharding, NamedSharding) or sharding.mesh.size == 1
      or tuple(sharding.mesh.axis_names) != ('data', 'model')):
    return None
  return Partitioner(sharding.mesh, logical_axis_rules(config, sharding.mesh.shape['model']))


def draft_decoder(config: T5Config, mesh: Mesh) -> MeshT5Decoder:
  """A T5 draft's decoder placed on `mesh` by its own config's rules (for any model draft:
  `ModelDraft`, `StagedDraft`, `TreeModelDraft`)."""
  rules = logical_axis_rules(config, mesh.shape['model'])
  return MeshT5Decoder(Transformer(config), Partitioner(mesh, rules))


def place_params(partitioner: Partitioner, params: PyTree) -> PyTree:
  """Parameters (host or device arrays) in their sharded layout; no copy where already there."""
  return put(params, partitioner.param_shardings(params))


def shard_rows(partitioner: Partitioner, rows: Any) -> jax.Array:
  """The whole batch `[n, ...]` (the same on every process, as `generate` and the evaluator read
  it) -> a global array with rows on `data` (replicated when `data` does not divide them); each
  process copies in only the rows its devices hold."""
  if isinstance(rows, jax.Array) and not rows.is_fully_addressable:
    return rows  # already global
  rows = np.asarray(rows)
  sharding = partitioner.rows_sharding(rows.shape[0], rows.ndim)
  return jax.make_array_from_callback(rows.shape, sharding, lambda index: rows[index])


_JITTED = {}  # one jitted function per (loop, statics, argument signature, compiler options)


def _result_shardings(partitioner: Partitioner, result: Any, rows: int) -> Any:
  """Per-row fields (`_PER_ROW`) with rows on `data`, everything else replicated."""
  def one(path, x):
    name = getattr(path[-1], 'name', None)
    if name in _PER_ROW or (name is None and x.ndim and x.shape[0] == rows):
      return partitioner.rows_sharding(rows, x.ndim)
    return partitioner.replicated
  return jax.tree_util.tree_map_with_path(one, result)


def _draft_shardings(partitioner: Partitioner, draft: Any, state: PyTree) -> PyTree:
  """A model draft's decoder state by its own decoder's rules (the whole state of a `ModelDraft`,
  the `decoder_state` field of a staged or tree draft's); everything else (other drafts' small
  states, a staged draft's bigram table and counters) replicated."""
  decoder = getattr(draft, 'decoder', None)
  if isinstance(decoder, MeshT5Decoder):
    if isinstance(state, T5State):
      return decoder.state_shardings(state)
    replicated = jax.tree_util.tree_map(lambda _: partitioner.replicated, state)
    return replicated.replace(decoder_state=decoder.state_shardings(state.decoder_state))
  return jax.tree_util.tree_map(lambda _: partitioner.replicated, state)


def _run(key, fn, in_shardings, out_fn, args):
  """`fn(*args)` jitted once per `key` and argument signature: the inputs placed by
  `in_shardings`, the outputs constrained to `out_fn(outputs)` inside the trace (so the loop is
  traced once, not again by an `eval_shape` for `out_shardings`)."""

  def placed(*inputs):
    outputs = fn(*inputs)
    return jax.lax.with_sharding_constraint(outputs, out_fn(outputs))

  leaves, treedef = jax.tree_util.tree_flatten(args)  # the argument signature
  key = key + (treedef, tuple((x.shape, str(x.dtype)) for x in leaves), xla_options.key())
  if key not in _JITTED:  # compiled once per key, like `jax.jit`
    _JITTED[key] = jax.jit(placed, in_shardings=in_shardings,
                           compiler_options=xla_options.current())
  outputs = _JITTED[key](*put(args, in_shardings))
  # XLA reports the constrained placement in its own words (size-1 axes and trailing Nones
  # dropped); labelled with the rules' specs again, the same buffers (no copy).
  return jax.device_put(outputs, out_fn(outputs))


def autoregressive(decoder: MeshT5Decoder, state: T5State, rng: jax.Array, *,
                   max_decode_len: int, config: sampling.SamplingConfig = sampling.GREEDY,
                   eos_id: int = ar_lib.EOS, skip=None,
                   loop_chunk: int = 1) -> ar_lib.DecodeResult:
  """`autoregressive.decode` on the mesh (same arguments); rows of the result on `data`."""
  return _loop(ar_lib.decode, decoder, state, None, None, rng, skip, max_decode_len=max_decode_len,
               config=config, eos_id=eos_id, loop_chunk=loop_chunk)


def beam(decoder: MeshT5Decoder, state: T5State, *, beam_size: int, max_decode_len: int,
         alpha: float = 0.6, eos_id: int = beam_lib.EOS):
  """`beam_search.beam_search` on the mesh: `([b, k, 1 + L] beams, [b, k] scores)`, b on `data`
  (the state's `b * k` rows, whole beams per shard where `data` divides b)."""
  part = decoder.partitioner
  return _run(('beam', decoder, beam_size, max_decode_len, alpha, eos_id),
              lambda state: beam_lib.beam_search(decoder, state, beam_size=beam_size,
                                                 max_decode_len=max_decode_len, alpha=alpha,
                                                 eos_id=eos_id),
              (decoder.state_shardings(state),),
              lambda out: jax.tree_util.tree_map(
                  lambda x: part.rows_sharding(x.shape[0], x.ndim), out), (state,))


def speculative(target: MeshT5Decoder, target_state: T5State, draft: Any, draft_state: PyTree,
                rng: jax.Array, *, gamma: int, max_decode_len: int,
                config: sampling.SamplingConfig = sampling.GREEDY, eos_id: int = ar_lib.EOS,
                skip=None) -> spec_lib.SpeculativeResult:
  """`speculative.decode` on the mesh; a model draft (`ModelDraft(MeshT5Decoder(...))`) keeps its
  own placement, other drafts' states are replicated."""
  return _loop(spec_lib.decode, target, target_state, draft, draft_state, rng, skip,
               gamma=gamma, max_decode_len=max_decode_len, config=config, eos_id=eos_id)


def tree_speculative(target: MeshT5Decoder, target_state: T5State, draft: Any,
                     draft_state: PyTree, rng: jax.Array, *, shape: Any, max_decode_len: int,
                     config: sampling.SamplingConfig = sampling.GREEDY, eos_id: int = ar_lib.EOS,
                     skip=None) -> spec_lib.SpeculativeResult:
  """`tree_speculative.decode` on the mesh (`shape` a `tree.TreeShape`); placements as in
  `speculative` (a model tree draft, staged or not, keeps its own)."""
  return _loop(tree_lib.decode, target, target_state, draft, draft_state, rng, skip,
               shape=shape, max_decode_len=max_decode_len, config=config, eos_id=eos_id)


def _loop(decode, target, target_state, draft, draft_state, rng, skip, **static):
  """Runs `decode` (greedy decoding's loop where `draft` is None, else a chain or tree loop)
  jitted on the target's mesh; `static` its keywords."""
  part, rows = target.partitioner, target.index(target_state).shape[0]
  static = tuple(sorted(static.items()))
  fn = functools.partial(_call, decode, target, draft, static)
  skip = np.zeros((rows,), bool) if skip is None else np.asarray(skip, bool)  # `_run` places it
  args = (target_state, draft_state, rng, skip)
  return _run((decode, target, draft) + static, fn,
              (target.state_shardings(target_state), _draft_shardings(part, draft, draft_state),
               part.replicated, part.rows_sharding(rows)),
              lambda out: _result_shardings(part, out, rows), args)


def _call(decode, target, draft, static, target_state, draft_state, rng, skip):
  if draft is None:
    return decode(target, target_state, rng, skip=skip, **dict(static))
  return decode(target, target_state, draft, draft_state, rng, skip=skip, **dict(static))
