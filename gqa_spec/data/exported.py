"""Reading an exported task directory: model-ready batches, evaluation examples, metrics. No TF.

`gqa-spec data export` (`gqa_spec.data.export`) writes seqio tasks to a directory that this module
reads with numpy alone (plus sentencepiece to decode predictions), so training, evaluation and
inference run where TensorFlow and seqio are not installed. A run names exported data where it
would name a seqio task, with the prefix `exported:` (t5x's MIXTURE_OR_TASK_NAME, our gin macros,
`DatasetConfig`, `InferenceEvaluator`, `infer`):

  MIXTURE_OR_TASK_NAME = 'exported:/data/ddtp_export/ddtp_translate_en_de'   # a task
  MIXTURE_OR_TASK_NAME = 'exported:/data/ddtp_export/ddtp_translate_summarize'  # a mixture

Layout of `DIR/<task>/` (`manifest.json` describes it; `FORMAT_VERSION` below):
  <split>.<inputs|targets>.npy          all examples' token ids end to end, uint16 (or uint32)
  <split>.<inputs|targets>.offsets.npy  int64 [n + 1]: example i is tokens[offsets[i]:offsets[i+1]]
  <split>.text.jsonl                    per example, its raw strings (inputs/targets_pretokenized...)
and `DIR/vocab/<sha256 prefix>.model` the SentencePiece model as seqio loads it (sentinels added); a mixture is
`DIR/<mixture>/mixture.json` naming its tasks (exported beside it) and their rates.

Batches (`get_batches`) are what `seqio.get_dataset(..., feature_converter=EncDecFeatureConverter)`
yields, built by `gqa_spec.data.features` (seqio's packing, step by step). Order: unshuffled, the
exported order (seqio's with shuffle=False); shuffled, a fresh permutation of every task's examples
each epoch from `(seed, task, epoch)` (tf.data's buffer shuffle cannot be reproduced without TF: the
same examples, another order); a mixture draws each example's task by the rates, as seqio's
`sample_from_datasets`. A batch is a pure function of its index, so a resumed run that skips the
batches it consumed sees exactly the batches the uninterrupted run saw.

Lengths: examples were trimmed at export to the exported lengths; a run may ask for shorter ones
(each sequence is trimmed again, with EOS re-appended where seqio's append_eos_after_trim appends
it) unless the task's preprocessing after the cache point depends on the lengths (span
corruption), in which case only the exported lengths are allowed.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from gqa_spec.data import features
from gqa_spec.errors import UserError

PREFIX = 'exported:'
FORMAT_VERSION = 1
MANIFEST = 'manifest.json'
MIXTURE_FILE = 'mixture.json'
EOS = 1
_MIX_BLOCK = 4096  # task draws per random block of a mixture


def is_exported(name: str) -> bool:
  """Whether a task name names an exported directory (`exported:DIR/task`)."""
  return isinstance(name, str) and name.startswith(PREFIX)


def token_path(task_dir: str, split: str, key: str, offsets: bool = False) -> str:
  return os.path.join(task_dir, f'{split}.{key}{".offsets" if offsets else ""}.npy')


def text_path(task_dir: str, split: str) -> str:
  return os.path.join(task_dir, f'{split}.text.jsonl')


class Vocabulary:
  """Decoding as `seqio.SentencePieceVocabulary` decodes, with sentencepiece only.

  The exported model already holds seqio's sentinel pieces (`<extra_id_N>`); as seqio, decoding
  cuts after the first EOS, maps ids beyond the pieces to UNK, and lets SentencePiece drop the
  PAD/EOS controls.
  """

  def __init__(self, path: str):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.path = path
    self._sp = spm.SentencePieceProcessor(model_file=path)
    self.vocab_size = self._sp.GetPieceSize()

  def decode(self, ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids]
    if EOS in ids:
      ids = ids[:ids.index(EOS) + 1]
    return self._sp.DecodeIds([self._sp.unk_id() if i >= self.vocab_size else i for i in ids])


def _import(qualified: Optional[str]) -> Optional[Callable]:
  """`module:function` -> the function (metric and postprocess functions of a task)."""
  if not qualified:
    return None
  module, _, name = qualified.partition(':')
  try:
    return getattr(importlib.import_module(module), name)
  except (ImportError, AttributeError) as e:
    raise UserError(f'cannot import {qualified} named by an exported task: {e}') from e


class ExportedTask:
  """One exported task: its manifest, token arrays (memory-mapped), texts, vocabulary, metrics."""

  def __init__(self, task_dir: str):
    path = os.path.join(task_dir, MANIFEST)
    if not os.path.isfile(path):
      raise UserError(f'{task_dir} is not an exported task (no {MANIFEST}); write one with '
                      '`gqa-spec data export TASK --out DIR`')
    with open(path) as f:
      self.manifest = json.load(f)
    if self.manifest.get('format_version') != FORMAT_VERSION:
      raise UserError(f'{path}: export format {self.manifest.get("format_version")}, this reader '
                      f'reads {FORMAT_VERSION}; export the task again')
    self.dir = task_dir
    self.name = self.manifest['task']
    self.lengths = dict(self.manifest['lengths'])
    self.metric_fns = [_import(m) for m in self.manifest['metric_fns']]
    self.postprocess_fn = _import(self.manifest.get('postprocess_fn'))

  @functools.cached_property
  def vocabulary(self) -> Vocabulary:
    return Vocabulary(os.path.join(os.path.dirname(self.dir), self.manifest['vocabulary']))

  def check(self, split: str, lengths: Mapping[str, int]) -> None:
    """Raises a UserError unless `split` was exported and can be read at `lengths`."""
    if split not in self.manifest['splits']:
      raise UserError(f'{self.name} has no exported split {split!r}; exported: '
                      f'{", ".join(self.manifest["splits"])}')
    for key in features.KEYS:
      want, have = lengths[key], self.lengths[key]
      if want > have or (want != have and self.manifest['length_dependent']):
        allowed = ('exactly' if self.manifest['length_dependent'] else 'at most')
        raise UserError(f'{self.name} was exported with {key} length {have}; it can be read at '
                        f'{allowed} that (asked {want}); export it again with --lengths')

  def num_examples(self, split: str) -> int:
    return int(self.manifest['splits'][split]['examples'])

  @functools.lru_cache(maxsize=None)
  def _arrays(self, split: str, key: str) -> Tuple[np.ndarray, np.ndarray]:
    tokens = np.load(token_path(self.dir, split, key), mmap_mode='r')
    offsets = np.load(token_path(self.dir, split, key, offsets=True))
    if offsets[-1] != len(tokens) or len(offsets) != self.num_examples(split) + 1:
      raise UserError(f'{token_path(self.dir, split, key)} does not match its offsets or the '
                      'manifest (a partial copy?); export the task again')
    return tokens, offsets

  def token_lengths(self, split: str, lengths: Mapping[str, int]) -> np.ndarray:
    """`[n, 2]` (inputs, targets) token counts after trimming to `lengths`."""
    return np.stack([np.minimum(np.diff(self._arrays(split, k)[1]), lengths[k])
                     for k in features.KEYS], axis=1)

  def example(self, split: str, index: int, lengths: Mapping[str, int]) -> Dict[str, np.ndarray]:
    """Example `index` of `split` as int32 token arrays trimmed to `lengths`."""
    out = {}
    for key in features.KEYS:
      tokens, offsets = self._arrays(split, key)
      seq = np.asarray(tokens[offsets[index]:offsets[index + 1]], np.int32)  # [n]
      if len(seq) > lengths[key]:  # seqio's append_eos_after_trim at the shorter length
        seq = seq[:lengths[key]].copy()
        if self.manifest['add_eos'][key]:
          seq[-1] = EOS
      out[key] = seq
    return out

  def texts(self, split: str) -> List[Dict[str, Any]]:
    """Per example, the raw features stored beside the tokens (`*_pretokenized`, `answers`...)."""
    with open(text_path(self.dir, split)) as f:
      return [json.loads(line) for line in f]


def resolve(name: str) -> Tuple[List[ExportedTask], List[float]]:
  """`exported:DIR/name` -> (its tasks, their mixing rates); one task has rate 1.

  Raises:
    UserError: no such exported task or mixture.
  """
  if not is_exported(name):
    raise UserError(f'{name!r} is not an exported task name ({PREFIX}DIR/TASK)')
  path = os.path.abspath(os.path.expanduser(name[len(PREFIX):]))
  mixture = os.path.join(path, MIXTURE_FILE)
  if os.path.isfile(mixture):
    with open(mixture) as f:
      rates = json.load(f)['rates']
    return ([ExportedTask(os.path.join(os.path.dirname(path), t)) for t in rates],
            [float(r) for r in rates.values()])
  if not os.path.isdir(path):
    parent = os.path.dirname(path)
    known = sorted(d for d in os.listdir(parent) if d != 'vocab') if os.path.isdir(parent) else []
    raise UserError(f'no exported task or mixture at {path}' +
                    (f'; exported there: {", ".join(known)}' if known else ''))
  return [ExportedTask(path)], [1.0]


def common_lengths(tasks: Sequence[ExportedTask]) -> Dict[str, int]:
  """The exported lengths shared by `tasks` (the default lengths of reading them)."""
  lengths = {json.dumps(t.lengths, sort_keys=True) for t in tasks}
  if len(lengths) != 1:
    raise UserError(f'the tasks {", ".join(t.name for t in tasks)} were exported with different '
                    'lengths; pass the lengths to read them at')
  return dict(tasks[0].lengths)


def _epoch_order(n: int, shuffle: bool, seed: int, task: int, epoch: int) -> np.ndarray:
  if not shuffle:
    return np.arange(n)
  return np.random.default_rng([seed, task, epoch]).permutation(n)


def _task_stream(n: int, shuffle: bool, seed: int, task: int, num_epochs: Optional[int],
                 shard: Tuple[int, int]) -> Iterator[int]:
  """One task's example indices: epoch after epoch, this host's shard of each epoch's order."""
  epoch = 0
  while num_epochs is None or epoch < num_epochs:
    yield from _epoch_order(n, shuffle, seed, task, epoch)[shard[0]::shard[1]].tolist()
    epoch += 1


def _mixed_stream(streams: List[Iterator[int]], rates: Sequence[float],
                  seed: int) -> Iterator[Tuple[int, int]]:
  """(task, example) pairs, each example's task drawn by the rates (seqio's sample_from_datasets);
  ends when a drawn task runs out (as tf.data's `stop_on_empty_dataset`)."""
  if len(streams) == 1:
    yield from ((0, i) for i in streams[0])
    return
  p = np.asarray(rates, np.float64) / np.sum(rates)
  block = 0
  while True:
    draws = np.random.default_rng([seed, len(streams), block]).choice(len(streams), _MIX_BLOCK, p=p)
    for t in draws.tolist():
      i = next(streams[t], None)
      if i is None:
        return
      yield t, i
    block += 1


def get_batches(name: str, split: str, feature_lengths: Mapping[str, int], batch_size: int, *,
                pack: bool = True, shuffle: bool = True, seed: int = 42,
                num_epochs: Optional[int] = None, skip_batches: int = 0,
                shard: Tuple[int, int] = (0, 1)) -> Iterator[Dict[str, np.ndarray]]:
  """Model-feature batches of an exported task or mixture (the seqio pipeline's, without TF).

  Args:
    name: `exported:DIR/task_or_mixture`.
    split: an exported split.
    feature_lengths: `{'inputs', 'targets'}` (at most the exported lengths).
    batch_size: rows per batch (this host's); the last partial batch is dropped.
    pack: pack several examples per row (seqio's trim-and-pack), else one example per row.
    shuffle: a new order each epoch from `seed`.
    seed: the order's seed.
    num_epochs: passes over the data; None repeats forever.
    skip_batches: batches to skip (those a resumed run consumed); costs no token reads.
    shard: (index, count): this host's share of every epoch's examples.

  Yields:
    dicts of int32 `[batch_size, length]` arrays named as EncDecFeatureConverter names them.
  """
  tasks, rates = resolve(name)
  lengths = {k: int(feature_lengths[k]) for k in features.KEYS}
  for task in tasks:
    task.check(split, lengths)
  token_lengths = [t.token_lengths(split, lengths) for t in tasks]  # [n_t, 2] each
  streams = [_task_stream(t.num_examples(split), shuffle, seed, i, num_epochs, shard)
             for i, t in enumerate(tasks)]
  stream = _mixed_stream(streams, rates, seed)
  chunk = max(lengths.values()) if pack else 1
  to_skip = skip_batches * batch_size  # rows
  pending: List[Dict[str, np.ndarray]] = []
  while True:
    block = [pair for _, pair in zip(range(chunk), stream)]
    if not block:
      return
    if pack:
      counts = np.array([token_lengths[t][i] for t, i in block]).reshape(-1, 2)  # [chunk, 2]
      rows = features.pack_rows(counts, lengths)
    else:
      rows = [[0]]
    for row in rows:
      if to_skip:
        to_skip -= 1
        continue
      examples = [tasks[block[j][0]].example(split, block[j][1], lengths) for j in row]
      pending.append(features.packed_row(examples, lengths) if pack
                     else features.unpacked_row(examples[0], lengths))
      if len(pending) == batch_size:
        yield features.stack(pending)
        pending = []


def eval_batches(task: ExportedTask, split: str, lengths: Mapping[str, int], batch_size: int,
                 num_examples: Optional[int] = None
                 ) -> Iterator[Tuple[np.ndarray, Dict[str, np.ndarray]]]:
  """(example indices, unpacked features) of the first `num_examples` examples, in order; the last
  batch may be short."""
  task.check(split, lengths)
  n = task.num_examples(split)
  n = n if num_examples is None else min(n, num_examples)
  for start in range(0, n, batch_size):
    indices = np.arange(start, min(start + batch_size, n))
    yield indices, features.stack([features.unpacked_row(task.example(split, int(i), lengths),
                                                         lengths) for i in indices])


def targets(task: ExportedTask, split: str, num_examples: Optional[int] = None) -> List[Any]:
  """The references seqio's Evaluator scores against: `targets_pretokenized` (else the decoded
  targets) through the task's postprocess_fn."""
  out = []
  for i, text in enumerate(task.texts(split)[:num_examples]):
    target = text.get('targets_pretokenized')
    if target is None:
      tokens, offsets = task._arrays(split, 'targets')  # pylint: disable=protected-access
      target = task.vocabulary.decode(tokens[offsets[i]:offsets[i + 1]])
    out.append(task.postprocess_fn(target, example=text, is_target=True)
               if task.postprocess_fn else target)
  return out


def score(task: ExportedTask, split: str, predictions: Sequence[str],
          num_examples: Optional[int] = None) -> Dict[str, float]:
  """The task's metrics of decoded predictions (in example order), as seqio's Evaluator computes
  them: predictions through the postprocess_fn, then every metric function."""
  texts = task.texts(split)
  if task.postprocess_fn:
    predictions = [task.postprocess_fn(p, example=texts[i], is_target=False)
                   for i, p in enumerate(predictions)]
  references = targets(task, split, num_examples)
  out: Dict[str, float] = {}
  for fn in task.metric_fns:
    out.update({k: float(v) for k, v in fn(references, list(predictions)).items()})
  return out
