"""The options benchmarks/gpu.sh relies on: `--dtype` reaches the K/V cache, `--profile` writes the
decode loop's per-op profiles, and `--batch` reaches the measured rows (speculative_costs'
`--target-preset` / `--draft-preset` were checked by hand: a test would compile its loops)."""

import json

import pytest

from benchmarks import decode_roofline, train_throughput


def _rows(path):
  with open(path + '.json') as f:
    return json.load(f)


def test_bfloat16_halves_the_caches_but_not_the_float32_parameters(tmp_path):
  rows = {}
  for dtype in ('float32', 'bfloat16'):
    out = str(tmp_path / dtype)
    decode_roofline.main(['--presets', 'nano', '--kv', 'mqa', '--batch', '2', '--input-length',
                          '16', '--steps', '2', '--repeats', '1', '--dtype', dtype, '--out', out])
    [rows[dtype]] = _rows(out)['rows']
  f32, bf16 = rows['float32'], rows['bfloat16']
  assert bf16['dtype'] == 'bfloat16' and f32['dtype'] == 'float32'
  assert bf16['decoder_param_mib'] == f32['decoder_param_mib']
  assert bf16['self_kv_mib'] == pytest.approx(f32['self_kv_mib'] / 2)
  assert bf16['cross_kv_mib'] == pytest.approx(f32['cross_kv_mib'] / 2)
  assert '| nano (bfloat16) | 1 | unrolled | 16 | 2 |' in open(str(tmp_path / 'bfloat16') + '.md').read()


def test_profile_writes_one_profile_per_entry(tmp_path):
  out = str(tmp_path / 'p')
  decode_roofline.main(['--profile', 'nano:1:1:16,nano:4:2:16', '--steps', '2', '--repeats', '1',
                        '--out', out])
  profiles = _rows(out + '_profile')['profiles']
  assert [(p['kv_heads'], p['batch'], p['input_length']) for p in profiles] == [(1, 1, 16),
                                                                               (4, 2, 16)]
  for p in profiles:
    assert p['step_ms'] == pytest.approx(p['wall_ms'] / 2)
    assert p['by_category_ms']['matmul'] > 0
  md = open(out + '_profile.md').read()
  assert 'nano, G = 1, batch 1, 16 input tokens' in md and 'nano, G = 4, batch 2' in md


def test_batch_reaches_the_rows(tmp_path):
  out = str(tmp_path / 't')
  train_throughput.main(['--preset', 'nano', '--settings', 'finetune', '--steps', '1',
                         '--batch', '2', '--scan-layers', '--remat-policy', 'full', '--out', out])
  [row] = _rows(out)['rows']
  assert (row['preset'], row['batch'], row['tokens_per_s']) == ('nano', 2, pytest.approx(
      2 * 128 / row['step_s']))
  assert (row['scan_layers'], row['remat_policy']) == (True, 'full')
