"""Inference on a task or mixture split, writing t5x-style prediction files (`scripts/infer.py`).

One JSON line per example, in dataset order, in `OUTPUT_DIR/<task>-<mode>.jsonl-00000-of-00001`
(t5x's `infer` file name for one shard):

  {"inputs": {"inputs_pretokenized": ..., "targets_pretokenized": ...},  # the task's raw text
   "prediction": "...",
   "aux": {"scores": -3.2}}                                               # mode predict_with_aux

Decoding goes through `gqa_spec.decoding.t5x_compat` on gqa-spec's T5 decode cache, i.e. t5x's own
decode functions' semantics: 'greedy' (temperature_sample at temperature 0), 'sample'
(temperature / topk / topp), 'beam' (beam_search, the best beam), 'speculative' (speculative_sample
with a draft; its scores are null: that loop computes no log-probabilities). Scores are the
sequence log-probability under the model (temperature_sample's `rescale_log_probs=False`), or t5x's
length-normalised beam score.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec import arguments, atomic
from gqa_spec.data import exported, vocab_fit
from gqa_spec.evaluation import outputs
from gqa_spec.decoding import memory
from gqa_spec.errors import UserError
from gqa_spec.decoding.targets import cache_length

DECODINGS = ('greedy', 'sample', 'beam', 'speculative')
MODES = ('predict', 'predict_with_aux')
EOS = 1


def _tokens_to_logits(model, params):
  from gqa_spec.models import decode_cache  # pylint: disable=g-import-not-at-top

  def tokens_to_logits(state):
    logits, cache = decode_cache.decode_tokens(model, params, state.cache, state.cur_token)
    return (logits[:, 0] if logits.shape[1] == 1 else logits), cache  # [b, V] or [b, k, V]

  return tokens_to_logits


@functools.partial(jax.jit, static_argnames=('model', 'cache_length'))
def _encode_and_cache(model, params, encoder_tokens, cache_length):
  from gqa_spec.models import decode_cache  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  encoded = model.apply({'params': params}, encoder_tokens, method=Transformer.encode)
  return decode_cache.init_decode_cache(model, params, encoded, encoder_tokens, cache_length)


@functools.partial(jax.jit, static_argnames=('model', 'length', 'decoding', 'beam_size', 'alpha',
                                             'temperature', 'topk', 'topp'))
def _predict(model, params, encoder_tokens, rng, *, length, decoding, beam_size, alpha,
             temperature, topk, topp):
  """`[b, S]` inputs -> (`[b, length]` tokens, PAD after EOS; `[b]` scores)."""
  from gqa_spec.decoding import t5x_compat  # pylint: disable=g-import-not-at-top
  cache = _encode_and_cache(model, params, encoder_tokens, length)
  inputs = jnp.zeros((encoder_tokens.shape[0], length), jnp.int32)
  fn = _tokens_to_logits(model, params)
  if decoding == 'beam':
    beams, scores = t5x_compat.beam_search(inputs, cache, fn, EOS, num_decodes=beam_size,
                                           alpha=alpha)  # ascending: best last
    return beams[:, -1], scores[:, -1]
  decodes, scores = t5x_compat.temperature_sample(
      inputs, cache, fn, EOS, decode_rng=rng, temperature=temperature, topk=topk, topp=topp,
      rescale_log_probs=False)
  return decodes[:, 0], scores[:, 0]


def infer(checkpoint_path: str, mixture_or_task_name: str, output_dir: str, *,
          split: str = 'validation', task_feature_lengths: Optional[Mapping[str, int]] = None,
          batch_size: int = 32, num_examples: Optional[int] = None, mode: str = 'predict',
          decoding: str = 'greedy', beam_size: int = 4, alpha: float = 0.6,
          temperature: float = 1.0, topk: int = 0, topp: float = 0.0, seed: int = 0,
          draft: Optional[str] = None, gamma: int = 4,
          param_dtype: Optional[str] = None, layout: Optional[str] = None) -> Dict[str, str]:
  """Decodes every example of each task of a split and writes t5x-style prediction files.

  Args:
    checkpoint_path: a training run dir (latest step), a native or an HF checkpoint.
    mixture_or_task_name: registered task or mixture, or an exported one (`exported:DIR/TASK`,
      read without seqio or TensorFlow).
    output_dir: where the files go.
    split: dataset split.
    task_feature_lengths: input/target lengths (None: the task's defaults); targets bound the
      decode length.
    batch_size: examples per decode call (the last batch is padded).
    num_examples: the first N examples per task (None: all).
    mode: 'predict' or 'predict_with_aux' (adds `aux.scores`).
    decoding: 'greedy', 'sample', 'beam' or 'speculative'.
    beam_size, alpha: of 'beam'.
    temperature, topk, topp, seed: of 'sample' (t5x's meanings: topk / topp 0 = off).
    draft, gamma: of 'speculative' (draft: copy, unigram:PATH, bigram:PATH or a checkpoint dir).
    param_dtype: cast the floating parameters (target and model draft) to it once, at load
      ('float32' or 'bfloat16'; None: as stored).
    layout: the layer layout decoding runs in, converted at load ('scanned', 'unrolled'; None:
      unrolled, `models.layout.DECODE_LAYOUT`).

  Returns:
    `{task name: file written}`.
  """
  if decoding not in DECODINGS:
    raise UserError(f'unknown decoding {decoding!r}; known: {", ".join(DECODINGS)}')
  if mode not in MODES:
    raise UserError(f'unknown mode {mode!r}; known: {", ".join(MODES)} (score is not supported)')
  if (decoding == 'speculative') != bool(draft):
    raise UserError("a draft is needed by, and only used by, decoding 'speculative'")
  if batch_size < 1:
    raise UserError(f'batch_size must be positive, got {batch_size}')
  from gqa_spec.checkpoints import param_dtype as dtype_lib  # pylint: disable=g-import-not-at-top
  dtype_lib.check(param_dtype, 'param_dtype')
  arguments.check_outputs({'INFER_OUTPUT_DIR': output_dir}, folders=True,  # before any work
                          inputs={'CHECKPOINT_PATH': checkpoint_path, 'DRAFT': draft})
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints.load import load_any, scan_layers_of  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.layout import DECODE_LAYOUT  # pylint: disable=g-import-not-at-top
  scan_layers = scan_layers_of(layout or DECODE_LAYOUT)
  if not exported.is_exported(mixture_or_task_name):
    from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top  (TensorFlow)
    tasks.use_data_of(checkpoint_path)  # a model knows its data (the smoke run's, say)
  if exported.is_exported(mixture_or_task_name):
    task_batches, lengths = _exported_batches(mixture_or_task_name, split, task_feature_lengths,
                                              batch_size, num_examples)
  else:
    task_batches, lengths = _seqio_batches(mixture_or_task_name, split, task_feature_lengths,
                                           batch_size, num_examples)
  length = lengths['targets']
  config, params, _ = load_any(checkpoint_path, scan_layers=scan_layers, model=True)
  memory.check_feature_length(config, lengths, batch_size,
                                   beam_size if decoding == 'beam' else 1)
  vocab_fit.check({name: vocab.vocab_size for name, vocab, _ in task_batches}, config.vocab_size,
                  checkpoint_path, checkpoint=checkpoint_path)
  config, params = dtype_lib.cast(config, params, param_dtype, 'param_dtype')
  model = Transformer(config)
  decode = functools.partial(
      _predict, model, params, length=length, decoding=decoding, beam_size=beam_size,
      alpha=alpha, temperature=temperature if decoding == 'sample' else 0.0,
      topk=topk if decoding == 'sample' else 0, topp=topp if decoding == 'sample' else 0.0)
  if decoding == 'speculative':
    decode = _speculative(model, params, config, length, draft, gamma, param_dtype)
  writer = jax.process_index() == 0  # every process decodes every batch; process 0 writes
  if writer:
    os.makedirs(output_dir, exist_ok=True)
    outputs.note_replaced(output_dir, [_file_name(name, mode) for name, _, _ in task_batches])
  written = {}
  rng = jax.random.PRNGKey(seed)
  for name, vocab, batches in task_batches:
    path = os.path.join(output_dir, _file_name(name, mode))
    with atomic.open_for_write(path) if writer else open(os.devnull, 'w') as f:
      for raw, inputs in batches:
        n = inputs.shape[0]  # inputs: [n, S]
        if n < batch_size:  # one compiled shape for every batch
          inputs = np.concatenate([inputs, np.zeros((batch_size - n, inputs.shape[1]), np.int32)])
        rng, batch_rng = jax.random.split(rng)
        tokens, scores = jax.device_get(decode(jnp.asarray(inputs), batch_rng))
        for i in range(n):
          ids = [int(t) for t in tokens[i]]
          ids = ids[:ids.index(EOS)] if EOS in ids else ids
          line = {'inputs': raw[i], 'prediction': vocab.decode([t for t in ids if t != 0])}
          if mode == 'predict_with_aux':
            line['aux'] = {'scores': None if np.isnan(scores[i]) else float(scores[i])}
          f.write(json.dumps(line, ensure_ascii=False) + '\n')
    written[name] = path
  return written


def _file_name(task: str, mode: str) -> str:
  return f'{task}-{mode}.jsonl-00000-of-00001'  # t5x's name for one shard


# Per task: (name, vocabulary, batches of ([raw text features per example], [n, S] int32 inputs)).
TaskBatches = Tuple[str, Any, Iterator[Tuple[List[Dict[str, Any]], np.ndarray]]]


def _seqio_batches(name: str, split: str, lengths: Optional[Mapping[str, int]], batch_size: int,
                   num_examples: Optional[int]) -> Tuple[List[TaskBatches], Dict[str, int]]:
  """A registered task or mixture's batches, read by seqio (TensorFlow)."""
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow only when inferring)
  from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top
  tasks.get(name)
  lengths = dict(lengths or tasks.feature_lengths(name))

  def batches(task):
    ds = task.get_dataset(sequence_length=lengths, split=split, shuffle=False, num_epochs=1)
    if num_examples is not None:
      ds = ds.take(num_examples)
    # The converter pads every row to the feature lengths, so its batches stack; the task's own
    # examples (token rows of their own lengths) are read one by one, for their raw text.
    model_ds = seqio.EncDecFeatureConverter(pack=False)(ds, lengths)
    raw = ({k: _json(v) for k, v in ex.items() if k.endswith('_pretokenized')}
           for ex in ds.as_numpy_iterator())
    for features in model_ds.batch(batch_size).as_numpy_iterator():
      inputs = np.asarray(features['encoder_input_tokens'], np.int32)  # [n, S]
      yield [next(raw) for _ in range(len(inputs))], inputs

  return [(task.name, task.output_features['targets'].vocabulary, batches(task))
          for task in seqio.get_subtasks(seqio.get_mixture_or_task(name))], lengths


def _exported_batches(name: str, split: str, lengths: Optional[Mapping[str, int]],
                      batch_size: int, num_examples: Optional[int]
                      ) -> Tuple[List[TaskBatches], Dict[str, int]]:
  """An exported task or mixture's batches, read without TensorFlow (`data.exported`)."""
  tasks, _ = exported.resolve(name)
  lengths = dict(lengths or exported.common_lengths(tasks))
  tasks = [t for t in tasks if split in t.manifest['splits']]
  if not tasks:
    raise UserError(f'{name} has no exported split {split!r}')

  def batches(task):
    texts = task.texts(split)
    for indices, features in exported.eval_batches(task, split, lengths, batch_size,
                                                    num_examples):
      yield ([{k: v for k, v in texts[i].items() if k.endswith('_pretokenized')}
              for i in indices], features['encoder_input_tokens'])

  return [(task.name, task.vocabulary, batches(task)) for task in tasks], lengths


def _speculative(model, params, config, length, draft_spec, gamma, param_dtype):
  from gqa_spec.decoding import speculative, t5x_compat  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.drafts import factory  # pylint: disable=g-import-not-at-top
  draft, draft_init, _ = factory.make_draft(draft_spec, config, gamma, length,
                                            param_dtype=param_dtype)
  fn = _tokens_to_logits(model, params)

  def decode(encoder_tokens, rng):
    cache = _encode_and_cache(model, params, encoder_tokens,
                              cache_length(length, gamma + 1))
    decodes, scores = t5x_compat.speculative_sample(
        inputs=jnp.zeros((encoder_tokens.shape[0], length), jnp.int32), cache=cache,
        tokens_to_logits=fn, eos_id=EOS, num_decodes=1, decode_rng=rng, cache_offset=0,
        draft=draft, draft_state=draft_init(encoder_tokens), gamma=gamma, temperature=0.0)
    return decodes[:, 0], scores[:, 0]

  return decode


def _json(value: Any) -> Any:
  if isinstance(value, bytes):
    return value.decode('utf-8')
  return value.tolist() if isinstance(value, np.ndarray) else value
