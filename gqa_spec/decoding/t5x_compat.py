"""A stand-in for `t5x.decoding.temperature_sample`: same call signature and return values.

  decodes, scores = temperature_sample(inputs, cache, tokens_to_logits, eos_id,
                                       decode_rng=rng, num_decodes=1, temperature=1.0, topk=1,
                                       topp=0.0, max_decode_steps=None)

`inputs [b, L]` is the decoder prompt (all zeros for encoder-decoder models; non-zero entries are
forced, as in t5x); `cache` is t5x-style (every leaf batch-major; repeated `num_decodes` times
here); `tokens_to_logits(DecodingState) -> (logits [b * n, V], new_cache)`. Returns
`decodes [b, num_decodes, L]` (PAD after EOS) sorted by `scores [b, num_decodes]`, the sum of the
tokens' log-probabilities (log_softmax of the raw logits, as t5x). topk = 0 and topp = 0 mean off,
topk = 1 or temperature = 0 greedy (t5x's defaults).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Protocol, Tuple

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding import sampling
from gqa_spec.decoding.sampling import SamplingConfig

PyTree = Any


@flax.struct.dataclass
class DecodingState:
  """t5x's `DecodingState`: what `tokens_to_logits` sees."""

  cur_index: jax.Array  # [b * n] position of cur_token
  sequences: jax.Array  # [b * n, L]
  cur_token: jax.Array  # [b * n, 1]
  cache: PyTree


class TokensIdsToLogitsCallable(Protocol):
  def __call__(self, decoding_state: DecodingState) -> Tuple[jax.Array, PyTree]:
    ...


def temperature_sample(inputs: jax.Array, cache: PyTree,
                       tokens_to_logits: TokensIdsToLogitsCallable, eos_id: int,
                       decode_rng: Optional[jax.Array] = None, num_decodes: int = 1,
                       temperature: float = 1.0, topk: int = 1, topp: float = 0.0,
                       max_decode_steps: Optional[int] = None, **unused: Any
                       ) -> Tuple[jax.Array, jax.Array]:
  """See the module docstring; `initial_index`, `cache_offset` etc. are accepted and ignored."""
  del unused
  if temperature == 0 or topk == 1:
    config = sampling.GREEDY
  else:
    config = SamplingConfig(temperature=float(temperature), top_k=int(topk),
                            top_p=float(topp) if topp > 0 else 1.0)
  rng = jax.random.PRNGKey(0) if decode_rng is None else decode_rng
  return _sample(inputs, cache, rng, tokens_to_logits=tokens_to_logits, eos_id=eos_id,
                 num_decodes=num_decodes, config=config, max_decode_steps=max_decode_steps)


@functools.partial(jax.jit, static_argnames=('tokens_to_logits', 'eos_id', 'num_decodes',
                                             'config', 'max_decode_steps'))
def _sample(inputs, cache, rng, *, tokens_to_logits: Callable, eos_id: int, num_decodes: int,
            config: SamplingConfig, max_decode_steps: Optional[int]):
  batch, length = inputs.shape
  steps = length if max_decode_steps is None else min(length, max_decode_steps)
  inputs = jnp.repeat(inputs, num_decodes, axis=0)  # [B, L], B = b * n
  cache = jax.tree_util.tree_map(lambda x: jnp.repeat(x, num_decodes, axis=0), cache)
  rows = batch * num_decodes
  seqs = jnp.concatenate([jnp.zeros((rows, 1), jnp.int32), inputs.astype(jnp.int32)], axis=1)

  def body(i, carry):
    seqs, cache, scores, ended, rng = carry
    rng, step_rng = jax.random.split(rng)
    state = DecodingState(cur_index=jnp.full((rows,), i, jnp.int32), sequences=seqs[:, 1:],
                          cur_token=jax.lax.dynamic_slice_in_dim(seqs, i, 1, axis=1), cache=cache)
    logits, cache = tokens_to_logits(state)  # [B, V]
    token, _ = sampling.choose(step_rng, logits, config)  # [B]
    forced = seqs[:, i + 1]  # [B] prompt token or 0
    token = jnp.where(forced != 0, forced, token)
    token = jnp.where(ended, 0, token)  # PAD after EOS
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], axis=1)[:, 0]
    scores = scores + jnp.where(ended, 0.0, logp)
    ended = ended | (token == eos_id)
    return seqs.at[:, i + 1].set(token), cache, scores, ended, rng

  init = (seqs, cache, jnp.zeros((rows,), jnp.float32), jnp.zeros((rows,), bool), rng)
  seqs, _, scores, _, _ = jax.lax.fori_loop(0, steps, body, init)
  decodes = seqs[:, 1:].reshape(batch, num_decodes, length)  # [b, n, L]
  scores = scores.reshape(batch, num_decodes)
  order = jnp.argsort(scores, axis=1)  # t5x returns ascending log-prob order
  return (jnp.take_along_axis(decodes, order[:, :, None], axis=1),
          jnp.take_along_axis(scores, order, axis=1))
