"""Inference evaluation with seqio's Evaluator: decode, score the task's metrics, time each sample.

`InferenceEvaluator` is what the trainer calls every `eval_period` steps (and what `gqa-spec eval`
runs once): seqio reads the task's split unpacked and in order, our predict function decodes each
batch with one jitted loop (`gqa_spec.decoding`: greedy, beam search, or speculative decoding with
a draft), and seqio post-processes and scores the predictions with the task's metric functions.
Metrics come back flat, as `'<task>/<metric>'` plus the bare `'<metric>'` for a single task, so a
run config can select the best checkpoint by `EVAL_METRIC = 'bleu'`.

Speculative decoding runs at temperature 0, whose output is token-identical to greedy's (Leviathan
et al. 2023, Thm. 1), so its metrics equal greedy's and only the time per sample differs; the
metrics add the acceptance statistics pooled over all batches (`speculative/...`).

Partitioned inference: parameters that arrive sharded on a `data x model` mesh (a sharded
training run's) are decoded on that mesh with the same partitioning rules (no gather to one
device; `gqa_spec.decoding.mesh`); `model_parallel=N` puts host parameters (`gqa-spec eval`) on a
mesh of all devices with a model axis of N. Otherwise decoding runs on the default device.

Timing: every batch is decoded once untimed first (compilation; the shapes are fixed by the task
feature lengths and batch size, so nothing recompiles after it), then timed; time per sample is the
batch's decode time over its real examples, reported as the median over batches (GQA, Sec. 3.1).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import statistics
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import jax
import numpy as np

from gqa_spec import arguments, atomic, progress
from gqa_spec.data import exported
from gqa_spec.evaluation import outputs
from gqa_spec.decoding import memory
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config
from gqa_spec.models.layout import DECODE_LAYOUT
from gqa_spec.models.t5 import Transformer
from gqa_spec.partitioning import to_host
from gqa_spec.decoding.targets import cache_length

DECODINGS = ('greedy', 'beam', 'speculative')

# Inside `shared_eval_data`: seqio evaluators by (task, split, lengths, examples), and their lock.
_SHARED_SEQIO: Optional[Dict[tuple, Any]] = None
_SHARED_SEQIO_LOCK = threading.Lock()


@contextlib.contextmanager
def shared_eval_data():
  """While the block runs, evaluators of the same seqio task, split, lengths and number of
  examples share what seqio's evaluator built (the examples and their targets, ~1 s of TensorFlow
  tracing each time; `gqa-spec reproduce` validates 6 models on each task). Each evaluator works on
  its own shallow copy, so evaluators in threads side by side do not share a result."""
  global _SHARED_SEQIO
  previous, _SHARED_SEQIO = _SHARED_SEQIO, {}
  try:
    yield
  finally:
    _SHARED_SEQIO = previous


def _seqio_evaluator(name: str, split: str, lengths: Mapping[str, int],
                     num_examples: Optional[int]):
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow only when evaluating)

  def build():
    return seqio.Evaluator(
        name, feature_converter=seqio.EncDecFeatureConverter(pack=False), eval_split=split,
        sequence_length=dict(lengths), num_examples=num_examples, use_memory_cache=True,
        async_compute_metrics=False)

  if _SHARED_SEQIO is None:
    return build()
  key = (name, split, tuple(sorted(lengths.items())), num_examples)
  with _SHARED_SEQIO_LOCK:
    if key not in _SHARED_SEQIO:
      _SHARED_SEQIO[key] = build()
    return copy.copy(_SHARED_SEQIO[key])  # its own `_metrics_future`, the shared data


@dataclasses.dataclass
class InferenceEvaluator:
  """Decode-and-score evaluation of one task or mixture split.

  Attributes:
    mixture_or_task_name: registered seqio task or mixture (with metric functions), or an
      exported one (`exported:DIR/TASK`: read and scored without seqio or TensorFlow, with the
      task's own metric functions).
    model_config: the model evaluated.
    split: dataset split.
    task_feature_lengths: `{'inputs', 'targets'}` lengths; targets bound the decode length.
    batch_size: examples per decode call (the last batch is padded).
    num_examples: evaluate only the first N examples of each task (None: all).
    decoding: 'greedy' (the GQA paper's choice), 'beam', or 'speculative' (greedy output,
      faster with a good draft).
    beam_size: beams of 'beam'.
    length_penalty: t5x's beam-search alpha.
    draft: the draft of 'speculative': copy, unigram:PATH, bigram:PATH or a draft checkpoint
      directory (see `gqa_spec.decoding.drafts.factory`).
    gamma: draft tokens per target call of 'speculative'.
    model_parallel: decode on a mesh of all devices with this model axis (None: the mesh the
      parameters are sharded on, if any, else one device).
    tree: 'speculative' with a token tree instead of a chain (a model draft): `topk:K1,K2,...` or
      `best:N,depth:D[,width:W]` (see `gqa_spec.decoding.tree`); gamma is then unused. Trees decode
      on one device (not on a mesh).
    param_dtype: cast a model draft's floating parameters to it once, at load (None: as stored;
      `gqa_spec.checkpoints.param_dtype`). The target's parameters come with `run`.
    checkpoint: where the model was loaded from, if anywhere: a vocabulary mismatch then names
      the data dir its run trained on (`gqa_spec.data.vocab_fit.data_hint`).
  """

  mixture_or_task_name: str
  model_config: T5Config
  split: str = 'validation'
  task_feature_lengths: Optional[Mapping[str, int]] = None
  batch_size: int = 32
  num_examples: Optional[int] = None
  decoding: str = 'greedy'
  beam_size: int = 4
  length_penalty: float = 0.6
  draft: Optional[str] = None
  gamma: int = 4
  model_parallel: Optional[int] = None
  tree: Optional[str] = None
  param_dtype: Optional[str] = None
  checkpoint: Optional[str] = None

  def __post_init__(self):
    if self.decoding not in DECODINGS:
      raise UserError(f'unknown decoding {self.decoding!r}; known: {", ".join(DECODINGS)}')
    if self.decoding == 'speculative' and not self.draft:
      raise UserError("decoding 'speculative' needs a draft: copy, unigram:PATH, bigram:PATH or a "
                      'draft checkpoint directory')
    if self.draft and self.decoding != 'speculative':
      raise UserError(f'a draft ({self.draft!r}) is only used by decoding \'speculative\', not '
                      f'{self.decoding!r}')
    if self.gamma < 1:
      raise UserError(f'gamma must be >= 1, got {self.gamma}')
    self._tree = None
    if self.tree is not None:
      from gqa_spec.decoding.tree import TreeShape  # pylint: disable=g-import-not-at-top
      if self.decoding != 'speculative':
        raise UserError(f"a tree ({self.tree!r}) is only used by decoding 'speculative'")
      self._tree = TreeShape.parse(self.tree)
    from gqa_spec.decoding.drafts import factory  # pylint: disable=g-import-not-at-top
    if self.draft:
      factory.check_spec(self.draft)  # before seqio reads the data
    if self.batch_size < 1:
      raise UserError(f'eval batch_size must be positive, got {self.batch_size}')
    self._evaluator = None  # seqio's (a registered task), else the exported tasks are read
    if exported.is_exported(self.mixture_or_task_name):
      tasks_read, _ = exported.resolve(self.mixture_or_task_name)
      self._exported = [t for t in tasks_read if t.metric_fns and self.split in t.manifest['splits']]
      lengths = dict(self.task_feature_lengths or exported.common_lengths(tasks_read))
      for task in self._exported:
        task.check(self.split, lengths)
      has_tasks = bool(self._exported)
    else:
      from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
      tasks.get(self.mixture_or_task_name)
      lengths = dict(self.task_feature_lengths or tasks.feature_lengths(self.mixture_or_task_name))
      self._evaluator = _seqio_evaluator(self.mixture_or_task_name, self.split, lengths,
                                         self.num_examples)
      has_tasks = bool(self._evaluator.eval_tasks)
    from gqa_spec.data import vocab_fit  # pylint: disable=g-import-not-at-top
    vocab_fit.check(
        {t.name: t.vocabulary.vocab_size for t in self._exported} if self._evaluator is None else
        {t.name: max(f.vocabulary.vocab_size for f in t.output_features.values())
         for t in self._evaluator.eval_tasks}, self.model_config.vocab_size, 'the model',
        checkpoint=self.checkpoint)
    self._lengths = lengths
    self._max_decode_len = lengths['targets']
    if not has_tasks:
      raise UserError(f'{self.mixture_or_task_name!r} has no task with metrics on split '
                      f'{self.split!r} to evaluate')
    self._model = Transformer(self.model_config)
    self._draft = None
    if self._tree is not None:
      self._draft = factory.make_tree_draft(self.draft, self.model_config, self._tree,
                                            self._max_decode_len, param_dtype=self.param_dtype)
    elif self.decoding == 'speculative':
      self._draft = factory.make_draft(self.draft, self.model_config, self.gamma,
                                       self._max_decode_len,
                                       param_dtype=self.param_dtype)  # (draft, init, description)
    self.last_timings: List[float] = []
    self._warm = set()  # (partitioner, input shape) this evaluator has decoded: compiled already
    self.last_speculative: List[Any] = []  # per timed batch: its `SpeculativeResult`
    self._partitioner = None  # the mesh decoding runs on (None: one device)
    self._mesh_drafts = {}  # mesh -> the draft placed on it
    if self.model_parallel is not None:
      from gqa_spec.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
      if not isinstance(self.model_parallel, int) or self.model_parallel < 1:
        raise UserError(f'model_parallel must be a positive integer, got {self.model_parallel!r}')
      if jax.device_count() % self.model_parallel:
        raise UserError(f'model_parallel={self.model_parallel} does not divide the '
                        f'{jax.device_count()} devices')
      self._partitioner = Partitioner.create(self.model_config, model=self.model_parallel)

  def _place(self, params: Any) -> Any:
    """Chooses where to decode (see the module docstring) and puts the parameters there once."""
    from gqa_spec.decoding import mesh  # pylint: disable=g-import-not-at-top
    if self.model_parallel is None:
      self._partitioner = mesh.params_partitioner(self.model_config, params)
    if self._partitioner is None:
      return params
    return mesh.place_params(self._partitioner, params)

  def _decode_batch(self, params: Any, inputs: np.ndarray,
                    n: int) -> Tuple[List[List[int]], Any]:
    """`(tokens per row, the SpeculativeResult or None)` of a `[batch_size, S]` batch whose
    first `n` rows are real."""
    from gqa_spec.decoding import autoregressive, beam_search, mesh, speculative, targets  # pylint: disable=g-import-not-at-top
    part = self._partitioner
    if part is None:
      decoder, draft_triple = targets.T5Decoder(self._model), self._draft
      run_ar, run_beam, run_spec = autoregressive.decode, beam_search.beam_search, speculative.decode
    else:  # the same loops under one jit on the mesh; results gathered after the loop
      if self._tree is not None:
        raise UserError('tree speculative decoding runs on one device; it cannot decode on a mesh '
                        '(drop TREE or MODEL_PARALLEL, or evaluate the saved checkpoint)')
      decoder, draft_triple = mesh.MeshT5Decoder(self._model, part), self._mesh_draft(part)
      run_ar, run_beam, run_spec = mesh.autoregressive, mesh.beam, mesh.speculative
    if self._tree is not None:
      from gqa_spec.decoding import tree_speculative  # pylint: disable=g-import-not-at-top
      draft, draft_init, _ = self._draft
      state = decoder.init(params, inputs,
                           cache_length(self._max_decode_len, self._tree.num_nodes + 1))
      result = tree_speculative.decode(decoder, state, draft, draft_init(inputs),
                                       jax.random.PRNGKey(0), shape=self._tree,
                                       max_decode_len=self._max_decode_len,
                                       skip=np.arange(len(inputs)) >= n)
      return autoregressive.strip(result.sequences, result.lengths), result
    if self.decoding == 'speculative':
      draft, draft_init, _ = draft_triple
      state = decoder.init(params, inputs,
                           cache_length(self._max_decode_len, self.gamma + 1))
      result = run_spec(decoder, state, draft, draft_init(inputs), jax.random.PRNGKey(0),
                        gamma=self.gamma, max_decode_len=self._max_decode_len,
                        skip=np.arange(len(inputs)) >= n)  # padding rows: no statistics
      result = to_host(result)
      return autoregressive.strip(result.sequences, result.lengths), result
    if self.decoding == 'greedy':
      state = decoder.init(params, inputs, cache_length(self._max_decode_len))
      result = to_host(run_ar(decoder, state, jax.random.PRNGKey(0),
                                   max_decode_len=self._max_decode_len))
      return autoregressive.strip(result.sequences, result.lengths), None
    state = decoder.init(params, np.repeat(inputs, self.beam_size, axis=0),
                         cache_length(self._max_decode_len))
    beams, _ = run_beam(decoder, state, beam_size=self.beam_size,
                        max_decode_len=self._max_decode_len,
                        alpha=self.length_penalty)  # [b, k, 1 + L]
    best = to_host(beams)[:, 0, 1:]  # [b, L]; PAD after EOS
    return [[int(t) for t in row[:_eos_end(row)] if t != 0]
            for row in best], None

  def _mesh_draft(self, partitioner) -> Any:
    """The draft triple of `factory.make_draft` with a model draft placed on the mesh."""
    if self._draft is None:
      return None
    key = partitioner.mesh
    if key not in self._mesh_drafts:
      from gqa_spec.decoding.drafts import factory  # pylint: disable=g-import-not-at-top
      self._mesh_drafts[key] = factory.make_draft(self.draft, self.model_config, self.gamma,
                                                  self._max_decode_len, mesh=partitioner.mesh,
                                                  param_dtype=self.param_dtype)
    return self._mesh_drafts[key]

  def _predict_batches(self, params: Any, batches: Iterator[Tuple[np.ndarray, Mapping]],
                       count: Optional[int]) -> List[Tuple[int, np.ndarray]]:
    """`(example index, [max_decode_len] predicted tokens)` of `(indices, features)` batches."""
    out = []
    bar = progress.Progress(f'eval {self.split}', count, unit='batch')
    for indices, features in batches:
      inputs = np.asarray(features['encoder_input_tokens'], np.int32)  # [n, S]
      n = inputs.shape[0]
      if n < self.batch_size:  # pad the last batch: one compiled shape for all batches
        inputs = np.concatenate([inputs, np.zeros((self.batch_size - n, inputs.shape[1]),
                                                  np.int32)])
      if (self._partitioner, inputs.shape) not in self._warm:  # compile outside the timing (once:
        self._decode_batch(params, inputs, n)  # the trainer calls an evaluator every eval_period)
        self._warm.add((self._partitioner, inputs.shape))
      start = time.perf_counter()
      tokens, result = self._decode_batch(params, inputs, n)  # host lists: decoding is done
      self.last_timings.append((time.perf_counter() - start) / n)
      if result is not None:
        self.last_speculative.append(result)
      # Fixed-width rows, 0-padded: seqio stacks the predictions into one array, and vocabulary
      # decoding drops the padding.
      rows = np.zeros((n, self._max_decode_len), np.int32)  # [n, max_decode_len]
      for row, ids in zip(rows, tokens[:n]):
        row[:len(ids)] = ids
      out.extend(zip((int(i) for i in indices), rows))
      bar.update(len(self.last_timings), tokens=float(sum(len(t) for t in tokens[:n])))
    bar.close()
    return out

  def predict_fn(self, params: Any):
    """A seqio predict function decoding with `params`; records time per sample."""
    self.last_timings = []
    self.last_speculative = []
    params = self._place(params)

    def predict(dataset, model_feature_shapes=None) -> List[Tuple[int, np.ndarray]]:
      del model_feature_shapes
      batches = dataset.batch(self.batch_size)
      count = int(batches.cardinality())  # negative: unknown
      return self._predict_batches(params, batches.as_numpy_iterator(),
                                   count if count > 0 else None)

    return predict

  def _run_exported(self, params: Any) -> Tuple[Dict[str, Dict[str, float]], Dict[str, list]]:
    """Per-task metrics and predictions of the exported tasks (no seqio, no TensorFlow)."""
    self.last_timings = []
    self.last_speculative = []
    params = self._place(params)
    by_task, predictions = {}, {}
    for task in self._exported:
      n = task.num_examples(self.split)
      n = n if self.num_examples is None else min(n, self.num_examples)
      out = self._predict_batches(
          params, exported.eval_batches(task, self.split, self._lengths, self.batch_size, n),
          -(-n // self.batch_size))
      texts = [task.vocabulary.decode(tokens) for _, tokens in sorted(out, key=lambda x: x[0])]
      by_task[task.name] = exported.score(task, self.split, texts, n)
      predictions[task.name] = [
          {'index': i, 'prediction': text, 'target': target}
          for i, (text, target) in enumerate(zip(texts, exported.targets(task, self.split, n)))]
    return by_task, predictions

  def run(self, params: Any, step: Optional[int] = None) -> Tuple[Dict[str, float], Dict[str, list]]:
    """`(metrics, predictions)`: flat metrics (with `timing/seconds_per_sample_median`) and, per
    task, `[{'index', 'prediction', 'target'}]` with the predicted and the reference text."""
    if self._evaluator is None:
      by_task, predictions = self._run_exported(params)
    else:
      futures, outputs = self._evaluator.evaluate(compute_metrics=True, step=step,
                                                  predict_fn=self.predict_fn(params))
      by_task = futures.result()
      predictions = {}
      for task in self._evaluator.eval_tasks:
        vocab = task.output_features['targets'].vocabulary
        task_outputs = next(iter(outputs[task.name].values()))
        targets = _targets(task, self._evaluator.cached_task_datasets[task.name])
        predictions[task.name] = [{'index': i, 'prediction': vocab.decode(list(tokens)),
                                   'target': target}
                                  for i, (tokens, target) in enumerate(zip(task_outputs, targets))]
    metrics: Dict[str, float] = {}
    for task_name, task_metrics in by_task.items():
      for name, value in task_metrics.items():
        value = float(getattr(value, 'value', value))
        metrics[f'{task_name}/{name}'] = value
        if len(by_task) == 1:
          metrics[name] = value
    if self.last_timings:
      metrics['timing/seconds_per_sample_median'] = statistics.median(self.last_timings)
    if self.last_speculative:
      stats = self.speculative_stats()
      metrics.update({f'speculative/{k}': float(v) for k, v in stats.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return metrics, predictions

  def speculative_stats(self) -> Dict[str, Any]:
    """`speculative.summarize` pooled over the last run's timed batches (JSON-ready)."""
    from gqa_spec.decoding import speculative  # pylint: disable=g-import-not-at-top
    results = [jax.device_get(r) for r in self.last_speculative]
    sums = {k: sum(speculative.summarize(r)[k] for r in results)
            for k in ('tokens', 'target_calls', 'loop_iterations', 'proposed', 'accepted')}
    beta_sum = sum(float(r.beta_sum) for r in results)
    beta_count = sum(float(r.beta_count) for r in results)
    return dict(
        sums, gamma=None if self._tree else self.gamma, tree=self.tree, draft=self._draft[2],
        acceptance_rate=sums['accepted'] / max(sums['proposed'], 1),
        mean_tokens_per_call=sums['tokens'] / sums['target_calls'] if sums['target_calls'] else 0.0,
        alpha=beta_sum / beta_count if beta_count else None,
        accepted_per_position=[int(x) for x in sum(np.asarray(r.accepted_per_position)
                                                   for r in results)],
        accept_histogram=[int(x) for x in sum(np.asarray(r.accept_histogram) for r in results)])

  def __call__(self, params: Any, step: int) -> Dict[str, float]:
    return self.run(params, step)[0]


def _targets(task, dataset) -> List[Any]:
  """The references seqio scores against, in example order: `targets_pretokenized` (or the decoded
  `targets`) through the task's postprocess_fn, as seqio's metrics do."""
  vocab = task.output_features['targets'].vocabulary
  out = []
  for ex in dataset.as_numpy_iterator():
    target = ex.get('targets_pretokenized')
    if target is None:
      target = vocab.decode(list(ex['targets']))
    if isinstance(target, bytes):
      target = target.decode('utf-8')
    out.append(task.postprocess_fn(target, example=ex, is_target=True)
               if task.postprocess_fn else target)
  return out


def _eos_end(row: np.ndarray) -> int:
  eos = np.flatnonzero(row == 1)
  return int(eos[0]) if eos.size else len(row)


def evaluate_checkpoint(checkpoint_path: str, mixture_or_task_name: str, output_dir: str, *,
                        split: str = 'validation',
                        task_feature_lengths: Optional[Mapping[str, int]] = None,
                        batch_size: int = 32, num_examples: Optional[int] = None,
                        decoding: str = 'greedy', beam_size: int = 4, draft: Optional[str] = None,
                        gamma: int = 4, model_parallel: Optional[int] = None,
                        tree: Optional[str] = None,
                        param_dtype: Optional[str] = None,
                        layout: Optional[str] = None) -> Dict[str, float]:
  """`gqa-spec eval`: evaluates a checkpoint and writes `metrics.json` and predictions JSONL.

  Args:
    checkpoint_path: a training run dir (latest step), a native or an HF checkpoint.
    mixture_or_task_name: registered task or mixture.
    output_dir: where `metrics.json` and `predictions-<task>.jsonl` go.
    split: dataset split.
    task_feature_lengths: input/target lengths (None: the task's defaults).
    batch_size: examples per decode call.
    num_examples: first N examples per task (None: all).
    decoding: 'greedy', 'beam' or 'speculative'.
    beam_size: beams of 'beam'.
    draft: the draft of 'speculative' (copy, unigram:PATH, bigram:PATH or a checkpoint directory).
    gamma: draft tokens per target call of 'speculative'.
    model_parallel: decode on a mesh of all devices with this model axis (None: one device).
    tree: a token tree for 'speculative' (`topk:...` / `best:...`) in place of gamma.
    param_dtype: cast the floating parameters (target and model draft) to it once, at load
      ('float32' or 'bfloat16'; None: as stored).
    layout: the layer layout decoding runs in, converted at load ('scanned': one `nn.scan` per
      stack, compiles in time independent of depth, slower steps; 'unrolled'; None: unrolled,
      `models.layout.DECODE_LAYOUT`).

  Returns:
    The metrics written.
  """
  if not exported.is_exported(mixture_or_task_name):
    from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top  (TensorFlow)
    tasks.use_data_of(checkpoint_path)  # a model knows its data (the smoke run's, say)
  from gqa_spec.checkpoints import param_dtype as dtype_lib  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints.load import load_any, scan_layers_of  # pylint: disable=g-import-not-at-top  (slow imports)
  dtype_lib.check(param_dtype, 'param_dtype')
  arguments.check_outputs({'OUTPUT_DIR': output_dir}, folders=True,  # before any work
                          inputs={'CHECKPOINT_PATH': checkpoint_path, 'DRAFT': draft})
  config, params, step = load_any(checkpoint_path, scan_layers=scan_layers_of(layout or DECODE_LAYOUT), model=True)
  memory.check_feature_length(config, task_feature_lengths, batch_size,
                                   beam_size if decoding == 'beam' else 1)
  config, params = dtype_lib.cast(config, params, param_dtype, 'param_dtype')
  evaluator = InferenceEvaluator(mixture_or_task_name, config, split, task_feature_lengths,
                                 batch_size, num_examples, decoding, beam_size, draft=draft,
                                 gamma=gamma, model_parallel=model_parallel, tree=tree,
                                 param_dtype=param_dtype, checkpoint=checkpoint_path)
  step = outputs.checkpoint_step(checkpoint_path, step)
  metrics, predictions = evaluator.run(params, step)
  if jax.process_index() != 0:  # every process evaluated (the mesh spans them); process 0 writes
    return metrics
  os.makedirs(output_dir, exist_ok=True)
  outputs.note_replaced(output_dir, ['metrics.json'] + [f'predictions-{t}.jsonl'
                                                        for t in predictions])
  report = {'checkpoint': os.path.abspath(checkpoint_path), 'step': step,
            'task': mixture_or_task_name, 'split': split, 'decoding': decoding,
            'num_kv_heads': config.num_kv_heads, 'param_dtype': config.param_dtype,
            'scan_layers': config.scan_layers,
            'metrics': metrics,
            'mesh': (dict(evaluator._partitioner.mesh.shape) if evaluator._partitioner  # pylint: disable=protected-access
                     else None),
            'seconds_per_sample': evaluator.last_timings}
  if decoding == 'speculative':
    report.update(draft=draft, gamma=None if tree else gamma, tree=tree,
                  speculative=evaluator.speculative_stats())
  atomic.write_json(os.path.join(output_dir, 'metrics.json'), report, indent=2)
  for task_name, rows in predictions.items():
    with atomic.open_for_write(os.path.join(output_dir, f'predictions-{task_name}.jsonl')) as f:
      for row in rows:
        f.write(json.dumps(row, ensure_ascii=False) + '\n')
  return metrics
