"""`speculative_sample`: a t5x `DecodeFnCallable` over `speculative.decode` / `adaptive.decode`.

The draft, its state and gamma come by partial application:

  decode_fn = functools.partial(t5x_compat.speculative_sample, draft=CopyDraft(vocab_size=V),
                                draft_state=CopyDraft(V).init(encoder_input_tokens), gamma=4)

`CallableDecoder` makes `tokens_to_logits` the loop's target. It must score `cur_token [rows, k]`
in one call (`[rows, k, V]`), and the cache must carry a per-row `cache_index` (`[rows]` leaves,
moved to roll rows back) with `targets.cache_length(L, gamma + 1)` slots; gqa-spec's
`decode_cache` does both. Scores are NaN: the loop computes no sequence log-probabilities.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from gqa_spec.decoding import adaptive, sampling, speculative
from gqa_spec.decoding.t5x_compat.common import MIN_TEMPERATURE, DecodingState, is_tracer

PyTree = Any


def _index_leaves(cache) -> dict:
  flat = traverse_util.flatten_dict(flax.core.unfreeze(cache))
  leaves = {k: v for k, v in flat.items() if k[-1] == 'cache_index'}
  if not leaves or any(jnp.ndim(v) != 1 for v in leaves.values()):
    raise NotImplementedError(
        'speculative decoding needs a cache with per-row `cache_index` leaves of shape [rows] '
        '(rows accept different numbers of tokens); got ' +
        (', '.join(f'{"/".join(k)}: {jnp.shape(v)}' for k, v in leaves.items()) or 'none'))
  return leaves


@dataclasses.dataclass(frozen=True)
class CallableDecoder:
  """gqa-spec's `Decoder` protocol over a t5x-style `tokens_to_logits` (see the module doc)."""

  fn: Callable[[DecodingState], Tuple[jax.Array, PyTree]]

  def tokens_to_logits(self, state, tokens, positions=None, mask=None):
    if positions is not None or mask is not None:
      raise NotImplementedError('tree verification (positions / mask) needs a gqa-spec Decoder')
    logits, cache = self.fn(DecodingState(cur_index=self.index(state), sequences=None,
                                          cur_token=tokens, cache=state))
    if logits.ndim == 2:  # [rows, V]: one token
      if tokens.shape[1] != 1:
        raise ValueError(f'tokens_to_logits returned {logits.shape} logits for {tokens.shape[1]} '
                         'tokens per row: speculative decoding needs [rows, k, V]')
      logits = logits[:, None]
    return logits, cache  # [rows, k, V]

  def rollback(self, state, index):
    flat = traverse_util.flatten_dict(flax.core.unfreeze(state))
    for key in _index_leaves(state):
      flat[key] = jnp.asarray(index, flat[key].dtype)
    out = traverse_util.unflatten_dict(flat)
    return flax.core.freeze(out) if isinstance(state, flax.core.FrozenDict) else out

  def index(self, state):
    return next(iter(_index_leaves(state).values()))


def _check_no_prompt(inputs) -> None:
  if np.any(np.asarray(inputs) != 0):
    raise NotImplementedError('decoder prompts (non-zero inputs) are not supported by '
                              'speculative_sample')


def _config(temperature, topk, topp) -> sampling.SamplingConfig:
  for name, value in (('temperature', temperature), ('topk', topk), ('topp', topp)):
    if is_tracer(value) or np.ndim(value) != 0:
      raise NotImplementedError(f'{name} must be a Python scalar for speculative decoding (the '
                                f'sampling method is static in the jitted loop), got {value!r}')
  if topp and topk:
    raise ValueError('At most one of `topp` or `topk` may be non-zero.')
  if temperature <= MIN_TEMPERATURE:
    return sampling.GREEDY
  return sampling.SamplingConfig(temperature=float(temperature), top_k=int(topk),
                                 top_p=float(topp) if topp else 1.0)


def speculative_sample(*, inputs: jax.Array, cache: PyTree, tokens_to_logits: Callable,
                       eos_id: int, num_decodes: int = 1, decode_rng: Optional[jax.Array] = None,
                       cache_offset: int = 0, draft: Any, draft_state: PyTree,
                       gamma: Union[int, adaptive.AdaptiveGamma],
                       temperature: float = 1.0, topk: int = 1, topp: float = 0.0,
                       max_decode_steps: Optional[int] = None,
                       initial_index: Optional[jax.Array] = None,
                       **unsupported: Any) -> Tuple[jax.Array, jax.Array]:
  """Speculative decoding behind t5x's `DecodeFnCallable` (see the module docstring).

  Args:
    inputs: `[b, L]` all zeros (no decoder prompt); L is the output length.
    cache: target cache with per-row `cache_index`, >= `targets.cache_length(L, gamma + 1)` slots.
    tokens_to_logits: `DecodingState(cur_token [b, k]) -> ([b, k, V] or, for k = 1, [b, V], cache)`.
    eos_id: end-of-sequence id.
    num_decodes: must be 1.
    decode_rng: PRNG key (default `PRNGKey(0)`).
    cache_offset: must be 0.
    draft: a gqa-spec `Draft` (by partial application).
    draft_state: its state for this batch (by partial application).
    gamma: draft tokens per iteration, or an `adaptive.AdaptiveGamma`: each row its own draft
      length, chosen in the loop (`gqa_spec.decoding.adaptive`; cache of
      `targets.cache_length(L, adaptive.call_tokens)` slots).
    temperature, topk, topp: t5x's meanings and defaults (temperature <= 1e-4 is greedy, topk /
      topp 0 = off), Python scalars; applied to target and draft alike.
    max_decode_steps: optional Python int <= L.
    initial_index: must be None.
    **unsupported: any other t5x argument raises NotImplementedError.

  Returns:
    (`[b, 1, L]` decodes, `[b, 1]` NaN scores).
  """
  for name, value in (('num_decodes', num_decodes != 1), ('cache_offset', cache_offset != 0),
                      ('initial_index', initial_index is not None)):
    if value:
      raise NotImplementedError(f'{name} is not supported by speculative_sample')
  if unsupported:
    raise NotImplementedError(f'not supported by speculative_sample: {sorted(unsupported)}')
  if is_tracer(inputs):  # under jit (as t5x's predict_batch_with_aux calls it): check at run time
    jax.debug.callback(_check_no_prompt, inputs)
  else:
    _check_no_prompt(inputs)
  config = _config(temperature, topk, topp)
  batch, length = inputs.shape
  steps = length
  if max_decode_steps is not None:
    if is_tracer(max_decode_steps) or np.ndim(max_decode_steps) != 0:
      raise NotImplementedError('max_decode_steps must be a Python int for speculative_sample')
    if max_decode_steps > length:
      raise ValueError('Cannot decode more steps than the sequence length.')
    steps = int(max_decode_steps)
  rng = jax.random.PRNGKey(0) if decode_rng is None else decode_rng
  if isinstance(gamma, adaptive.AdaptiveGamma):
    result = adaptive.decode(CallableDecoder(tokens_to_logits), cache, draft, draft_state, rng,
                             adaptive=gamma, max_decode_len=steps, config=config, eos_id=eos_id)
  else:
    result = speculative.decode(CallableDecoder(tokens_to_logits), cache, draft, draft_state, rng,
                                gamma=gamma, max_decode_len=steps, config=config, eos_id=eos_id)
  decodes = jnp.zeros((batch, length), jnp.int32).at[:, :steps].set(
      result.sequences[:, 1:steps + 1])  # [b, L]
  return decodes[:, None], jnp.full((batch, 1), jnp.nan, jnp.float32)
