"""Partitioned decoding (`gqa_spec.decoding.mesh`) on 8 virtual CPU devices equals one device.

Greedy autoregressive, beam search, greedy speculative (a model draft with its own placement,
ragged rows and padding rows) and seeded sampling give the single-device tokens on 2x4, 1x8, 8x1
(and 4x2, where GQA-2's two K/V heads shard) meshes for MHA, GQA-2 and MQA; a staged token tree and
a staged chain give them on 2x4 and 1x8 (MHA); MHA with scanned layers gives the unrolled
model's tokens in every loop on 2x4; and the cache and parameters are placed as the rules say. The check runs in a subprocess (`mesh_check.py`): XLA's
device count is fixed when jax initialises.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.mesh_flags import eight_device_xla_flags

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
D, M = 'data', 'model'


@pytest.fixture(scope='module')
def report():
  # The check is ~70 XLA compiles of small programs: the suite's XLA_FLAGS (tests/conftest.py's
  # CHEAP_XLA_FLAGS) and LLVM's code generated as one module, not split for parallel compilation
  # (XLA's compile time 10-13% less, 4 of 4 back-to-back pairs on 2 cores, 2026-11-25); 8 host
  # devices last, so that they win.
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=_ROOT,
             XLA_FLAGS=eight_device_xla_flags('--xla_cpu_parallel_codegen_split_count=1'))
  result = subprocess.run([sys.executable, '-m', 'tests.decoding.mesh_check'], cwd=_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.split('REPORT ', 1)[1])


@pytest.mark.slow
def test_every_loop_gives_the_single_device_tokens(report):
  runs = {k: v for k, v in report.items()
          if '/' in k and isinstance(v, dict) and not k.startswith('mha_scanned')}
  checked = {(k, loop) for k, v in runs.items() for loop in ('greedy', 'beam', 'speculative', 'sample')
             if loop in v}
  assert checked and all(runs[k][loop] for k, loop in checked), [c for c in checked if not runs[c[0]][c[1]]]
  # Coverage: greedy everywhere; every other loop on every config and on every required mesh.
  for name in ('mha', 'gqa2', 'mqa'):
    for mesh in ('2x4', '1x8', '8x1'):
      assert (f'{name}/{mesh}', 'greedy') in checked
  for loop in ('beam', 'speculative', 'sample'):
    assert {k.split('/')[0] for k, l in checked if l == loop} == {'mha', 'gqa2', 'mqa'}, loop
    assert {k.split('/')[1] for k, l in checked if l == loop} >= {'2x4', '1x8', '8x1'}, loop
  assert ('gqa2/4x2', 'speculative') in checked


@pytest.mark.slow
def test_trees_and_staged_speculation_give_the_single_device_tokens(report):
  # Tokens, lengths, accepted counts, target calls and the draft's own call count all equal.
  for mesh in ('2x4', '1x8'):
    entry = report[f'mha/{mesh}']
    assert entry['tree'] and entry['staged'], (mesh, entry)
    assert entry['tree_draft_calls'] > 0 and entry['staged_draft_calls'] > 0


@pytest.mark.slow
def test_scanned_layers_give_the_unrolled_tokens_with_the_layer_axis_unsharded(report):
  entry = report['mha_scanned/2x4']
  for loop in ('greedy', 'beam', 'speculative', 'tree', 'staged'):
    assert entry[loop], (loop, entry)
  # The cache is [batch, layers, K/V heads, head_dim, slots]; parameters [emb, layers, heads *
  # head_dim]: rows on `data`, heads on `model` as unrolled, the layer axis on neither.
  assert entry['self_kv_shape'] == [8, 1, 8, 4, 15], entry
  assert entry['self_kv_spec'] == [D, None, M, None, None], entry
  assert entry['kv_kernel_spec'] == [None, None, M], entry


@pytest.mark.slow
def test_the_loop_never_moves_a_cache_or_whole_logits(report):
  # MHA on 2x4, greedy: each device holds 4 rows and 2 of 8 K/V heads. Inside the loop only
  # activations move ([4, 1, emb=32] all-reduces after the model-sharded matmuls) and the argmax
  # over the model-sharded vocabulary (per-shard maxima, [4, 4]); never a K/V cache
  # ([4, 2, 15, 4] per device and layer: `mesh_check.TARGET_SLOTS` slots) nor a row's full logits
  # ([4, 128]).
  found = report['mha/2x4']['collectives']
  assert found and max(n for _, n in found) <= 4 * 32, found
  assert 'all-gather' not in {op for op, n in found if n > 16}, found


@pytest.mark.slow
def test_batches_are_ragged(report):
  # Rows end at different steps (EOS), two padding rows generate nothing.
  for name in ('mha', 'gqa2', 'mqa'):
    lengths = report[f'{name}/greedy_lengths']
    assert lengths[6:] == [0, 0] and len(set(lengths[:6])) > 1, (name, lengths)
  spec_lengths = [v['lengths'] for v in report.values() if isinstance(v, dict) and 'lengths' in v]
  assert any(len(set(l[:6])) > 1 for l in spec_lengths), spec_lengths


@pytest.mark.slow
@pytest.mark.parametrize('run,kv', [
    ('mha/2x4', [D, M, None, None]),  # 8 K/V heads over 4 model shards
    ('mha/1x8', [D, M, None, None]),
    ('mha/8x1', [D, None, None, None]),
    ('gqa2/4x2', [D, M, None, None]),  # GQA-2 shards over a model axis of 2 ...
    ('gqa2/2x4', [D, None, None, None]),  # ... and is replicated over 4
    ('gqa2/1x8', [D, None, None, None]),
    ('mqa/2x4', [D, None, None, None]),  # MQA: replicated on every model shard
    ('mqa/1x8', [D, None, None, None]),
])
def test_cache_and_param_shardings_follow_the_rules(report, run, kv):
  entry = report[run]
  assert entry['self_kv_spec'] == kv and entry['cross_kv_spec'] == kv
  assert entry['kv_kernel_spec'] == [None, kv[1]]  # K/V kernels [embed, G * head_dim]
  model_size = int(run.split('x')[1])
  assert entry['query_kernel_spec'] == [None, M if model_size > 1 else None]  # 8 query heads
  assert entry['index_spec'] == [D] and entry['sequences_spec'] == [D, None]
  assert entry['params_shared']  # a state of placed parameters holds them, not a copy
  if 'draft_kv_spec' in entry:  # the MQA draft: its own rules, rows on data, its head replicated
    assert entry['draft_kv_spec'] == [D, None, None, None]


@pytest.mark.slow
def test_each_loop_is_traced_once(report):
  # `mesh._run` traced every loop twice (`jax.eval_shape` for its output shardings, then `jax.jit`):
  # now the outputs are placed by a sharding constraint inside the one trace.
  assert report['compiled']['ar'] > 0 and report['compiled']['draft_loop'] > 0, report['compiled']
  assert report['traces'] == report['compiled'], (report['traces'], report['compiled'])
