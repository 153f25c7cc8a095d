"""Per-device decode memory accounting against hand-computed byte counts."""

import jax
import numpy as np
import pytest

from gqa_spec.decoding import memory
from gqa_spec.models.config import T5Config
from gqa_spec.training.train_step import init_params

# 8 query heads, head_dim 4, 2 decoder layers; float32 (4 bytes).
BASE = T5Config(vocab_size=64, emb_dim=16, num_heads=8, head_dim=4, mlp_dim=32,
                num_encoder_layers=1, num_decoder_layers=2)
B, S, L = 8, 12, 7


def kv_bytes(rows, heads, length):
  """K and V of every decoder layer: 2 x layers x [rows, heads, length, head_dim] float32."""
  return 2 * BASE.num_decoder_layers * rows * heads * length * BASE.head_dim * 4


def report(g, data, model, batch=B):
  return memory.memory_per_device(BASE.replace(num_kv_heads=g), batch=batch, input_length=S,
                                  cache_length=L, data=data, model=model)


@pytest.mark.parametrize('g,data,model,rows,heads', [
    (8, 1, 1, 8, 8),  # one device holds everything
    (8, 2, 4, 4, 2),  # MHA: rows over data, heads over model
    (2, 2, 2, 4, 1),  # GQA-2 on a model axis of 2: one K/V head per device
    (2, 1, 4, 8, 2),  # GQA-2 on a model axis of 4: not divisible, replicated
    (1, 1, 8, 8, 1),  # MQA: its one head on every model shard
])
def test_kv_cache_bytes_per_device(g, data, model, rows, heads):
  r = report(g, data, model)
  assert (r.rows_per_device, r.kv_heads_per_device) == (rows, heads)
  assert r.self_kv_bytes == kv_bytes(rows, heads, L)
  assert r.cross_kv_bytes == kv_bytes(rows, heads, S)
  assert r.kv_bytes_total == kv_bytes(B, g, L) + kv_bytes(B, g, S)
  # index [b] int32, slot positions [b, L] int32, encoder mask [b, S] bool
  assert r.other_cache_bytes == rows * (4 + 4 * L + S)


def test_replication_waste_is_mqa_s_and_not_gqa_s():
  mqa, gqa = report(1, 1, 8), report(8, 1, 8)
  per_device = mqa.self_kv_bytes + mqa.cross_kv_bytes
  assert mqa.kv_replication_waste_bytes == per_device * 7 // 8  # (m - 1) / m of what it holds
  assert gqa.kv_replication_waste_bytes == 0
  # The GQA paper's point (Sec. 2.2): GQA-m holds per device what MQA holds, with m times the heads.
  assert gqa.self_kv_bytes == mqa.self_kv_bytes and gqa.cross_kv_bytes == mqa.cross_kv_bytes
  # Rows that `data` does not divide are replicated, and that is waste too.
  odd = report(8, 4, 1, batch=6)
  assert odd.rows_per_device == 6 and odd.kv_replication_waste_bytes > 0


def test_param_bytes_match_the_initialised_model():
  config = BASE.replace(num_kv_heads=2)
  params = jax.eval_shape(lambda rng: init_params(config, rng), jax.random.PRNGKey(0))  # the trainer's
  total = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))
  single, data_only, sharded = report(2, 1, 1), report(2, 4, 1), report(2, 1, 2)
  assert single.param_bytes == single.param_bytes_total == total
  assert data_only.param_bytes == total  # the data axis replicates parameters
  # Model axis of 2: every matrix but the embedding dims (norm scales, [.., embed]) halves; the
  # scales (emb_dim floats each) stay whole.
  scales = sum(np.prod(x.shape) * 4 for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
               if 'scale' in jax.tree_util.keystr(p))
  assert sharded.param_bytes == (total - scales) // 2 + scales


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match='batch must be a positive integer'):
    report(8, 1, 1, batch=0)
