"""Stop latency and throughput of the train loop, bounded (2 steps queued) vs unbounded dispatch.

  python -m benchmarks.train_stop [--model mini] [--batch 32] [--lengths 128,32] [--repeats 2] \
      [--out results/benchmarks/train_stop]

Both variants are the same `trainer.train`; "unbounded" sets `trainer.MAX_IN_FLIGHT` to a huge
number, which is the loop before the bound (the host waited only at logging and saving). Side by
side, interleaved, on synthetic packed batches:
  * throughput: tokens/s over the logging windows after the first (compilation excluded),
    `log_period` 10, no intermediate saves;
  * stop latency: SIGTERM (from a thread, to this process) once `--signal-after` steps have been
    dispatched; seconds from the signal until `train` returned with its checkpoint saved, and the
    steps run after the signal (`log_period` 100, as a default run: the unbounded loop only
    synchronises there).
The persistent compilation cache keeps later repeats from recompiling.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import tempfile
import threading
import time

import jax

from benchmarks import common
from gqa_spec import rundir
from gqa_spec.models.config import preset
from gqa_spec.training import data, optimizer, summaries as metrics, trainer

UNBOUNDED = 10**9


def _run(model_dir, config, dataset, total_steps, log_period, signal_after=None):
  """`(result, seconds from signal to return, steps dispatched at the signal)`."""
  dispatched = [0]
  sent = [None, None]
  original = trainer.get_batches

  def counting_batches(*args, **kwargs):
    for batch in original(*args, **kwargs):
      dispatched[0] += 1
      if signal_after is not None and dispatched[0] == signal_after + 1 and sent[0] is None:
        sent[0], sent[1] = time.time(), dispatched[0] - 1
        threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM)).start()
      yield batch

  trainer.get_batches = counting_batches
  try:
    result = trainer.train(
        model_dir=model_dir, model_config=config, train_dataset_cfg=dataset,
        total_steps=total_steps, optimizer=optimizer.adafactor(),
        learning_rate_fn=optimizer.rsqrt_decay(warmup_steps=100), log_period=log_period,
        checkpoint_cfg=trainer.CheckpointConfig(save_period=10**6, keep=1), progress_bar=False)
  finally:
    trainer.get_batches = original
  latency = time.time() - sent[0] if sent[0] is not None else None
  return result, latency, sent[1]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='mini')
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--lengths', default='128,32', help='inputs,targets')
  parser.add_argument('--steps', type=int, default=40, help='steps of a throughput run')
  parser.add_argument('--signal-after', type=int, default=15, help='steps dispatched at SIGTERM')
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--unbounded-first', action='store_true', help='order within a repeat')
  common.add_out_argument(parser, __file__)
  args = parser.parse_args()
  jax.config.update('jax_compilation_cache_dir', os.path.join(tempfile.gettempdir(),
                                                               'gqa_spec_train_stop_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  inputs, targets = map(int, args.lengths.split(','))
  config = preset(args.model)
  dataset = data.DatasetConfig('synthetic', {'inputs': inputs, 'targets': targets},
                               batch_size=args.batch)
  rows = {name: {'tokens_per_second': [], 'step_seconds': [], 'stop_latency_s': [],
                 'steps_after_signal': []} for name in ('bounded', 'unbounded')}
  loads = [os.getloadavg()]
  for repeat in range(args.repeats):
    order = (('bounded', 2), ('unbounded', UNBOUNDED))
    for name, in_flight in order[::-1] if args.unbounded_first else order:
      trainer.MAX_IN_FLIGHT = in_flight
      with tempfile.TemporaryDirectory() as tmp:
        _run(tmp, config, dataset, args.steps, log_period=10)
        windows = [r for r in metrics.read_records(os.path.join(tmp, rundir.TRAIN_LOG_FILE))
                   if r['split'] == 'train'][1:]
        rows[name]['tokens_per_second'] += [r['timing/tokens_per_second'] for r in windows]
        rows[name]['step_seconds'] += [1 / r['timing/steps_per_second'] for r in windows]
      with tempfile.TemporaryDirectory() as tmp:
        result, latency, at = _run(tmp, config, dataset, 10**6, log_period=100,
                                   signal_after=args.signal_after)
        rows[name]['stop_latency_s'].append(latency)
        rows[name]['steps_after_signal'].append(result.step - at)
      loads.append(os.getloadavg())
      print(name, repeat, {k: v[-1] for k, v in rows[name].items()}, flush=True)
  trainer.MAX_IN_FLIGHT = 2
  summary = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in rows.items()}
  out = {'command': 'python -m benchmarks.train_stop ' + ' '.join(
             f'--{k.replace("_", "-")} {v}' for k, v in vars(args).items()
             if k not in ('out', 'unbounded_first')) + (' --unbounded-first' if args.unbounded_first
                                                        else ''),
         'model': args.model, 'batch': args.batch, 'lengths': [inputs, targets],
         'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, '
                    f'JAX {jax.__version__} on {jax.devices()[0].platform}',
         'loadavg': loads, 'raw': rows, 'median': summary}
  common.write_json(args.out, out, indent=1)
  lines = ['# Train loop: stop latency and throughput, bounded vs unbounded dispatch', '',
           f'Command: `{out["command"]}`', '', f'Machine: {out["machine"]}; load average '
           f'{loads[0][0]:.1f} -> {loads[-1][0]:.1f}'
           + (' (the machine was shared with other jobs).' if loads[0][0] > common.SHARED_LOAD
              else '.'), '',
           f'Model `{args.model}`, batch {args.batch}, lengths {inputs}/{targets}, synthetic '
           f'packed batches; medians over {args.repeats} interleaved repeats.', '',
           '| Loop | tokens/s | s/step | SIGTERM -> exit (s) | steps after SIGTERM |',
           '|---|---|---|---|---|']
  for name, s in summary.items():
    lines.append(f"| {name} | {s['tokens_per_second']:.0f} | {s['step_seconds']:.3f} | "
                 f"{s['stop_latency_s']:.1f} | {s['steps_after_signal']:.0f} |")
  common.write_lines(args.out + '.md', lines)
  print('\n'.join(lines))


if __name__ == '__main__':
  main()
