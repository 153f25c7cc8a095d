"""The calibration record as files: `calibration.json`, `calibration.png` (small multiples) and
`calibration.md` (one table per sweep), all carrying the command that produced them."""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from gqa_spec import atomic
from gqa_spec.reproduce.report import markdown_table

MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '*')


def write(out_dir: str, record: Mapping) -> None:
  # The temporary name has the pid: two runs may share out_dir.
  atomic.write_json(os.path.join(out_dir, 'calibration.json'), record, indent=1, sort_keys=True)
  plot(os.path.join(out_dir, 'calibration.png'), record)
  atomic.write_text(os.path.join(out_dir, 'calibration.md'), markdown(record))


def _metric_keys(points: Sequence[Mapping]) -> list:
  skip = {'step', 'wall_seconds', 'cpu_seconds', 'load1', 'val_loss'}
  return sorted({k for p in points for row in p['curve'] for k in row
                 if k not in skip and not k.startswith('val_loss/')})


def size_comparisons(record: Mapping) -> list:
  """[(title, [(sweep name, point), ...])]: pre-training points of one role and task that trained
  different models (the target-size sweep), to compare at equal CPU time."""
  groups = {}
  for s in record['sweeps']:
    if s['stage'] == 'pretrain':
      groups.setdefault((s['role'], s['task']), []).extend((s['name'], p) for p in s['points'])
  return [(f'{role} size on {task}: at equal CPU time', points)
          for (role, task), points in groups.items()
          if len({p.get('model') for _, p in points}) > 1]


def _plot_sizes(axes, title: str, points, colors) -> None:
  """Val loss, the per-task val losses and the task metrics, each vs CPU seconds."""
  for i, (name, p) in enumerate(points):
    style = dict(color=colors[i % len(colors)], marker=MARKERS[i % len(MARKERS)], ms=4)
    cpu = [row['cpu_seconds'] for row in p['curve']]
    label = f"{p.get('model')} ({name} {p['label']})"
    axes[0].plot(cpu, [row['val_loss'] for row in p['curve']], label=label, **style)
    tasks = sorted(k for k in p['curve'][-1] if k.startswith('val_loss/'))
    for j, k in enumerate(tasks):
      axes[1].plot(cpu, [row.get(k) for row in p['curve']], ls=('-', '--', ':')[j % 3],
                   label=f"{p.get('model')} {k.split('/')[1]}", **style)
    for j, m in enumerate(_metric_keys([p])):
      axes[2].plot(cpu, [row.get(m) for row in p['curve']], ls=('-', '--', ':')[j % 3],
                   label=f"{p.get('model')} {m}", **style)
  axes[0].set(xlabel='CPU seconds training (this process)', ylabel='validation loss', title=title)
  axes[1].set(xlabel='CPU seconds training (this process)', ylabel='validation loss per task',
              title='per task')
  axes[2].set(xlabel='CPU seconds training (this process)', ylabel='bleu / rouge1',
              title='validation slice')
  for ax in axes:
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # (span corruption has no task metrics)
      ax.legend(fontsize=6, frameon=False)


def plot(path: str, record: Mapping) -> None:
  """One row per sweep: val loss vs step, vs wall seconds, and task metric vs step (fine-tuning)
  or val loss vs this process's CPU seconds (pre-training: less sensitive to the machine's load);
  then one row per `size_comparisons` group."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  sweeps = [s for s in record['sweeps'] if s['points']]
  sizes = size_comparisons(record)
  rows = max(1, len(sweeps) + len(sizes))
  fig, axes = plt.subplots(rows, 3, figsize=(15, 2.9 * rows), squeeze=False)
  colors = plt.get_cmap('tab10').colors
  for r, sweep in enumerate(sweeps):
    metrics = _metric_keys(sweep['points'])
    for i, p in enumerate(sweep['points']):
      style = dict(color=colors[i % len(colors)], marker=MARKERS[i % len(MARKERS)], ms=4,
                   label=p['label'])
      steps = [row['step'] for row in p['curve']]
      loss = [row['val_loss'] for row in p['curve']]
      axes[r, 0].plot(steps, loss, **style)
      axes[r, 1].plot([row['wall_seconds'] for row in p['curve']], loss, **style)
      if not metrics:
        axes[r, 2].plot([row['cpu_seconds'] for row in p['curve']], loss, **style)
      for j, m in enumerate(metrics):
        axes[r, 2].plot(steps, [row.get(m) for row in p['curve']],
                        **dict(style, ls=('-', '--', ':')[j % 3],
                               label=f"{p['label']} {m}" if len(metrics) > 1 else p['label']))
    axes[r, 0].set(xlabel='step', ylabel='validation loss', title=sweep['name'])
    axes[r, 1].set(xlabel='wall seconds training (loaded machine)', ylabel='validation loss',
                   title=f"{sweep['name']}: loss vs time")
    if metrics:
      axes[r, 2].set(xlabel='step', ylabel=' / '.join(sorted({m.split('/')[0] for m in metrics})),
                     title=f"{sweep['name']}: validation slice ({record['metric_examples']} ex.)")
      axes[r, 2].legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    else:
      axes[r, 2].set(xlabel='CPU seconds training (this process)', ylabel='validation loss',
                     title=f"{sweep['name']}: loss vs CPU time")
      axes[r, 2].legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    for ax in axes[r]:
      ax.grid(alpha=0.3)
  for r, (title, points) in enumerate(sizes, len(sweeps)):
    _plot_sizes(axes[r], title, points, colors)
  if not sweeps:
    axes[0, 0].text(0.5, 0.5, 'no finished points yet', ha='center')
  status = record['status'] + (f" ({record['pending_points']} point(s) pending)"
                               if record['pending_points'] else '')
  fig.suptitle(f"{record['command']}  [{status}]", fontsize=10)
  fig.tight_layout(rect=(0, 0, 1, 0.98))
  with atomic.open_for_write(path, 'wb') as f:
    fig.savefig(f, format='png', dpi=100)
  plt.close(fig)


def _fmt(x, digits=3) -> str:
  return '-' if x is None else f'{x:.{digits}f}'


def markdown(record: Mapping) -> str:
  lines = [f"# Calibration: preset `{record['preset']}` ({record['status']})", '',
           f"Command: `{record['command']}`", '',
           f"Machine: {record['machine']}. Wall seconds are contaminated by other processes on the "
           'machine; `load1` is the 1-minute load average at each evaluation, CPU seconds are this '
           'process\'s.', '',
           f"Validation loss: {record['val_batches']} validation batches per point; BLEU / ROUGE-1: "
           f"greedy, first {record['metric_examples']} validation examples.", '',
           '![calibration.png](calibration.png)', '']
  for sweep in record['sweeps']:
    lines += [f"## {sweep['name']} ({sweep['task']})", '']
    metrics = _metric_keys(sweep['points'])
    rows = []
    for p in sweep['points']:
      last = p['curve'][-1]
      loads = [row['load1'] for row in p['curve']]
      rows.append([p['label'], p.get('model', '-'), p['steps'], p['batch'],
                   _fmt(p['final_val_loss']), _fmt(p['final_train_loss'])] +
                  [_fmt(last.get(m), 2) for m in metrics] +
                  [_fmt(p['seconds_per_step'], 2), _fmt(p['cpu_seconds_per_step'], 2),
                   _fmt(last['wall_seconds'], 0), f'{min(loads):.1f}-{max(loads):.1f}'])
    lines.append(markdown_table(
        ['point', 'model', 'steps', 'batch', 'val loss', 'train loss'] + metrics +
        ['s/step', 'CPU s/step', 'train wall s', 'load1'], rows))
    if sweep['pending']:
      lines += ['', f"Not run yet: {', '.join(sweep['pending'])}"]
    lines.append('')
  for title, points in size_comparisons(record):
    keys = sorted({k for _, p in points for row in p['curve'] for k in row
                   if k.startswith('val_loss/')}) + _metric_keys([p for _, p in points])
    rows = [[p.get('model', '-'), row['step'], _fmt(row['cpu_seconds'], 0),
             _fmt(row['val_loss'])] + [_fmt(row.get(k), 2) for k in keys]
            for _, p in points for row in p['curve']]
    lines += [f'## {title[0].upper()}{title[1:]}', '',
              markdown_table(['model', 'step', 'CPU s', 'val loss'] + keys,
                             sorted(rows, key=lambda r: float(r[2]))), '']
  return '\n'.join(lines)
