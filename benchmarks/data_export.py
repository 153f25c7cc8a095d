"""Read throughput of the exported-data formats: memory-mapped numpy arrays vs ArrayRecord (grain).

The same synthetic corpus (uint16 token ids, span-corruption-like lengths) is written both ways:
  npy          `gqa_spec.data.export.write_tokens`: flat tokens + int64 offsets per feature, read
               through `np.load(mmap_mode='r')` (what `gqa_spec.data.exported` reads)
  arrayrecord  one record per example (inputs and targets uint16, a 4-byte inputs length first),
               read through grain's `ArrayRecordDataSource` (MaxText's input path), when grain is
               importable (`--grain-path` puts a `pip install --target` copy on sys.path)
and read in one random order (a shuffled epoch: random access is what a seeded shuffle needs).
`pipeline` is `exported.get_batches` end to end (seqio's packing, shuffled) on the npy copy: the
model-ready rows per second one host core delivers.

  python -m benchmarks.data_export --examples 50000 --reads 20000 --repeats 5 \
      --grain-path /tmp/grainpkg
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from benchmarks import common
from gqa_spec.data import export, exported

LENGTHS = {'inputs': 512, 'targets': 114}


def corpus(n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  inputs = [rng.integers(2, 8192, rng.integers(16, LENGTHS['inputs'] + 1)).astype(np.uint16)
            for _ in range(n)]
  targets = [rng.integers(2, 8192, rng.integers(4, LENGTHS['targets'] + 1)).astype(np.uint16)
             for _ in range(n)]
  for seq in inputs + targets:
    seq[-1] = 1  # EOS
  return inputs, targets


def write_npy(root: str, inputs, targets) -> str:
  task_dir = os.path.join(root, 'synthetic')
  os.makedirs(task_dir, exist_ok=True)
  export.write_tokens(task_dir, 'train', 'inputs', inputs, np.uint16)
  export.write_tokens(task_dir, 'train', 'targets', targets, np.uint16)
  with open(exported.text_path(task_dir, 'train'), 'w') as f:
    f.write('{}\n' * len(inputs))
  manifest = {'format_version': exported.FORMAT_VERSION, 'task': 'synthetic',
              'splits': {'train': {'examples': len(inputs)}}, 'lengths': LENGTHS,
              'length_dependent': False, 'add_eos': {'inputs': True, 'targets': True},
              'metric_fns': [], 'postprocess_fn': None, 'vocabulary': None}
  with open(os.path.join(task_dir, exported.MANIFEST), 'w') as f:
    json.dump(manifest, f)
  return task_dir


def write_arrayrecord(root: str, inputs, targets) -> str:
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  path = os.path.join(root, 'train.array_record')
  writer = array_record_module.ArrayRecordWriter(path, 'group_size:1')
  for i, t in zip(inputs, targets):
    writer.write(np.uint32(len(i)).tobytes() + i.tobytes() + t.tobytes())
  writer.close()
  return path


def read_npy(task_dir: str, order: np.ndarray) -> int:
  task = exported.ExportedTask(task_dir)
  tokens = 0
  for i in order.tolist():
    example = task.example('train', i, LENGTHS)
    tokens += len(example['inputs']) + len(example['targets'])
  return tokens


def read_arrayrecord(path: str, order: np.ndarray) -> int:
  import grain.python as grain  # pylint: disable=g-import-not-at-top
  source = grain.ArrayRecordDataSource([path])
  tokens = 0
  for i in order.tolist():
    record = source[i]
    n = int(np.frombuffer(record[:4], np.uint32)[0])
    flat = np.frombuffer(record[4:], np.uint16)
    example = {'inputs': flat[:n].astype(np.int32), 'targets': flat[n:].astype(np.int32)}
    tokens += len(example['inputs']) + len(example['targets'])
  return tokens


def pipeline(task_dir: str, batches: int, batch_size: int) -> int:
  it = exported.get_batches(f'{exported.PREFIX}{task_dir}', 'train', LENGTHS, batch_size, seed=0)
  rows = 0
  for _ in range(batches):
    rows += len(next(it)['encoder_input_tokens'])
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--examples', type=int, default=50_000)
  parser.add_argument('--reads', type=int, default=20_000, help='examples read per repeat')
  parser.add_argument('--batches', type=int, default=100, help='pipeline batches per repeat')
  parser.add_argument('--batch-size', type=int, default=16)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--grain-path', default=None, help='directory with grain (pip --target)')
  common.add_out_argument(parser, __file__)
  args = parser.parse_args(argv)
  if args.grain_path:
    sys.path.insert(0, args.grain_path)
  try:
    import grain.python  # pylint: disable=g-import-not-at-top,unused-import
    have_grain = True
  except ImportError:
    have_grain = False
  load_before = os.getloadavg()
  inputs, targets = corpus(args.examples)
  total_tokens = sum(len(i) + len(t) for i, t in zip(inputs, targets))
  rows = []
  with tempfile.TemporaryDirectory() as root:
    task_dir = write_npy(root, inputs, targets)
    sizes = {'npy': sum(os.path.getsize(os.path.join(task_dir, f)) for f in os.listdir(task_dir)
                        if f.endswith('.npy'))}
    readers = {'npy': lambda o: read_npy(task_dir, o)}
    if have_grain:
      record_path = write_arrayrecord(root, inputs, targets)
      sizes['arrayrecord'] = os.path.getsize(record_path)
      readers['arrayrecord'] = lambda o: read_arrayrecord(record_path, o)
    times = {name: [] for name in readers}
    times['pipeline'] = []
    for r in range(args.repeats):
      order = np.random.default_rng(r).permutation(args.examples)[:args.reads]
      for name in (list(readers) if r % 2 == 0 else list(readers)[::-1]):  # alternate the order
        start = time.perf_counter()
        tokens = readers[name](order)
        times[name].append(time.perf_counter() - start)
      start = time.perf_counter()
      n_rows = pipeline(task_dir, args.batches, args.batch_size)
      times['pipeline'].append(time.perf_counter() - start)
    for name in readers:
      median = statistics.median(times[name])
      rows.append({'format': name, 'examples_per_s': args.reads / median,
                   'tokens_per_s': tokens / median, 'bytes': sizes[name],
                   'bytes_per_token': sizes[name] / total_tokens})
    median = statistics.median(times['pipeline'])
    rows.append({'format': 'pipeline', 'rows_per_s': n_rows / median,
                 'tokens_per_s': n_rows * sum(LENGTHS.values()) / median})
  report = common.results(__file__, argv, rows, load_before, examples=args.examples,
                          reads=args.reads, repeats=args.repeats, lengths=LENGTHS,
                          grain=have_grain)
  common.write_json(args.out, report)
  lines = markdown(report)
  common.write_markdown(args.out + '.md', lines, report['machine'])
  print('\n'.join(lines))


def markdown(report: dict) -> list:
  rows = {r['format']: r for r in report['rows']}
  lines = common.heading('Exported data: read throughput, memory-mapped numpy vs ArrayRecord '
                         '(grain)', report['command'])
  lines += [f"{report['examples']} synthetic examples (uint16 tokens, inputs 16-512, targets "
            f"4-114); {report['reads']} read in a random order, one process, one thread; medians "
            f"over {report['repeats']} repeats (formats alternate their order). "
            + common.load_note(*report['loadavg_before_after'],
                               ' (other jobs shared the machine).'), '']
  lines += common.table_head(('format', 'examples/s', 'tokens/s', 'bytes/token'))
  for name in ('npy', 'arrayrecord'):
    if name in rows:
      r = rows[name]
      lines.append(f"| {name} | {r['examples_per_s']:.0f} | {r['tokens_per_s']:.3g} | "
                   f"{r['bytes_per_token']:.2f} |")
  p = rows['pipeline']
  lines += ['', f"`exported.get_batches` (npy, packed {report['lengths']['inputs']}/"
                f"{report['lengths']['targets']}, shuffled): {p['rows_per_s']:.0f} rows/s = "
                f"{p['tokens_per_s']:.3g} padded tokens/s on one core."]
  return lines


if __name__ == '__main__':
  main()
