"""`gqa-spec data export`: seqio tasks to a directory that runs read without TensorFlow.

seqio stays the registry and the source of truth: each split is read through the task's own
preprocessors (`task.get_dataset` at the export lengths, unshuffled, with `seed` for random
preprocessors such as span corruption), and what seqio yields is stored as it is: token ids,
the raw strings evaluation scores against, the vocabulary, the metric functions' names. The
format and the reader are in `gqa_spec.data.exported`.

  export(['ddtp_translate_en_de', 'ddtp_summarize'], '/data/ddtp_export')
  export(['ddtp_translate_summarize'], '/data/ddtp_export', lengths={'inputs': 128, 'targets': 64})

A mixture exports each of its tasks (at the mixture's lengths) and `mixture.json` with the rates.
A random preprocessor is run once: every epoch of an exported span-corruption task sees the same
noise (seqio re-draws it per epoch only when its seeds change; ours are fixed by `seed`).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from gqa_spec import atomic
from gqa_spec.data import exported, features
from gqa_spec.errors import UserError


def _file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def _qualified(fn) -> Optional[str]:
  if fn is None:
    return None
  name = getattr(fn, '__qualname__', '')
  if '<' in name or '.' in name:
    raise UserError(f'{fn!r} is not a module-level function; an exported task can only name those')
  return f'{fn.__module__}:{name}'


def _length_dependent(task) -> bool:
  """Whether preprocessing after the cache point depends on the lengths beyond seqio's trim."""
  import seqio  # pylint: disable=g-import-not-at-top
  steps = list(task.preprocessors)
  cache = [i for i, p in enumerate(steps) if isinstance(p, seqio.CacheDatasetPlaceholder)]
  after = steps[cache[0] + 1:] if cache else steps
  return any(p is not seqio.preprocessors.append_eos_after_trim for p in after)


def _text(value: Any) -> Any:
  if isinstance(value, bytes):
    return value.decode('utf-8')
  if isinstance(value, np.ndarray) and value.dtype == object:
    return [_text(v) for v in value.tolist()]
  return None


def _write_split(task, split: str, lengths: Mapping[str, int], task_dir: str, dtype,
                 max_examples: Optional[int], seed: int) -> int:
  ds = task.get_dataset(dict(lengths), split=split, shuffle=False, num_epochs=1, seed=seed,
                        use_cached=False)
  if max_examples is not None:
    ds = ds.take(max_examples)
  tokens = {k: [] for k in features.KEYS}
  with atomic.open_for_write(exported.text_path(task_dir, split)) as f:
    for example in ds.as_numpy_iterator():
      for key in features.KEYS:
        tokens[key].append(np.asarray(example.get(key, np.zeros(0, np.int32)), np.int64))
      texts = {k: _text(v) for k, v in example.items() if k not in features.KEYS}
      f.write(json.dumps({k: v for k, v in texts.items() if v is not None},
                         ensure_ascii=False) + '\n')
  for key, seqs in tokens.items():
    write_tokens(task_dir, split, key, seqs, dtype)
  return len(tokens['targets'])


def write_tokens(task_dir: str, split: str, key: str, seqs: Sequence[np.ndarray], dtype) -> None:
  """One feature of a split: its sequences end to end (`dtype`) and their int64 offsets."""
  offsets = np.zeros(len(seqs) + 1, np.int64)  # [n + 1]
  offsets[1:] = np.cumsum([len(s) for s in seqs])
  flat = np.concatenate(seqs) if len(seqs) else np.zeros(0, np.int64)  # [total]
  for path, array in ((exported.token_path(task_dir, split, key), flat.astype(dtype)),
                      (exported.token_path(task_dir, split, key, offsets=True), offsets)):
    with atomic.open_for_write(path, 'wb') as f:  # a file object: np.save adds no suffix
      np.save(f, array)


def export_task(name: str, out_dir: str, lengths: Mapping[str, int],
                splits: Optional[Sequence[str]] = None, max_examples: Optional[int] = None,
                seed: int = 0) -> Dict[str, Any]:
  """Writes one registered task to `out_dir/<name>/`; returns its manifest."""
  import seqio  # pylint: disable=g-import-not-at-top
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  task = tasks.get(name)
  if not isinstance(task, seqio.Task):
    raise UserError(f'{name} is a mixture; export_task takes a task')
  vocab = task.output_features['targets'].vocabulary
  vocab_file = vocab.sentencepiece_model_file
  if not os.path.isfile(vocab_file):
    raise UserError(f'no vocabulary at {vocab_file}; run `gqa-spec data prepare` or pass --vocab')
  if task.score_metric_fns or task.predict_with_aux_metric_fns:
    raise UserError(f'{name} has score or aux metrics; an export keeps prediction metrics only')
  splits = list(splits or task.splits)
  unknown = sorted(set(splits) - set(task.splits))
  if unknown:
    raise UserError(f'{name} has no split {", ".join(unknown)}; it has {", ".join(task.splits)}')
  task_dir = os.path.join(out_dir, name)
  if os.path.exists(os.path.join(task_dir, exported.MANIFEST)):
    os.remove(os.path.join(task_dir, exported.MANIFEST))  # incomplete until rewritten
  os.makedirs(task_dir, exist_ok=True)
  # The model as seqio loads it: its sentinels added as user-defined pieces, so that plain
  # sentencepiece decodes them as seqio does.
  model = vocab.sp_model
  vocab_rel = os.path.join('vocab', hashlib.sha256(model).hexdigest()[:16] + '.model')
  os.makedirs(os.path.join(out_dir, 'vocab'), exist_ok=True)
  with atomic.open_for_write(os.path.join(out_dir, vocab_rel), 'wb') as f:
    f.write(model)
  dtype = np.uint16 if vocab.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
  counts = {s: _write_split(task, s, lengths, task_dir, dtype, max_examples, seed) for s in splits}
  files = sorted(f for f in os.listdir(task_dir) if f != exported.MANIFEST)
  digest = hashlib.sha256()
  for f in files + [os.path.join('..', vocab_rel)]:
    digest.update(f'{f}:{_file_sha256(os.path.join(task_dir, f))}\n'.encode())
  manifest = {
      'format_version': exported.FORMAT_VERSION, 'task': name,
      'splits': {s: {'examples': n} for s, n in counts.items()},
      'lengths': dict(lengths), 'length_dependent': _length_dependent(task),
      'add_eos': {k: bool(task.output_features[k].add_eos) for k in features.KEYS},
      'seed': seed, 'max_examples': max_examples,
      'vocabulary': vocab_rel, 'vocab_size': vocab.vocab_size,
      'extra_ids': vocab.extra_ids,  # already pieces of the stored model
      'dtype': np.dtype(dtype).name,
      'metric_fns': [_qualified(f) for f in task.predict_metric_fns],
      'postprocess_fn': _qualified(task.postprocessor),
      'seqio_version': seqio.__version__, 'content_sha256': digest.hexdigest()}
  atomic.write_json(os.path.join(task_dir, exported.MANIFEST), manifest, indent=2)
  return manifest


def export(names: Sequence[str], out_dir: str, splits: Optional[Sequence[str]] = None,
           lengths: Optional[Mapping[str, int]] = None, max_examples: Optional[int] = None,
           seed: int = 0) -> List[Dict[str, Any]]:
  """Exports tasks and mixtures (each mixture's tasks, and its rates) to `out_dir`.

  Args:
    names: registered tasks or mixtures.
    out_dir: the export directory (created).
    splits: the splits to export (default: every split of each task).
    lengths: `{'inputs', 'targets'}` (default: each name's `tasks.feature_lengths`).
    max_examples: at most this many examples per split (the first ones).
    seed: seed of random preprocessors (span corruption).

  Returns:
    The manifests written, one per task.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  manifests = []
  for name in names:
    provider = tasks.get(name)
    task_lengths = dict(lengths or tasks.feature_lengths(name))
    if isinstance(provider, seqio.Mixture):
      rates = {t.name: provider.get_rate(t) for t in provider.tasks}
      for sub in provider.tasks:  # each task's share of the asked splits
        sub_splits = [s for s in splits if s in sub.splits] if splits else None
        manifests.append(export_task(sub.name, out_dir, task_lengths, sub_splits, max_examples,
                                     seed))
      os.makedirs(os.path.join(out_dir, name), exist_ok=True)
      atomic.write_json(os.path.join(out_dir, name, exported.MIXTURE_FILE),
                        {'mixture': name, 'rates': rates, 'lengths': task_lengths}, indent=2)
    else:
      manifests.append(export_task(name, out_dir, task_lengths, splits, max_examples, seed))
  return manifests
