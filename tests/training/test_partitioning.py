"""Logical axes from parameter names; rules that replicate what does not divide."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from gqa_spec.checkpoints.native import abstract_params
from gqa_spec.models.config import T5Config, preset
from gqa_spec import partitioning


def test_every_parameter_has_logical_axes():
  specs = partitioning.logical_axes(abstract_params(preset('nano', num_kv_heads=2)))
  flat = {partitioning.path_name(p): tuple(s) for p, s in jax.tree_util.tree_flatten_with_path(
      specs, is_leaf=lambda x: isinstance(x, PartitionSpec))[0]}
  assert flat['decoder/layers_0/self_attention/key/kernel'] == ('embed', 'kv_heads')
  assert flat['decoder/layers_1/encoder_decoder_attention/value/kernel'] == ('embed', 'kv_heads')
  assert flat['encoder/layers_0/attention/key/kernel'] == ('embed', 'heads')
  assert flat['decoder/layers_0/self_attention/out/kernel'] == ('heads', 'embed')
  assert flat['token_embedder/embedding'] == ('vocab', 'embed')
  assert flat['decoder/logits_dense/kernel'] == ('embed', 'vocab')
  assert flat['encoder/relpos_bias/rel_embedding'] == ('heads', 'relpos_buckets')
  assert flat['decoder/layers_0/mlp/wo/kernel'] == ('mlp', 'embed')
  scanned = partitioning.logical_axes(abstract_params(preset('nano', scan_layers=True)))
  assert tuple(scanned['decoder']['layers']['self_attention']['key']['kernel']) == (
      'embed', 'layers', 'kv_heads')
  assert tuple(scanned['encoder']['layers']['pre_mlp_layer_norm']['scale']) == ('embed', 'layers')
  assert tuple(scanned['encoder']['relpos_bias']['rel_embedding']) == ('heads', 'relpos_buckets')
  assert dict(partitioning.logical_axis_rules(preset('nano'), 4))['layers'] is None  # never sharded


@pytest.mark.parametrize('kv_heads,model,expected', [(8, 4, 'model'), (2, 4, None), (1, 4, None),
                                                     (4, 4, 'model'), (8, 1, None)])
def test_kv_heads_shard_only_when_divisible(kv_heads, model, expected):
  rules = dict(partitioning.logical_axis_rules(preset('mini', num_kv_heads=kv_heads), model))
  assert rules['kv_heads'] == expected
  assert rules['heads'] == ('model' if model > 1 else None)
  assert rules['batch'] == 'data'


def test_bad_mesh_is_a_clear_error():
  with pytest.raises(ValueError, match='devices'):
    partitioning.create_mesh(data=2, model=1)  # one CPU device here


def test_cache_specs_follow_the_rules_and_replicate_what_does_not_divide():
  cfg = T5Config(vocab_size=64, emb_dim=16, num_heads=8, head_dim=4, mlp_dim=32,
                 num_encoder_layers=1, num_decoder_layers=1)
  mesh = {'data': 4, 'model': 4}
  kv = PartitionSpec('batch', 'kv_heads', None, None)  # [b, G, L, d]
  rules = lambda g: partitioning.logical_axis_rules(cfg.replace(num_kv_heads=g), 4)
  assert partitioning.fit_spec(kv, (8, 8, 5, 4), rules(8), mesh) == PartitionSpec('data', 'model', None, None)
  assert partitioning.fit_spec(kv, (8, 2, 5, 4), rules(2), mesh) == PartitionSpec('data', None, None, None)
  assert partitioning.fit_spec(kv, (6, 8, 5, 4), rules(8), mesh) == PartitionSpec(None, 'model', None, None)
  cache = {'decoder': {'cache_index': np.zeros((8,)), 'positions': np.zeros((8, 5)),
                       'encoder_mask': np.zeros((8, 3)),
                       'layers_0': {'self_attention': {'cached_key': np.zeros((8, 2, 5, 4))}}}}
  axes = partitioning.cache_logical_axes(cache)['decoder']
  assert axes['cache_index'] == PartitionSpec('batch') and axes['positions'] == PartitionSpec('batch', None)
  assert axes['layers_0']['self_attention']['cached_key'] == kv
  scanned = {'decoder': {'layers': {'self_attention': {'cached_key': np.zeros((8, 3, 2, 5, 4))}}}}
  assert partitioning.cache_logical_axes(scanned)['decoder']['layers']['self_attention'][
      'cached_key'] == PartitionSpec('batch', 'layers', 'kv_heads', None, None)
  with pytest.raises(ValueError, match='no logical axes known for decode cache leaf'):
    partitioning.cache_logical_axes({'decoder': {'mystery': np.zeros(3)}})
