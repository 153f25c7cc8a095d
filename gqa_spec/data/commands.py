"""`gqa-spec data {fetch,prepare,show,vocab,export,list}`: the DDTP corpus, vocabularies, task previews
and TensorFlow-free exports."""

from __future__ import annotations

import argparse
import itertools
import os
from typing import Iterator, List

from gqa_spec import arguments
from gqa_spec.errors import UserError


def _add_dirs(parser: argparse.ArgumentParser):
  parser.add_argument('--data-dir', default=None,
                      help='prepared DDTP dir (default $GQA_SPEC_DATA_DIR or ~/.cache/gqa_spec/ddtp)')
  parser.add_argument('--vocab', default=None,
                      help='SentencePiece model (default $GQA_SPEC_VOCAB or DATA_DIR/sentencepiece.model)')


def _register(args):
  """Imports the task registry, pointed at --data-dir/--vocab when given."""
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top  (TF import is slow)
  if args.data_dir or args.vocab:
    tasks.register_ddtp_tasks(args.data_dir, args.vocab)
    tasks.register_paper_tasks(args.vocab)
  return tasks


def _fetch(args) -> int:
  from gqa_spec.data import corpus  # pylint: disable=g-import-not-at-top
  print(f'Translation files in {corpus.fetch()}; now run `gqa-spec data prepare`')
  return 0


def _prepare(args) -> int:
  from gqa_spec.data import corpus, ddtp  # pylint: disable=g-import-not-at-top
  data_dir = args.data_dir or corpus.default_data_dir()
  stats = corpus.prepare(args.lists_dir or ddtp.APT_LISTS_DIR, data_dir, args.vocab_size,
                         train_vocab=not args.no_vocab)
  reader = stats['reader']
  for lang in sorted(reader['parsed']):
    print(f'{lang}: {reader["parsed"][lang]} records from {len(reader["files"][lang])} file(s), '
          f'{reader["malformed"][lang]} malformed (not used)')
  if reader['orphan_translations']:
    print(f'{reader["orphan_translations"]} translations have no English record (not used)')
  for path in reader['truncated_files']:
    print(f'warning: {path} is truncated; its last record was dropped and counted as malformed')
  print(f'splits written to {data_dir}:')
  print(corpus.format_stats(stats))
  if 'vocabulary' in stats:
    v = stats['vocabulary']
    print(f'vocabulary: {v["path"]} ({v["pieces"]} pieces + {v["extra_ids"]} extra ids)')
  return 0


def _render(ids: List[int], vocab) -> str:
  """Decodes token ids, showing sentinels as <extra_id_N> and EOS as </s>."""
  base = vocab.vocab_size - vocab.extra_ids
  out, run = [], []
  for i in ids:
    if i >= base or i == vocab.eos_id:
      out.append(vocab.decode(run))
      out.append('</s>' if i == vocab.eos_id else f'<extra_id_{vocab.vocab_size - 1 - i}>')
      run = []
    elif i != vocab.pad_id:
      run.append(i)
  out.append(vocab.decode(run))
  return ' '.join(s for s in out if s)


def _show(args) -> int:
  tasks = _register(args)
  task = tasks.get(args.task)
  lengths = tasks.feature_lengths(args.task)
  if args.lengths:
    lengths = _lengths(args.lengths)
  vocab = task.output_features['targets'].vocabulary
  if not os.path.exists(vocab.sentencepiece_model_file):
    raise UserError(f'no vocabulary at {vocab.sentencepiece_model_file}; run `gqa-spec data '
                    'prepare` or pass --vocab')
  _check_split(task, args.task, args.split)
  ds = task.get_dataset(lengths, split=args.split, shuffle=False, num_epochs=1, seed=args.seed)
  examples: Iterator = ds.take(args.n).as_numpy_iterator()
  shown = 0
  for i, example in enumerate(itertools.islice(examples, args.n)):
    print(f'--- {args.task} [{args.split}] example {i}')
    for key in ('inputs', 'targets'):
      ids = example[key].tolist()
      print(f'{key} ({len(ids)} tokens): {_render(ids, vocab)}')
    shown += 1
  if shown == 0:
    print(f'{args.task} has no {args.split} examples')
  return 0


def _check_split(task, name: str, split: str) -> None:
  """A split the task (every task of a mixture) does not have: `UserError` listing those it has."""
  members = getattr(task, 'tasks', None) or [task]
  splits = set.intersection(*(set(t.splits) for t in members))
  if split not in splits:
    raise UserError(f'{name} has no split {split!r}; its splits: {", ".join(sorted(splits))}')


def _vocab(args) -> int:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gqa_spec.data import vocabulary  # pylint: disable=g-import-not-at-top
  tasks = _register(args)
  task = tasks.get(args.task)
  if not hasattr(task, 'source'):
    raise UserError(f'{args.task} is a mixture; train the vocabulary on one of its tasks')
  arguments.check_outputs({'--output': args.output})
  _check_split(task, args.task, args.split)
  ds = task.source.get_dataset(split=args.split, shuffle=False)
  if args.max_examples:
    ds = ds.take(args.max_examples)
  keys = [k for k, spec in ds.element_spec.items()
          if isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string and spec.shape.rank == 0]

  def texts():
    for example in ds.as_numpy_iterator():
      for key in keys:
        yield example[key].decode('utf-8', errors='replace')

  path = vocabulary.train_sentencepiece(texts(), args.output, args.size)
  print(f'vocabulary: {path} ({args.size} pieces + {vocabulary.EXTRA_IDS} extra ids, trained on '
        f'{args.task} {args.split}: {", ".join(keys)})')
  return 0


def _list(args) -> int:
  tasks = _register(args)
  import seqio  # pylint: disable=g-import-not-at-top
  for name in sorted(tasks._FEATURE_LENGTHS):  # pylint: disable=protected-access
    kind = 'mixture' if name in seqio.MixtureRegistry.names() else 'task'
    lengths = tasks.feature_lengths(name)
    print(f'{name:24s} {kind:8s} inputs={lengths["inputs"]} targets={lengths["targets"]}')
  return 0


def _lengths(text: str):
  try:
    inputs, targets = (int(x) for x in text.split(','))
  except ValueError:
    raise UserError(f'--lengths takes INPUTS,TARGETS (two integers), got {text!r}') from None
  return {'inputs': inputs, 'targets': targets}


def _export(args) -> int:
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    raise UserError(f'--out {args.out} is a file; give an export directory (new or existing: '
                    'tasks exported before stay beside the new ones)')
  arguments.check_outputs({'--out': args.out}, directories=True)  # before any task is read
  _register(args)
  from gqa_spec.data import export  # pylint: disable=g-import-not-at-top
  manifests = export.export(args.tasks, args.out,
                            args.splits.split(',') if args.splits else None,
                            _lengths(args.lengths) if args.lengths else None, args.max_examples,
                            args.seed)
  for m in manifests:
    counts = ', '.join(f'{s} {v["examples"]}' for s, v in m['splits'].items())
    print(f'{m["task"]}: {counts} examples at {m["lengths"]["inputs"]}/{m["lengths"]["targets"]} '
          f'({m["dtype"]}, sha256 {m["content_sha256"][:12]})')
  print(f'exported to {args.out}; read it as exported:{os.path.abspath(args.out)}/TASK')
  return 0


def register(subparsers):
  """Adds `data` and its sub-commands to the CLI."""
  data = subparsers.add_parser('data', help='DDTP corpus, vocabularies, seqio tasks')
  sub = data.add_subparsers(dest='data_command', metavar='DATA_COMMAND')
  sub.required = True

  p = sub.add_parser('fetch', help='ask apt for the English and German Translation files')
  p.set_defaults(func=_fetch)

  p = sub.add_parser('prepare', help='read, split and store the DDTP corpus; train a vocabulary')
  p.add_argument('--lists-dir', default=None,
                 help='directory of *_i18n_Translation-{en,de}* files (default /var/lib/apt/lists)')
  p.add_argument('--data-dir', default=None, help='output directory')
  p.add_argument('--vocab-size', type=arguments.positive_int, default=8000,
                 help='SentencePiece pieces (+100 extra ids)')
  p.add_argument('--no-vocab', action='store_true', help='skip training the vocabulary')
  p.set_defaults(func=_prepare)

  p = sub.add_parser('show', help='print preprocessed examples of a registered task')
  p.add_argument('task')
  p.add_argument('--split', default='validation')
  p.add_argument('-n', type=arguments.positive_int, default=3, help='number of examples')
  p.add_argument('--lengths', default=None, help='INPUTS,TARGETS feature lengths')
  p.add_argument('--seed', type=int, default=0)
  _add_dirs(p)
  p.set_defaults(func=_show)

  p = sub.add_parser('vocab', help="train a SentencePiece model on a task's raw text")
  p.add_argument('--task', default='ddtp_span_corruption')
  p.add_argument('--split', default='train')
  p.add_argument('--size', type=arguments.positive_int, default=8000,
                 help='pieces (+100 extra ids)')
  p.add_argument('--max-examples', type=arguments.positive_int, default=None)
  p.add_argument('--output', required=True, help='path of the .model file to write')
  _add_dirs(p)
  p.set_defaults(func=_vocab)

  p = sub.add_parser('export', help='write tasks to a directory that training, eval and infer read '
                                    'without TensorFlow (exported:DIR/TASK)')
  p.add_argument('tasks', nargs='+', metavar='TASK', help='registered tasks or mixtures')
  p.add_argument('--out', required=True, help='export directory')
  p.add_argument('--splits', default=None, help='comma-separated splits (default: all of each task)')
  p.add_argument('--lengths', default=None,
                 help="INPUTS,TARGETS feature lengths (default: each task's)")
  p.add_argument('--max-examples', type=arguments.positive_int, default=None,
                 help='at most N examples per split')
  p.add_argument('--seed', type=int, default=0, help='seed of random preprocessors (span corruption)')
  _add_dirs(p)
  p.set_defaults(func=_export)

  p = sub.add_parser('list', help='registered tasks and their default feature lengths')
  _add_dirs(p)
  p.set_defaults(func=_list)
