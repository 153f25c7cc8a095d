"""`temperature_sample` with `t5x.decoding.temperature_sample`'s signature, defaults and semantics.

The scenarios of t5x's `decoding_test.py` are ported in `tests/decoding/test_t5x_compat.py`:
`inputs [b, L]` is the decoder prompt shifted right (slot 0 the start; non-zero `inputs[:, j + 1]`
forces output j); a row ends when it generates an EOS (prompt EOS tokens do not count) or reaches
`min(L, prompt tokens + max_decode_steps)`, PAD after; scores sum the generated tokens'
log-probabilities; each step splits the key into (sample key, next key) as t5x does. Temperature
and top-p may be per example or traced, top-k traced; temperatures <= 1e-4 are greedy.

A loop of its own, not `autoregressive.decode`: t5x's interface gives an opaque cache with no
per-row rollback, forces prompt tokens and parks ended rows on a garbage slot.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding.sampling import topk_mask, topp_mask
from gqa_spec.decoding.t5x_compat.common import (MIN_TEMPERATURE, DecodingState,
                                                 TokensIdsToLogitsCallable, cache_map, is_tracer)

PyTree = Any
_EXTRA = 2  # sequences carry [start slot, L outputs, a garbage slot for rows past their limit]


@flax.struct.dataclass
class SamplingLoopState:
  """t5x's `SamplingLoopState`: what `state_callback_fn` / `logit_callback_fn` see."""

  step: jax.Array  # [] loop iterations so far
  cur_index: jax.Array  # [rows] position of cur_token per row
  sequences: jax.Array  # [rows, L + 2] start slot, prompt / generated tokens, garbage slot
  cache: PyTree
  cur_token: jax.Array  # [rows, 1]
  ended: jax.Array  # [rows, 1] bool
  rng: jax.Array  # the loop PRNG key
  log_prob: jax.Array  # [rows] scores so far


StateCallbackFn = Callable[[SamplingLoopState], SamplingLoopState]
LogitCallbackFn = Callable[[jax.Array, SamplingLoopState], jax.Array]


def _per_example(name: str, value, batch: int, num_decodes: int):
  """Scalars pass through; `[batch]` arrays are repeated per decode; other shapes are errors."""
  if value is None or jnp.ndim(value) == 0:
    return value
  if jnp.ndim(value) != 1 or jnp.shape(value)[0] != batch:
    raise ValueError(f'{name} must be a scalar or have shape [batch] = [{batch}], '
                     f'got shape {jnp.shape(value)}')
  return jnp.repeat(jnp.asarray(value), num_decodes)


def temperature_sample(
    inputs: jax.Array,
    cache: PyTree,
    tokens_to_logits: TokensIdsToLogitsCallable,
    eos_id: int,
    decode_rng: Optional[jax.Array] = None,
    num_decodes: int = 1,
    temperature: Union[float, jax.Array] = 1.0,
    topk: int = 1,
    topp: Union[float, jax.Array] = 0.0,
    cache_offset: int = 0,
    initial_index: Optional[jax.Array] = None,
    max_decode_steps: Optional[Union[int, jax.Array]] = None,
    max_decode_steps_hard_limit: Optional[int] = None,
    rescale_log_probs: bool = True,
    state_callback_fn: Optional[StateCallbackFn] = None,
    logit_callback_fn: Optional[LogitCallbackFn] = None,
) -> Tuple[jax.Array, jax.Array]:
  """Temperature sampling, t5x's semantics (see the module docstring).

  Args:
    inputs: `[b, L]` int decoder prompt, shifted right (slot 0 = start), 0 = free position.
    cache: t5x-style cache mapping (rows repeated `num_decodes` times at axis `cache_offset`).
    tokens_to_logits: `DecodingState -> ([b * n, V] logits, new cache)`.
    eos_id: end-of-sequence id.
    decode_rng: PRNG key (default `PRNGKey(0)`).
    num_decodes: n samples per example, rows ordered example-major (`[e0, e0, e1, e1, ...]`).
    temperature: scalar or `[b]`.
    topk: 0 = off; default 1 (greedy-like, t5x's default).
    topp: 0 = off; scalar or `[b]`.
    cache_offset: axis of the batch in the cache leaves.
    initial_index: optional `[b]` loop start per row (prefilled cache): the first token fed is
      `inputs[:, initial_index]`.
    max_decode_steps: optional scalar or `[b]` tokens to generate after the prompt.
    max_decode_steps_hard_limit: optional Python int clipping `max_decode_steps`.
    rescale_log_probs: score under the adjusted distribution (True) or the raw logits.
    state_callback_fn: `SamplingLoopState -> SamplingLoopState`, called before every step and
      on the final state.
    logit_callback_fn: `(logits [b * n, V], SamplingLoopState) -> logits`, before sampling.

  Returns:
    (`[b, n, L]` decodes, `[b, n]` scores), sorted by score ascending along n.

  Raises:
    ValueError: t5x's checks (both topk and topp non-zero; more steps than L) and bad shapes.
    NotImplementedError: a per-example (array) topk.
  """
  if decode_rng is None:
    decode_rng = jax.random.PRNGKey(0)
  if jnp.ndim(inputs) != 2:
    raise ValueError(f'inputs must be [batch, length], got shape {jnp.shape(inputs)}')
  if int(num_decodes) != num_decodes or num_decodes < 1:
    raise ValueError(f'num_decodes must be a positive integer, got {num_decodes}')
  if jnp.ndim(topk) != 0:
    raise NotImplementedError(f'topk must be a scalar (t5x: int); per-example topk of shape '
                              f'{jnp.shape(topk)} is not supported')
  batch = inputs.shape[0]
  temperature = _per_example('temperature', temperature, batch, num_decodes)
  topp = _per_example('topp', topp, batch, num_decodes)
  if (max_decode_steps_hard_limit is not None and max_decode_steps_hard_limit > 0
      and max_decode_steps is not None):
    max_decode_steps = jnp.minimum(max_decode_steps, max_decode_steps_hard_limit)
  max_decode_steps = _per_example('max_decode_steps', max_decode_steps, batch, num_decodes)
  if num_decodes > 1:
    inputs = jnp.repeat(inputs, num_decodes, axis=0)  # [b * n, L]
    cache = cache_map(lambda x: jnp.repeat(x, num_decodes, axis=cache_offset), cache,
                      cache_offset)
    if initial_index is not None:
      initial_index = jnp.repeat(initial_index, num_decodes)  # [b * n]
  decodes, log_prob = _single_trial(
      inputs, cache, tokens_to_logits, eos_id, decode_rng, temperature=temperature, topk=topk,
      topp=topp, initial_index=initial_index, max_decode_steps=max_decode_steps,
      rescale_log_probs=rescale_log_probs, state_callback_fn=state_callback_fn,
      logit_callback_fn=logit_callback_fn)  # [b * n, L], [b * n]
  decodes = decodes.reshape(batch, num_decodes, -1)  # [b, n, L]
  log_prob = log_prob.reshape(batch, num_decodes)  # [b, n]
  order = jnp.argsort(log_prob, axis=-1)  # [b, n] ascending
  return (jnp.take_along_axis(decodes, order[:, :, None], axis=1),
          jnp.take_along_axis(log_prob, order, axis=-1))


def _sample_warm(rng, logits, temperature, topk, topp, rescale_log_probs):
  """Temperature > MIN_TEMPERATURE: `[r, V]` logits -> (`[r]` tokens, `[r]` their log-probs)."""
  scaled = logits / jnp.maximum(temperature, MIN_TEMPERATURE)  # [r, V]
  if is_tracer(topk) or topk:
    scaled = jax.lax.cond(topk > 0, lambda: topk_mask(scaled, topk), lambda: scaled)
  if is_tracer(topp) or jnp.ndim(topp) or topp:  # rows with p = 0 are left unmasked
    scaled = topp_mask(scaled, topp)
  token = jax.random.categorical(rng, scaled).astype(jnp.int32)  # [r]
  log_probs = jax.nn.log_softmax(scaled if rescale_log_probs else logits)  # [r, V]
  return token, jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]


def _sample_greedy(logits, rescale_log_probs):
  """Temperature <= MIN_TEMPERATURE: argmax whatever topk / topp say; log-prob 0 when rescaled."""
  token = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [r]
  if rescale_log_probs:
    return token, jnp.zeros(token.shape, jnp.float32)
  log_probs = jax.nn.log_softmax(logits)  # [r, V]
  return token, jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]


def _choose(rng, logits, temperature, topk, topp, rescale_log_probs):
  """`[rows, V]` logits -> (`[rows]` tokens, `[rows]` log-probs), scalar or per-row temperature."""

  def pick(logits, t, p):
    return jax.lax.cond(t > MIN_TEMPERATURE,
                        lambda l, t: _sample_warm(rng, l, t, topk, p, rescale_log_probs),
                        lambda l, t: _sample_greedy(l, rescale_log_probs), logits, t)

  temperature = jnp.asarray(temperature)
  if temperature.ndim == 0:
    return pick(logits, temperature, topp)
  # Per row: one row at a time under vmap with the same (unbatched) key, as t5x does.
  row_topp = topp if jnp.ndim(topp) == 1 else jnp.broadcast_to(jnp.asarray(topp), temperature.shape)
  one_row = lambda row_logits, t, p: [x[0] for x in pick(row_logits[None], t, p)]
  return tuple(jax.vmap(one_row)(logits, temperature, row_topp))


def _single_trial(inputs, cache, tokens_to_logits, eos_id, rng, *, temperature, topk, topp,
                  initial_index, max_decode_steps, rescale_log_probs, state_callback_fn,
                  logit_callback_fn):
  """One sample per row of `[rows, L]` inputs -> (`[rows, L]` outputs, `[rows]` scores)."""
  if not (is_tracer(topp) or is_tracer(topk)) and np.any(topp) and topk:
    raise ValueError('At most one of `topp` or `topk` may be non-zero.')
  rows, length = inputs.shape
  limit = length  # per-row number of output positions to fill
  if max_decode_steps is not None:
    if not is_tracer(max_decode_steps) and np.any(np.asarray(max_decode_steps) > length):
      raise ValueError('Cannot decode more steps than the sequence length.')
    limit = jnp.minimum(length, jnp.sum(inputs != 0, axis=1) + max_decode_steps)  # [rows]
  sequences = jnp.concatenate(
      [inputs, jnp.zeros((rows, _EXTRA), inputs.dtype)], axis=1)  # [rows, L + 2]
  if initial_index is None:
    index = jnp.zeros((rows,), jnp.int32)
    token = jnp.zeros((rows, 1), jnp.int32)
  else:
    index = jnp.asarray(initial_index, jnp.int32)  # [rows]
    token = jnp.take_along_axis(sequences, index[:, None], axis=1)  # [rows, 1]
  prompt_eos = jnp.sum(sequences == eos_id, axis=1, keepdims=True)  # [rows, 1]
  slots = jnp.arange(length + _EXTRA)[None]  # [1, L + 2]
  init = SamplingLoopState(step=jnp.zeros((), jnp.int32), cur_index=index, sequences=sequences,
                           cache=cache, cur_token=token, ended=jnp.zeros((rows, 1), bool),
                           rng=rng, log_prob=jnp.zeros((rows,), jnp.float32))

  def body(state: SamplingLoopState) -> SamplingLoopState:
    if state_callback_fn is not None:
      state = state_callback_fn(state)
    sample_rng, next_rng = jax.random.split(state.rng)  # t5x's split order
    frozen = isinstance(state.cache, flax.core.FrozenDict)
    logits, new_cache = tokens_to_logits(DecodingState(
        cur_index=state.cur_index, sequences=state.sequences[:, :-_EXTRA],
        cur_token=state.cur_token, cache=state.cache))  # [rows, V]
    if frozen:
      new_cache = flax.core.freeze(new_cache)
    if logit_callback_fn is not None:
      logits = logit_callback_fn(logits, state)
    sampled, log_prob = _choose(sample_rng, logits, temperature, topk, topp, rescale_log_probs)
    # Rows past their limit keep writing the garbage slot L + 1 until every row has ended.
    i = jnp.minimum(state.cur_index, limit)  # [rows]
    prompt = jnp.take_along_axis(state.sequences, (i + 1)[:, None], axis=1)[:, 0]  # [rows]
    free = prompt == 0  # [rows] not forced by the prompt
    ended = state.ended[:, 0]  # [rows]
    token = jnp.where(free, sampled, prompt)
    token = jnp.where(ended, 0, token)  # PAD once ended
    scores = state.log_prob + jnp.where(free & ~ended, log_prob, 0.0)  # [rows]
    sequences = jnp.where(slots == (i + 1)[:, None], token[:, None].astype(state.sequences.dtype),
                          state.sequences)  # [rows, L + 2]
    generated_eos = jnp.sum(sequences == eos_id, axis=1, keepdims=True) > prompt_eos  # [rows, 1]
    ended = state.ended | generated_eos | (i >= limit - 1)[:, None]
    return SamplingLoopState(step=state.step + 1, cur_index=i + 1, sequences=sequences,
                             cache=new_cache, cur_token=token[:, None], ended=ended,
                             rng=next_rng, log_prob=scores)

  final = jax.lax.while_loop(lambda s: ~jnp.all(s.ended), body, init)
  if state_callback_fn is not None:
    final = state_callback_fn(final)
  return final.sequences[:, 1:-1], final.log_prob  # [rows, L], [rows]
