"""The reproduction's PNG figures, drawn from the per-stage JSON (see `report.py` for the inputs).

  fig3_quality_vs_time.png       GQA Fig. 3: average quality vs time per sample, one marker per model
  fig4_conversion_methods.png    GQA Fig. 4: quality per conversion method at one alpha
  fig5_uptraining.png            GQA Fig. 5: quality vs uptraining proportion, MHA as a line
  fig6_time_vs_groups.png        GQA Fig. 6: a panel per timing setting, measured beside the bytes
                                 model's prediction (`decode_bytes`)
  speculative_speedup[_bN].png   a panel per (task, target) x temperature: measured speedup vs gamma
                                 beside Theorem 8 with the measured c and v(gamma), per draft; one
                                 file per batch size (suffix when the stage holds several)
  speculative_drafts_speedup.png the same for the drafts job's chains (plain, distilled, Chimera,
                                 staged), where the speculative stage has them
Every series has its own colour and marker, legends sit outside the axes. Quality error bars are
95% bootstrap intervals over test examples (`bootstrap`), drawn where per-example scores exist;
timing and speedup points are medians whose spread the stages do not keep, so they have none.
"""

from __future__ import annotations

import os
from typing import List, Mapping, Optional, Sequence, Tuple

from gqa_spec import atomic
from gqa_spec.reproduce import bootstrap
from gqa_spec.reproduce.report import TASK_LABELS, quality_rows

MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '*', 'h', '<', '>', 'p')
DPI = 120


def _style(i: int) -> dict:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  colours = plt.get_cmap('tab10').colors + plt.get_cmap('Dark2').colors
  return {'color': colours[i % len(colours)], 'marker': MARKERS[i % len(MARKERS)]}


def quality_interval(evaluate_rows: Sequence[Mapping], variant: str) -> Optional[Tuple[float, float]]:
  """95% bootstrap interval of a variant's task-averaged score, or None without per-example data."""
  rows = [r for r in evaluate_rows if r['variant'] == variant]
  if not rows or any('per_example' not in r for r in rows):
    return None
  tasks = [(r['metric'], {'m': bootstrap.decode(r['metric'], r['per_example'])})
           for r in sorted(rows, key=lambda r: r['task'])]
  _, low, high = bootstrap.paired_bootstrap(tasks, {'m': 1.0})
  return low, high


def _yerr(points: Sequence[Tuple[float, Optional[Tuple[float, float]]]]):
  """Asymmetric error bars `[2, n]` from (value, interval) pairs; None when no interval exists."""
  if any(ci is None for _, ci in points):
    return None
  return [[max(v - ci[0], 0.0) for v, ci in points], [max(ci[1] - v, 0.0) for v, ci in points]]


def _quality_label(intervals: Mapping[str, Optional[Tuple[float, float]]]) -> str:
  if intervals and all(ci is not None for ci in intervals.values()):
    return 'Average quality (bars: 95% CI, test examples)'
  return 'Average quality'


def _legend_outside(fig, ax_or_fig, handles=None, labels=None, title=None) -> None:
  if handles is None:
    handles, labels = ax_or_fig.get_legend_handles_labels()
  fig.legend(handles, labels, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8,
             title=title, title_fontsize=8, frameon=False)


def plot_all(out_dir: str, evaluate_rows: Sequence[Mapping], timing_rows: Sequence[Mapping],
             spec_record: Mapping, alpha_for_methods: float,
             predicted_times: Mapping[Tuple[str, int], float]) -> List[str]:
  """Writes the PNG figures into `out_dir`; returns their file names."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  written = []

  def save(fig, name):
    with atomic.open_for_write(os.path.join(out_dir, name), 'wb') as f:
      fig.savefig(f, format=os.path.splitext(name)[1][1:], dpi=DPI, bbox_inches='tight')
    plt.close(fig)
    written.append(name)

  rows = [r for r in quality_rows(evaluate_rows) if r['model'] in ('target', 'draft')]
  intervals = {r['variant']: quality_interval(evaluate_rows, r['variant']) for r in rows}
  if rows:  # Figure 3
    fig, ax = plt.subplots(figsize=(5.5, 4))
    shown = [r for r in rows if r['method'] in (None, 'mean')]
    for i, r in enumerate(sorted(shown, key=lambda r: (-r['kv_heads'], r['label']))):
      x, y, ci = 1000 * r['time_per_sample_s'], r['average'], intervals[r['variant']]
      ax.errorbar([x], [y], yerr=_yerr([(y, ci)]), linestyle='none', capsize=3,
                  label=r['label'], **_style(i))
    ax.set_xlabel('Time per sample (ms)')
    ax.set_ylabel(_quality_label(intervals))
    ax.set_title('Quality vs inference time (GQA Fig. 3)')
    _legend_outside(fig, ax)
    save(fig, 'fig3_quality_vs_time.png')

  methods = [r for r in rows if r['method'] is not None and r['alpha'] == alpha_for_methods]
  if methods:  # Figure 4: bars grouped by K/V groups, a colour per conversion method
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    order = ['mean', 'first', 'random']
    names = sorted({r['method'] for r in methods},
                   key=lambda m: order.index(m) if m in order else len(order))
    groups = sorted({r['kv_heads'] for r in methods})
    width = 0.8 / len(names)
    for k, m in enumerate(names):
      sub = sorted((r for r in methods if r['method'] == m), key=lambda r: r['kv_heads'])
      xs = []
      for r in sub:  # bars centred on their group, whichever methods it has
        present = [n for n in names if any(q['method'] == n and q['kv_heads'] == r['kv_heads']
                                           for q in methods)]
        xs.append(groups.index(r['kv_heads']) + (present.index(m) - (len(present) - 1) / 2) * width)
      ys = [r['average'] for r in sub]
      ax.bar(xs, ys, width, color=_style(k)['color'], capsize=3, label=m,
             yerr=_yerr([(y, intervals[r['variant']]) for y, r in zip(ys, sub)]))
    ax.set_xticks(range(len(groups)), ['MQA' if g == 1 else f'GQA-{g}' for g in groups])
    ax.set_ylabel(_quality_label(intervals))
    ax.set_title(f'Conversion methods, alpha={alpha_for_methods:g} (GQA Fig. 4)')
    _legend_outside(fig, ax, title='conversion')
    save(fig, 'fig4_conversion_methods.png')

  mean_rows = [r for r in rows if r['method'] == 'mean']
  if mean_rows:  # Figure 5
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for i, g in enumerate(sorted({r['kv_heads'] for r in mean_rows})):
      pts = sorted((r['alpha'], r['average'], intervals[r['variant']]) for r in mean_rows
                   if r['kv_heads'] == g)
      ax.errorbar([a for a, _, _ in pts], [s for _, s, _ in pts], capsize=3,
                  yerr=_yerr([(s, ci) for _, s, ci in pts]),
                  label='MQA' if g == 1 else f'GQA-{g}', **_style(i))
    for r in rows:
      if r['method'] is None and r['model'] == 'target':
        ax.axhline(r['average'], linestyle='--', color='gray', label=f"{r['label']} (no conversion)")
    ax.set_xlabel('Uptraining proportion alpha')
    ax.set_ylabel(_quality_label(intervals))
    ax.set_title('Uptraining proportion (GQA Fig. 5)')
    _legend_outside(fig, ax)
    save(fig, 'fig5_uptraining.png')

  if timing_rows:
    save(_fig6(plt, timing_rows, predicted_times), 'fig6_time_vs_groups.png')

  labels = {r['variant']: r['label'] for r in evaluate_rows if 'label' in r}
  spec_rows = spec_record.get('rows', [])
  batches = sorted({r.get('batch_size', spec_record.get('batch_size')) for r in spec_rows},
                   key=lambda b: (b is None, b))
  for b in batches:
    name = 'speculative_speedup.png' if len(batches) == 1 else f'speculative_speedup_b{b}.png'
    sub = [r for r in spec_rows if r.get('batch_size', spec_record.get('batch_size')) == b]
    save(_speculative(plt, sub, b, labels), name)
  chains = spec_record.get('drafts_rows', [])
  if chains:  # the drafts job: plain, distilled, Chimera and staged chains on the same batches
    save(_speculative(plt, chains, spec_record.get('batch_size'), labels, 'trained drafts'),
         'speculative_drafts_speedup.png')
  return written


def _fig6(plt, timing_rows: Sequence[Mapping], predicted: Mapping[Tuple[str, int], float]):
  """A panel per setting: measured time per sample vs K/V groups beside the bytes model."""
  settings = sorted({r['setting'] for r in timing_rows},
                    key=lambda s: min(r['inputs'] for r in timing_rows if r['setting'] == s))
  fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.4), squeeze=False)
  for ax, s in zip(axes[0], settings):
    rows = sorted((r for r in timing_rows if r['setting'] == s), key=lambda r: r['kv_heads'])
    g = [r['kv_heads'] for r in rows]
    ax.plot(g, [1000 * r['time_per_sample_s'] for r in rows], label='measured (median)',
            **_style(0))
    if all((s, x) in predicted for x in g):
      ax.plot(g, [1000 * predicted[(s, x)] for x in g], linestyle='--', mfc='none',
              label='bytes model (scale fitted)', **_style(1))
    ax.set_xscale('log', base=2)
    ax.set_xticks(g, [str(x) for x in g])
    ax.set_ylim(bottom=0)
    r0 = rows[0]
    ax.set_title(f"{s}: {r0['inputs']} in / {r0['targets']} out, batch {r0['batch_size']}",
                 fontsize=9)
    ax.set_xlabel('K/V groups (1 = MQA, H = MHA)')
  axes[0][0].set_ylabel('Time per sample (ms)')
  fig.suptitle('Time per sample vs K/V groups (GQA Fig. 6)', fontsize=10)
  fig.tight_layout()
  _legend_outside(fig, axes[0][0])
  return fig


def _speculative(plt, rows: Sequence[Mapping], batch: Optional[int], labels: Mapping[str, str],
                 what: str = ''):
  """Panels (task, target) x temperature; per draft measured (solid) and Theorem 8 (dashed)."""
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top
  panels = sorted({(r['task'], r['target']) for r in rows})
  temps = sorted({r['temperature'] for r in rows})
  drafts = sorted({r['draft'] for r in rows})
  fig, axes = plt.subplots(len(panels), len(temps), figsize=(3.6 * len(temps), 2.7 * len(panels)),
                           squeeze=False, sharex=True)
  top = max([1.0] + [max(r['speedup_measured'], r['speedup_thm8_with_v']) for r in rows])
  for (i, (task, target)), (j, temp) in ((p, t) for p in enumerate(panels) for t in enumerate(temps)):
    ax = axes[i][j]
    for k, d in enumerate(drafts):
      pts = sorted((r['gamma'], r['speedup_measured'], r['speedup_thm8_with_v']) for r in rows
                   if (r['task'], r['target'], r['temperature'], r['draft']) == (task, target, temp, d))
      if not pts:
        continue
      style = _style(k)
      ax.plot([p[0] for p in pts], [p[1] for p in pts], **style)
      ax.plot([p[0] for p in pts], [p[2] for p in pts], linestyle='--', mfc='none', **style)
    ax.axhline(1.0, color='gray', linestyle=':', linewidth=1)
    ax.set_ylim(0, 1.05 * top)
    short = TASK_LABELS.get(task, task).split(' (')[0]
    ax.set_title(f'{short} | {labels.get(target, target)} | T={temp:g}', fontsize=8)
    ax.set_xticks(sorted({r['gamma'] for r in rows}))
    if i == len(panels) - 1:
      ax.set_xlabel('gamma')
    if j == 0:
      ax.set_ylabel('speedup vs autoregressive', fontsize=8)
  handles = [Line2D([], [], linestyle='-', **_style(k)) for k in range(len(drafts))]
  handles += [Line2D([], [], color='black', linestyle='-'),
              Line2D([], [], color='black', linestyle='--')]
  labels = list(drafts) + ['measured (median)', 'Theorem 8, measured c and v(gamma)']
  fig.suptitle(f"Speculative decoding speedup{', ' + what if what else ''}, batch {batch}",
               fontsize=10)
  fig.tight_layout()
  _legend_outside(fig, None, handles, labels, title='draft / line')
  return fig
