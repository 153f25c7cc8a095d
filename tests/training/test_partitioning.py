"""Logical axes from parameter names; rules that replicate what does not divide."""

import jax
import pytest
from jax.sharding import PartitionSpec

from gqa_spec.checkpoints.native import abstract_params
from gqa_spec.models.config import preset
from gqa_spec.training import partitioning


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
