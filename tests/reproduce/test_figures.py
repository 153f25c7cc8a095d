"""The figures and Fig. 6's bytes model, from hand-made stage JSON."""

import os

import pytest

from gqa_spec.models.config import preset
from gqa_spec.reproduce import decode_bytes, figures

PNG = b'\x89PNG\r\n\x1a\n'


def test_bytes_model_grows_with_kv_groups_and_fits_only_the_scale():
  config = preset('nano')
  b = {g: decode_bytes.bytes_per_sample(config.replace(num_kv_heads=g), 4, 256, 32)
       for g in (1, 2, 4)}
  assert b[1] < b[2] < b[4]
  # K/V bytes are linear in G: equal steps from 1 -> 2 -> 4 groups differ by the K/V of 1 and 2.
  assert b[4] - b[2] == pytest.approx(2 * (b[2] - b[1]))
  rows = [{'setting': 'long', 'kv_heads': g, 'inputs': 256, 'targets': 32, 'batch_size': 4,
           'time_per_sample_s': 3e-12 * x} for g, x in b.items()]  # exactly proportional
  predicted = decode_bytes.predicted_times(rows, {'long': config})
  for r in rows:
    assert predicted[('long', r['kv_heads'])] == pytest.approx(r['time_per_sample_s'])
  rows[0]['time_per_sample_s'] *= 10  # a noisy point moves the scale, never the ratios
  predicted = decode_bytes.predicted_times(rows, {'long': config})
  assert predicted[('long', 4)] / predicted[('long', 1)] == pytest.approx(b[4] / b[1])


def _spec(draft, temp, gamma, batch=None):
  row = {'task': 'ddtp_translate_en_de', 'target': 'mha_g4', 'draft': draft, 'temperature': temp,
         'gamma': gamma, 'speedup_measured': 1.0 + gamma / 10, 'speedup_thm8_with_v': 1.2}
  if batch:
    row['batch_size'] = batch
  return row


def test_plot_all_writes_every_figure_and_one_speedup_figure_per_batch_size(tmp_path):
  evaluate = [{'variant': v, 'label': v, 'task': 'ddtp_summarize', 'kv_heads': g, 'method': m,
               'alpha': a, 'model': 'target', 'metric': 'rouge1', 'score': s,
               'time_per_sample_s': 0.01 * g, 'per_example': {'rouge1': f'{s} {s + 2} {s - 2}'}}
              for v, g, m, a, s in (('mha_g4', 4, None, 0.0, 30.0), ('g1_mean_a0.1', 1, 'mean', 0.1, 25.0),
                                    ('g1_first_a0.1', 1, 'first', 0.1, 20.0))]
  timing = [{'setting': 'short', 'kv_heads': g, 'inputs': 16, 'targets': 8, 'batch_size': 2,
             'time_per_sample_s': 0.001 * g} for g in (1, 2, 4)]
  spec = {'rows': [_spec(d, t, g, b) for d in ('bigram', 'draft model') for t in (0.0, 1.0)
                   for g in (1, 3) for b in (1, 8)], 'batch_size': 8,
          'drafts_rows': [_spec(d, t, g) for d in ('chimera', 'draft model') for t in (0.0, 1.0)
                          for g in (1, 3)]}
  names = figures.plot_all(str(tmp_path), evaluate, timing, spec, 0.1,
                           {('short', g): 0.001 * g for g in (1, 2, 4)})
  assert names == ['fig3_quality_vs_time.png', 'fig4_conversion_methods.png',
                   'fig5_uptraining.png', 'fig6_time_vs_groups.png',
                   'speculative_speedup_b1.png', 'speculative_speedup_b8.png',
                   'speculative_drafts_speedup.png']
  for name in names:
    with open(os.path.join(tmp_path, name), 'rb') as f:
      assert f.read(8) == PNG
  lo, hi = figures.quality_interval(evaluate, 'mha_g4')
  assert lo < 30.0 < hi
  del evaluate[0]['per_example']
  assert figures.quality_interval(evaluate, 'mha_g4') is None
