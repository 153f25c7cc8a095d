"""Scale-out on `jax.sharding`: a (`data`, `model`) mesh and t5x-style logical axis rules.

The model's parameters are plain arrays (no `nn.with_logical_partitioning`), so their logical axes
are derived from their T5X path names (`logical_axes`). Logical axes map to mesh axes by rules as in
t5x's `standard_logical_axis_rules`:

  batch -> data;  heads, mlp, vocab -> model;  embed, relpos_buckets -> replicated;
  kv_heads (decoder self/cross K/V, `[d, G*head_dim]`) -> model only when G divides by the model
  axis, otherwise replicated: every model shard then holds all G K/V heads. That replication is the
  waste of MQA under model parallelism that GQA removes (Ainslie et al. 2023, Sec. 2.2).
The same divisibility test applies to heads, mlp and vocab, so any preset runs on any mesh.
Scanned stacks (`T5Config.scan_layers`) hold their parameters' layer axis on the logical axis
`layers` (at `t5.PARAM_SCAN_AXIS`) and their cache leaves' at `t5.CACHE_SCAN_AXIS`; no rule maps
`layers` to a mesh axis, so every device holds every layer, as in the unrolled layout.

Optimizer state is sharded like the parameter it belongs to (Adafactor's factored row/column
statistics drop the factored axis), batches along `data`. Multi-process runs start JAX's runtime
first (`gqa_spec.distributed`); each process then feeds its own slice of the global batch
(`shard_batch`), and `to_host` gathers an array spread over processes.

Decoding uses the same rules: the decode cache (`cache_logical_axes`) has its rows on `batch` and
its K/V heads on `kv_heads`, so G K/V heads shard over `model` exactly when the K/V kernels do,
and an MQA cache is replicated on every model shard. A cache axis a mesh axis does not divide
(a batch of 6 on 4 data shards) is replicated instead (`fit_spec`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import CACHE_SCAN_AXIS, PARAM_SCAN_AXIS, SCANNED_NAME

LogicalAxes = Tuple[Optional[str], ...]
Rules = Tuple[Tuple[str, Optional[str]], ...]

# (regex on the '/'-joined parameter path, logical axes); the first match wins.
_PARAM_AXES = (
    (r'token_embedder/embedding$', ('vocab', 'embed')),
    (r'logits_dense/kernel$', ('embed', 'vocab')),
    (r'decoder/.*(self_attention|encoder_decoder_attention)/(key|value)/kernel$', ('embed', 'kv_heads')),
    (r'/(query|key|value)/kernel$', ('embed', 'heads')),
    (r'/out/kernel$', ('heads', 'embed')),
    (r'mlp/wi(_\d+)?/kernel$', ('embed', 'mlp')),
    (r'mlp/wo/kernel$', ('mlp', 'embed')),
    (r'relpos_bias/rel_embedding$', ('heads', 'relpos_buckets')),
    (r'^heads$', (None, 'embed', 'vocab')),  # Chimera's residual heads [H, 2D, V]
    (r'/scale$', ('embed',)),
)


def path_name(path: Sequence[Any]) -> str:
  """A `tree_flatten_with_path` key path as 'encoder/layers_0/attention/query/kernel'."""
  parts = []
  for key in path:
    for attr in ('key', 'name', 'idx'):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
  return '/'.join(parts)


def _scanned(name: str) -> bool:
  return f'/{SCANNED_NAME}/' in f'/{name}'


def _with_layers(axes: LogicalAxes, at: int) -> LogicalAxes:
  return tuple(axes[:at]) + ('layers',) + tuple(axes[at:])


def param_logical_axes(name: str, ndim: int) -> LogicalAxes:
  """Logical axes of the parameter at path `name` (see `_PARAM_AXES`); a scanned stack's
  parameter has its layer's axes with `layers` inserted at `PARAM_SCAN_AXIS`."""
  if _scanned(name):
    return _with_layers(_unrolled_axes(name, ndim - 1), PARAM_SCAN_AXIS)
  return _unrolled_axes(name, ndim)


def _unrolled_axes(name: str, ndim: int) -> LogicalAxes:
  for pattern, axes in _PARAM_AXES:
    if re.search(pattern, name):
      if len(axes) != ndim:
        raise ValueError(f'parameter {name} has {ndim} dims, expected {len(axes)} ({axes})')
      return axes
  raise ValueError(f'no logical axes known for parameter {name!r}')


# Decode cache leaves (see `models/t5.py`, `models/attention.py`): name -> logical axes.
_CACHE_AXES = (
    # keys [b, G, d, L or S], values [b, G, L or S, d]: only batch and heads are ever sharded
    (r'/(cached_key|cached_value)$', ('batch', 'kv_heads', None, None)),
    (r'cache_index$', ('batch',)),  # [b]
    (r'(^|/)positions$', ('batch', None)),  # [b, L]
    (r'encoder_mask$', ('batch', None)),  # [b, S]
)


def cache_logical_axes(cache: Any) -> Any:
  """The tree of logical-axis `PartitionSpec`s of a (possibly abstract) decode cache."""

  def axes(path, x) -> PartitionSpec:
    name = path_name(path)
    for pattern, logical in _CACHE_AXES:
      if re.search(pattern, name):
        if _scanned(name):
          logical = _with_layers(logical, CACHE_SCAN_AXIS)
        if len(logical) != len(x.shape):
          raise ValueError(f'cache leaf {name} has shape {x.shape}, expected {len(logical)} dims '
                           f'({logical})')
        return PartitionSpec(*logical)
    raise ValueError(f'no logical axes known for decode cache leaf {name!r}')

  return jax.tree_util.tree_map_with_path(axes, cache)


def fit_spec(logical: PartitionSpec, shape: Sequence[int], rules: Rules,
             mesh_shape: Mapping[str, int]) -> PartitionSpec:
  """Mesh `PartitionSpec` of an array: its logical axes by `rules`, then every mesh axis that does
  not divide its dimension dropped (that dimension is replicated)."""
  spec = nn.logical_to_mesh_axes(tuple(logical), rules)
  out = []
  for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axis,) if isinstance(axis, str) else tuple(axis or ())
    size = int(np.prod([mesh_shape[a] for a in names])) if names else 1
    out.append(axis if names and dim % size == 0 else None)
  return PartitionSpec(*out)


def logical_axes(params: Any) -> Any:
  """The tree of `PartitionSpec`s of logical axis names for a (possibly abstract) params tree."""
  return jax.tree_util.tree_map_with_path(
      lambda p, x: PartitionSpec(*param_logical_axes(path_name(p), len(x.shape))), params)


def logical_axis_rules(config: T5Config, model_size: int) -> Rules:
  """t5x's standard rules, with every model-parallel axis replicated when not divisible."""

  def model_if(dim: int) -> Optional[str]:
    return 'model' if model_size > 1 and dim % model_size == 0 else None

  return (
      ('batch', 'data'),
      ('vocab', model_if(config.vocab_size)),
      ('mlp', model_if(config.mlp_dim)),
      ('heads', model_if(config.num_heads)),
      ('kv_heads', model_if(config.num_kv_heads)),
      ('embed', None),
      ('relpos_buckets', None),
      ('layers', None),
  )


def create_mesh(data: int = -1, model: int = 1,
                devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A `[data, model]` device mesh; `data=-1` takes all devices left over by `model`."""
  devices = list(jax.devices() if devices is None else devices)
  if model < 1 or len(devices) % model:
    raise ValueError(f'model parallelism {model} does not divide the {len(devices)} devices')
  if data == -1:
    data = len(devices) // model
  if data * model != len(devices):
    raise ValueError(f'mesh {data}x{model} needs {data * model} devices, found {len(devices)}')
  return Mesh(np.asarray(devices).reshape(data, model), ('data', 'model'))


def put(tree: Any, shardings: Any) -> Any:
  """`jax.device_put(tree, shardings)` that also works across processes: a leaf held by this
  process alone (numpy, or a jax array on its own devices: the same value on every process) is
  placed into a sharding that spans processes by each process copying in its own shards
  (`jax.make_array_from_callback`); a multi-process runtime has no cross-host device transfer."""

  def one(x, sharding):
    if sharding.is_fully_addressable or (isinstance(x, jax.Array) and
                                         not x.is_fully_addressable):
      return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  is_sharding = lambda s: isinstance(s, jax.sharding.Sharding)
  # `shardings` may be a prefix of `tree` (one sharding for a subtree), as for `jax.device_put`
  return jax.tree_util.tree_map(
      lambda sharding, sub: jax.tree_util.tree_map(lambda x: one(x, sharding), sub),
      shardings, tree, is_leaf=is_sharding)


def to_host(tree: Any) -> Any:
  """Arrays -> numpy on every process: what this process does not hold is all-gathered
  (`multihost_utils.process_allgather`, a collective: every process must call it)."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  def get(a):
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return np.asarray(a)

  return jax.tree_util.tree_map(get, tree)


@dataclasses.dataclass(frozen=True)
class Partitioner:
  """Places parameters, optimizer state and batches on a mesh by the logical axis rules.

  Attributes:
    mesh: the (`data`, `model`) mesh.
    rules: logical -> mesh axis rules (`logical_axis_rules`).
  """

  mesh: Mesh
  rules: Rules

  @classmethod
  def create(cls, config: T5Config, data: int = -1, model: int = 1,
             devices: Optional[Sequence[jax.Device]] = None) -> 'Partitioner':
    """The mesh `data x model` over `devices` (default: all) with rules fitted to `config`."""
    mesh = create_mesh(data, model, devices)
    return cls(mesh, logical_axis_rules(config, mesh.shape['model']))

  def _sharding(self, logical: PartitionSpec) -> NamedSharding:
    return NamedSharding(self.mesh, nn.logical_to_mesh_axes(tuple(logical), self.rules))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  @property
  def data_size(self) -> int:
    return self.mesh.shape['data']

  def param_shardings(self, params: Any) -> Any:
    """`NamedSharding`s for a (possibly abstract) parameter tree."""
    return jax.tree_util.tree_map(self._sharding, logical_axes(params),
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))

  def state_shardings(self, state: Any, params: Any) -> Any:
    """Shardings of any tree (train state, optimizer state) whose leaves belong to `params`.

    A leaf is matched to its parameter by the dict keys on its path (optax states mirror the
    params tree). Same shape: the parameter's sharding; one axis fewer (Adafactor's factored
    statistics): the parameter's logical axes without the reduced one; anything else (counters,
    placeholders, the step): replicated. Shardings are layouts only, never a question of
    correctness, so an ambiguous match (two equal dims) costs at worst a reshard.
    """
    logical = {path_name(p): (spec, x.shape) for p, x, spec in _with_paths(params, logical_axes(params))}

    def leaf_sharding(path, x) -> NamedSharding:
      keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
      for start in range(len(keys)):
        match = logical.get('/'.join(str(k) for k in keys[start:]))
        if match is not None:
          break
      else:
        return self.replicated
      spec, shape = match
      if 'layers' in spec:  # the optimizer's per-layer state holds a scanned stack's layers first
        spec, shape = _layers_first(spec, shape, x.shape)
      if tuple(x.shape) == tuple(shape):
        return self._sharding(spec)
      if len(x.shape) == len(shape) - 1:
        for axis in range(len(shape)):
          if tuple(shape[:axis]) + tuple(shape[axis + 1:]) == tuple(x.shape):
            return self._sharding(PartitionSpec(*(spec[:axis] + spec[axis + 1:])))
      return self.replicated

    return jax.tree_util.tree_map_with_path(leaf_sharding, state)

  def cache_shardings(self, cache: Any) -> Any:
    """`NamedSharding`s of a (possibly abstract) decode cache: rows on `data`, K/V heads on `model`
    when the rules shard `kv_heads`, axes a mesh axis does not divide replicated (`fit_spec`)."""
    return jax.tree_util.tree_map(
        lambda spec, x: NamedSharding(self.mesh, fit_spec(spec, x.shape, self.rules,
                                                          self.mesh.shape)),
        cache_logical_axes(cache), cache, is_leaf=lambda x: isinstance(x, PartitionSpec))

  def rows_sharding(self, rows: int, ndim: int = 1) -> NamedSharding:
    """An `[rows, ...]` array with rows on `data` when `data` divides them, else replicated."""
    return NamedSharding(self.mesh, fit_spec(PartitionSpec('batch', *(None,) * (ndim - 1)),
                                             (rows,) + (1,) * (ndim - 1), self.rules,
                                             self.mesh.shape))

  def batch_sharding(self) -> NamedSharding:
    """Examples along `data`; every other axis replicated."""
    return NamedSharding(self.mesh, nn.logical_to_mesh_axes(('batch',), self.rules))

  def shard_batch(self, batch: Mapping[str, np.ndarray]) -> dict:
    """This host's slice of the global batch -> global `jax.Array`s sharded along `data`."""
    sharding = self.batch_sharding()
    if jax.process_count() == 1:  # this host's batch is the global one: one batched transfer
      return jax.device_put({k: np.asarray(v) for k, v in batch.items()}, sharding)  # (2x faster
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))  # per smoke step)
            for k, v in batch.items()}


def _layers_first(spec: PartitionSpec, shape: Sequence[int], leaf_shape: Sequence[int]):
  """`(spec, shape)` of a scanned parameter with its `layers` axis moved to the front, when the
  state leaf is laid out that way (`optimizer.layers_as_batch`), else unchanged."""
  if tuple(leaf_shape) == tuple(shape):
    return spec, shape
  at = tuple(spec).index('layers')
  order = [at] + [a for a in range(len(shape)) if a != at]
  return PartitionSpec(*(spec[a] for a in order)), tuple(shape[a] for a in order)


def _with_paths(tree: Any, specs: Any):
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  spec_leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
  return [(p, x, s) for (p, x), s in zip(leaves, spec_leaves)]
