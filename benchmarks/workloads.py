"""What the benchmarks measure: random-init models, the built-in demo speculative pair, synthetic
and task inputs, bigram drafts, and the train settings with their stated FLOPs.

Train settings (`SETTINGS`) are the `cpu` reproduction preset's train steps of the `mini` target, on
synthetic packed batches of the preset's shapes (`gqa_spec.training.data.synthetic_batches`, so
that the step and not the input pipeline is measured):
  pretrain   batch 16 x 128/32 tokens, dropout 0 (span corruption's shapes), rsqrt lr
  finetune   batch 16 x 64/64 tokens, dropout 0.1 (translation's shapes), constant lr
  summarize  batch 16 x 128/32 tokens, dropout 0.1

FLOPs per train step (`model_flops`; stated, not measured): 6 x (matmul parameters x the tokens that
pass through them: encoder layers x encoder tokens, decoder layers and the logits kernel x decoder
tokens; the embedding lookup is not a matmul) + 3 x the attention matmuls (2 x 2 x q x k x heads x
head_dim per row for QK^T and AV; encoder self, decoder self and cross), counting every position of
the padded batch.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import autoregressive
from gqa_spec.decoding.drafts import fit_ngram
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models.config import T5Config, preset
from gqa_spec.models.t5 import Transformer
from gqa_spec.training import optimizer
from gqa_spec.training.data import DatasetConfig, synthetic_batches
from gqa_spec.partitioning import Partitioner
from gqa_spec.checkpoints import param_dtype
from gqa_spec.training.train_step import TrainStep

SETTINGS = {  # name: (batch, inputs length, targets length, dropout, pre-training schedule)
    'pretrain': (16, 128, 32, 0.0, True),
    'finetune': (16, 64, 64, 0.1, False),
    'summarize': (16, 128, 32, 0.1, False),
}


# ----------------------------------------------------------------------------- models


# A Transformer (a frozen dataclass of its config) is hashable: one compiled init per model.
@functools.partial(jax.jit, static_argnums=(0, 2))
def _init(model: Transformer, rng: jax.Array, dtype: Optional[str] = None):
  dummy = jnp.ones((1, 8), jnp.int32)  # [batch, length]: shapes do not matter to the params
  params = model.init(rng, dummy, dummy, dummy, enable_dropout=False)['params']
  return param_dtype.cast(model.config, params, dtype)[1]  # inside the jit: no float32 copy kept


def random_params(model: Transformer, seed: int = 0, dtype: Optional[str] = None):
  """Random-init parameters of `model` (float32, as t5x keeps them), cast to `dtype` (None:
  float32) as `gqa-spec generate --param-dtype` casts a checkpoint's."""
  return _init(model, jax.random.PRNGKey(seed), dtype)


def shaped_random_params(model: Transformer, seed: int = 0, dtype: Optional[str] = None):
  """Parameters of `model`'s shapes without compiling its init: every floating leaf random normal
  with std 1/sqrt(fan-in) (norm scales 1), made leaf by leaf in `dtype` (None: float32) on the
  default device. Not the model's init distribution: for timings, which depend on shapes only."""
  shapes = jax.eval_shape(lambda r: model.init(r, *(jnp.ones((1, 8), jnp.int32),) * 3,
                                               enable_dropout=False)['params'],
                          jax.random.PRNGKey(seed))
  paths, tree = jax.tree_util.tree_flatten_with_path(shapes)
  out_dtype = jnp.dtype(dtype or 'float32')
  keys = jax.random.split(jax.random.PRNGKey(seed), len(paths))
  made = []
  for key, (path, leaf) in zip(keys, paths):
    if getattr(path[-1], 'key', None) == 'scale':  # an RMSNorm scale
      made.append(jnp.ones(leaf.shape, out_dtype))
    else:
      made.append(_normal(key, leaf.shape, out_dtype, 1.0 / np.sqrt(leaf.shape[0])))
  return jax.tree_util.tree_unflatten(tree, made)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _normal(key, shape, dtype, std):
  return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def shaped_random_state(shapes, params):
  """A decode state of `shapes` (`jax.eval_shape` of a decoder's `init`) holding `params`: random
  K/V (std 1, the cache's dtype), index and positions 0, every boolean (encoder mask) True."""
  leaves, tree = jax.tree_util.tree_flatten(shapes.replace(params=None))
  keys = jax.random.split(jax.random.PRNGKey(1), max(len(leaves), 1))
  made = []
  for key, leaf in zip(keys, leaves):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      made.append(_normal(key, leaf.shape, jnp.dtype(leaf.dtype), 1.0))
    elif leaf.dtype == jnp.bool_:
      made.append(jnp.ones(leaf.shape, jnp.bool_))
    else:
      made.append(jnp.zeros(leaf.shape, leaf.dtype))
  return jax.tree_util.tree_unflatten(tree, made).replace(params=params)


def kv_heads(config: T5Config, kv: str) -> int:
  """The K/V head count that `kv` (mha, mqa or gqaG) names for `config`'s query heads."""
  return {'mha': config.num_heads, 'mqa': 1}.get(kv) or int(kv[3:])


def checkpoint_model(path: str) -> Tuple[Transformer, Any]:
  """`(model, params)` of the native checkpoint at `path`."""
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  config, params, _ = native.load_checkpoint(path)
  return Transformer(config), params


def tree_bytes(tree) -> int:
  """Bytes of every array in `tree` (parameters, caches)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def demo_pair(perturb: float) -> Tuple[Transformer, Any, Dict[str, Tuple[Transformer, Any]]]:
  """The built-in UNTRAINED pair: `(target model, params, {draft name: (model, params)})`.

  A random-init `mini` target (MHA, so HF T5 holds the same weights) with drafts "perturbed" (the
  target's weights + `perturb` x std Gaussian noise: alpha high, c ~ 1) and "nano" (random-init:
  c small, alpha ~ 0).
  """
  target_model = Transformer(preset('mini'))
  params = random_params(target_model)
  nano = Transformer(preset('nano'))
  return target_model, params, {'perturbed': (target_model, perturbed(params, perturb)),
                                'nano': (nano, random_params(nano))}


def perturbed(params, scale: float, seed: int = 1):
  """`params` + `scale` x (each array's std) Gaussian noise, seeded: a draft whose acceptance the
  scale sets (high at small scales) and whose cost is the model's own."""
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree_util.tree_unflatten(tree, [
      x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


# ----------------------------------------------------------------------------- inputs and bigrams


def synthetic_inputs(n: int, length: int, vocab: int, seed: int) -> np.ndarray:
  """`[n, length]` encoder inputs: random tokens (ids 2 to 999) of random length, EOS, padding."""
  rng = np.random.RandomState(seed)
  out = np.zeros((n, length), np.int32)
  for i in range(n):
    m = rng.randint(length // 2, length)
    out[i, :m - 1] = rng.randint(2, min(vocab, 1000), size=m - 1)
    out[i, m - 1] = 1
  return out


def task_inputs(task: str, data_dir: str, n: int, input_length: int,
                max_decode_len: int, splits: Sequence[str] = ('test',)) -> np.ndarray:
  """`[n, input_length]` the first n inputs of the DDTP `task` over `data_dir`, or of an exported
  task (`exported:DIR/TASK`, `gqa-spec data export`: read without TensorFlow or seqio, as on the
  GPU machine; `data_dir` unused): those of `splits` in turn (a split's inputs all before the
  next's), so that a run can decode more batches than the test split holds."""
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  lengths = {'inputs': input_length, 'targets': max_decode_len}
  rows = []
  if exported.is_exported(task):
    (exp,), _ = exported.resolve(task)
    for split in splits:
      if len(rows) < n:
        for _, feats in exported.eval_batches(exp, split, lengths, n - len(rows), n - len(rows)):
          rows.extend(np.asarray(feats['encoder_input_tokens'], np.int32))
  else:
    from gqa_spec.data import batches, tasks  # pylint: disable=g-import-not-at-top  (TensorFlow)
    tasks.register_ddtp_tasks(data_dir)
    for split in splits:
      if len(rows) < n:
        ds = batches.get_dataset(task, split, lengths, pack=False)
        rows.extend(ex['encoder_input_tokens'] for ex in ds.take(n - len(rows)).as_numpy_iterator())
  if len(rows) < n:
    raise SystemExit(f'{task} has {len(rows)} inputs in its {"+".join(splits)} split(s), '
                     f'{n} asked for (--examples, twice with --confirm; --splits reads more)')
  return np.stack(rows[:n]).astype(np.int32)



def output_bigram(model: Transformer, params, input_length: int, max_decode_len: int):
  """A bigram table fitted on `model`'s own greedy outputs for 32 synthetic inputs (seed 1, so not
  the measured ones): the draft a model's outputs imply without its weights."""
  vocab = model.config.vocab_size
  other = jnp.asarray(synthetic_inputs(32, input_length, vocab, seed=1))  # [32, S]
  dec = T5Decoder(model)
  res = autoregressive.decode(dec, dec.init(params, other, max_decode_len + 1),
                              jax.random.PRNGKey(0), max_decode_len=max_decode_len)
  return fit_ngram(autoregressive.strip(res.sequences, res.lengths), 2, vocab)


# ----------------------------------------------------------------------------- train steps


def model_flops(config: T5Config, batch: int, enc_len: int, dec_len: int) -> float:
  """The stated FLOPs of one train step (see the module docstring)."""
  e, h, d, m = config.emb_dim, config.num_heads, config.head_dim, config.mlp_dim
  g = config.num_kv_heads
  mlp = e * m * (len(config.mlp_activations) + 1)
  enc_layer = 4 * e * h * d + mlp
  dec_layer = 2 * (2 * e * h * d + 2 * e * g * d) + mlp
  enc_tokens, dec_tokens = batch * enc_len, batch * dec_len
  dense = (config.num_encoder_layers * enc_layer * enc_tokens
           + (config.num_decoder_layers * dec_layer + e * config.vocab_size) * dec_tokens)
  attn = 4 * h * d * batch * (config.num_encoder_layers * enc_len * enc_len
                              + config.num_decoder_layers * (dec_len * dec_len + dec_len * enc_len))
  return 6 * dense + 3 * attn


def train_step(config: T5Config, pretrain: bool) -> TrainStep:
  """The reproduction's Adafactor train step of `config`: rsqrt decay (pre-training) or constant."""
  lr = optimizer.rsqrt_decay(warmup_steps=500) if pretrain else optimizer.constant(1e-2)
  return TrainStep(config, optimizer.adafactor(), lr, Partitioner.create(config))


def train_batches(step: TrainStep, batch: int, enc_len: int, dec_len: int,
                  count: int = 1) -> List[Dict[str, jax.Array]]:
  """`count` synthetic packed batches of `batch` x `enc_len`/`dec_len` tokens, sharded for
  `step`."""
  data = DatasetConfig('synthetic', {'inputs': enc_len, 'targets': dec_len}, batch_size=batch)
  return [step.partitioner.shard_batch(b) for b, _ in
          zip(synthetic_batches(data, batch, vocab_size=step.config.vocab_size), range(count))]
