"""Training batches: a deterministic, resumable seqio pipeline, exported data, synthetic batches.

Resume determinism (t5x's recipe): the seqio pipeline is shuffled with a fixed seed (which also
seeds the random preprocessors, e.g. span corruption), repeated forever, batched with
`drop_remainder`, and on resume `ds.skip(k)` drops the `k` batches the run has already consumed.
A restarted run therefore sees exactly the batches the uninterrupted run would have seen.

On several hosts each host reads its own shard (`seqio.ShardInfo(process_index, process_count)`)
and yields its `batch_size / process_count` rows; `Partitioner.shard_batch` joins them.

An exported task (`exported:DIR/TASK`, `gqa_spec.data.exported`) gives the same batches without
TensorFlow: seqio's packing, a seeded order per epoch, and the same skip on resume.

  cfg = DatasetConfig('ddtp_span_corruption', {'inputs': 512, 'targets': 114}, batch_size=128)
  for batch in get_batches(cfg, skip_batches=resumed_step - start_step): ...

A process that trains many jobs on the same data (`gqa-spec reproduce`) may keep the batches it
reads in memory for the next job with the same dataset config and start (`shared_batches`): the
pipelines are deterministic, so a later job gets exactly the batches a fresh pipeline would give,
without building one (seqio's tf.data graph: seconds per job on 2 CPU cores).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional

import jax
import numpy as np

from gqa_spec.errors import UserError


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
  """Which data, how long, how many, in what order (t5x's `utils.DatasetConfig`).

  Attributes:
    mixture_or_task_name: a registered seqio task or mixture, an exported one
      (`exported:DIR/TASK`, read without TensorFlow), or 'synthetic' for random packed batches
      (no seqio; benchmarks and tests).
    task_feature_lengths: `{'inputs': ..., 'targets': ...}`.
    split: dataset split.
    batch_size: global batch size (all hosts together).
    shuffle: shuffle the examples.
    seed: shuffle and preprocessing seed; fixed, so that resume is exact.
    pack: pack several examples per row (EncDecFeatureConverter(pack=True)).
    use_cached: read seqio's offline cache.
  """

  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  split: str = 'train'
  batch_size: int = 128
  shuffle: bool = True
  seed: int = 42
  pack: bool = True
  use_cached: bool = False

  def __post_init__(self):
    object.__setattr__(self, 'task_feature_lengths', dict(self.task_feature_lengths))
    if set(self.task_feature_lengths) != {'inputs', 'targets'}:
      raise UserError(f"task_feature_lengths needs exactly 'inputs' and 'targets', got "
                      f"{sorted(self.task_feature_lengths)}")
    if self.batch_size < 1:
      raise UserError(f'batch_size must be positive, got {self.batch_size}')


def vocab_sizes(name: str) -> Dict[str, int]:
  """Task name -> its vocabulary's size (pieces + extra ids), for a task or each of a mixture's.

  Raises:
    UserError: an unknown task or mixture (the message lists the known ones).
  """
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if exported.is_exported(name):
    return {t.name: t.vocabulary.vocab_size for t in exported.resolve(name)[0]}
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow only for seqio tasks)
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  tasks.get(name)
  return {t.name: max(f.vocabulary.vocab_size for f in t.output_features.values())
          for t in seqio.get_subtasks(seqio.get_mixture_or_task(name))}


class _SharedBatches:
  """Batches read so far per (dataset config, start), up to `max_bytes` in all. Readers may be
  jobs in threads side by side: one at a time reads on from the shared pipeline."""

  def __init__(self, max_bytes: int):
    self.max_bytes, self.bytes = max_bytes, 0
    self.entries: Dict[tuple, Dict[str, Any]] = {}  # key -> {'batches': [...], 'source': iter}
    self._lock = threading.Lock()  # guards `entries`, `bytes` and every entry's pipeline

  def read(self, cfg: DatasetConfig, skip_batches: int, num_epochs: Optional[int]
           ) -> Iterator[dict]:
    key = (cfg.mixture_or_task_name, tuple(sorted(cfg.task_feature_lengths.items())), cfg.split,
           cfg.batch_size, cfg.shuffle, cfg.seed, cfg.pack, cfg.use_cached, skip_batches,
           num_epochs, jax.process_index(), jax.process_count())
    # 'source': the pipeline the kept batches came from, positioned after them; 'ended': it has
    # no more; 'full': nothing more is kept, a reader past the kept batches reads on alone.
    with self._lock:
      entry = self.entries.setdefault(key, {'batches': [], 'source': None, 'ended': False,
                                            'full': False})
    batches: List[dict] = entry['batches']
    i, taken = 0, None  # taken: (batch, pipeline) this reader reads on alone once the cache is full
    while taken is None:
      with self._lock:
        if i == len(batches):
          if entry['ended'] or entry['full']:
            break
          if entry['source'] is None:
            entry['source'] = _read_batches(cfg, skip_batches, num_epochs)
          try:
            batch = next(entry['source'])
          except StopIteration:
            entry['ended'], entry['source'] = True, None
            return
          if self.bytes + sum(a.nbytes for a in batch.values()) > self.max_bytes:
            taken, entry['source'], entry['full'] = (batch, entry['source']), None, True
            continue
          for a in batch.values():
            a.setflags(write=False)  # later jobs read the same arrays
          self.bytes += sum(a.nbytes for a in batch.values())
          batches.append(batch)
      yield dict(batches[i])  # a reader may add or replace features, not change the arrays
      i += 1
    if taken is not None:
      yield dict(taken[0])
      yield from taken[1]
    elif entry['full']:  # another reader took the pipeline on: read on from a new one
      yield from _read_batches(cfg, skip_batches + i, num_epochs)


_SHARED: Optional[_SharedBatches] = None


@contextlib.contextmanager
def shared_batches(max_bytes: int = 512 << 20):
  """While the block runs, `get_batches` keeps what it reads (at most `max_bytes`, then it reads
  on without keeping) and a later call with the same config and `skip_batches` replays it before
  reading on. Batches are shared read-only arrays."""
  global _SHARED
  previous, _SHARED = _SHARED, _SharedBatches(max_bytes)
  try:
    yield
  finally:
    _SHARED = previous


def get_batches(cfg: DatasetConfig, skip_batches: int = 0,
                num_epochs: Optional[int] = None) -> Iterator[dict]:
  """This host's numpy batches of model features, starting after `skip_batches` batches.

  Args:
    cfg: the dataset config.
    skip_batches: batches to drop from the start (the ones a resumed run already consumed).
    num_epochs: None repeats forever (training).

  Yields:
    dicts of `[batch_size / process_count, length]` int32 arrays (read-only inside
    `shared_batches`).
  """
  if _SHARED is not None and cfg.mixture_or_task_name != 'synthetic':
    return _SHARED.read(cfg, skip_batches, num_epochs)
  return _read_batches(cfg, skip_batches, num_epochs)


def _read_batches(cfg: DatasetConfig, skip_batches: int,
                  num_epochs: Optional[int]) -> Iterator[dict]:
  processes = jax.process_count()
  if cfg.batch_size % processes:
    raise UserError(f'batch_size {cfg.batch_size} is not divisible by the {processes} hosts')
  local_batch = cfg.batch_size // processes
  if cfg.mixture_or_task_name == 'synthetic':
    yield from synthetic_batches(cfg, local_batch, skip_batches)
    return
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if exported.is_exported(cfg.mixture_or_task_name):
    if cfg.use_cached:
      raise UserError('use_cached reads seqio\'s cache; an exported task is read directly (drop '
                      'use_cached)')
    yield from exported.get_batches(
        cfg.mixture_or_task_name, cfg.split, cfg.task_feature_lengths, local_batch, pack=cfg.pack,
        shuffle=cfg.shuffle, seed=cfg.seed, num_epochs=num_epochs, skip_batches=skip_batches,
        shard=(jax.process_index(), processes))
    return
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow loads only for real data)
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top  (registers the tasks)
  tasks.get(cfg.mixture_or_task_name)  # a UserError listing the registered names if unknown
  ds = seqio.get_dataset(
      cfg.mixture_or_task_name, task_feature_lengths=cfg.task_feature_lengths,
      feature_converter=seqio.EncDecFeatureConverter(pack=cfg.pack), dataset_split=cfg.split,
      use_cached=cfg.use_cached, shuffle=cfg.shuffle, num_epochs=num_epochs,
      shard_info=seqio.ShardInfo(index=jax.process_index(), num_shards=processes),
      seed=cfg.seed, verbose=False)
  ds = ds.batch(local_batch, drop_remainder=True)
  if skip_batches:
    ds = ds.skip(skip_batches)
  for batch in ds.as_numpy_iterator():
    yield {k: np.asarray(v, np.int32) for k, v in batch.items()}


def synthetic_batches(cfg: DatasetConfig, local_batch: int, skip_batches: int = 0,
                      vocab_size: int = 256) -> Iterator[dict]:
  """Random batches in the EncDecFeatureConverter's packed format; batch `i` depends only on `i`.

  Each row packs examples of random lengths; targets end in EOS (1); decoder inputs are the targets
  shifted right within each segment (0 starts a segment). On several processes each one draws the
  global batch (`local_batch * process_count` rows) and keeps its own slice, so the global batch
  is the one-process run's whatever the process count (`tests/multihost` compares the two).
  """
  index, first = skip_batches, jax.process_index() * local_batch
  while True:
    rng = np.random.default_rng([cfg.seed, 0, index])
    rows = [_synthetic_row(rng, cfg.task_feature_lengths, vocab_size, cfg.pack)
            for _ in range(first + local_batch)][first:]  # rows after this slice: not drawn
    yield {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    index += 1


def _synthetic_row(rng: np.random.Generator, lengths: Mapping[str, int], vocab_size: int,
                   pack: bool) -> dict:
  row = {}
  for side, prefix in (('inputs', 'encoder'), ('targets', 'decoder')):
    length = lengths[side]
    tokens = np.zeros(length, np.int32)
    segments = np.zeros(length, np.int32)
    positions = np.zeros(length, np.int32)
    start, segment = 0, 1
    while start < length and (pack or segment == 1):
      n = int(rng.integers(2, max(3, length // 2 + 1)))
      n = min(n, length - start)
      tokens[start:start + n] = rng.integers(2, vocab_size, n)
      tokens[start + n - 1] = 1  # EOS
      segments[start:start + n] = segment
      positions[start:start + n] = np.arange(n)
      start, segment = start + n, segment + 1
      if rng.random() < 0.3:
        break
    if side == 'inputs':
      row['encoder_input_tokens'] = tokens
    else:
      row['decoder_target_tokens'] = tokens
      shifted = np.concatenate([[0], tokens[:-1]]).astype(np.int32)
      row['decoder_input_tokens'] = np.where(positions == 0, 0, shifted).astype(np.int32)
      row['decoder_loss_weights'] = (tokens > 0).astype(np.int32)
    if pack:
      row[f'{prefix}_segment_ids'] = segments
      row[f'{prefix}_positions'] = positions
  return row
