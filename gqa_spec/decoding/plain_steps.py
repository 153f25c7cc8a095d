"""Plain target steps in the adaptive loops, where no row speculates.

`plain_decode` is a whole call that never speculates (greedy decoding's loop, as an adaptive
result); `plain_loop` finishes an adaptive call once every active row asks for 0; `mark_plain`
counts either's calls at draft size 0 in the result's per-row statistics (`adaptive_fields`).
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from gqa_spec.decoding import autoregressive, sampling, xla_options
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import LoopState, SpeculativeResult, init_loop
from gqa_spec.decoding.targets import Decoder

PyTree = Any


def adaptive_fields(batch: int, size: int, max_decode_len: int, histogram: str, trace: str,
                    width_trace: Optional[str] = None) -> Dict[str, jax.Array]:
  """An adaptive result's statistics before its first call, by name: `histogram [b, size]` zeros,
  `trace [b, max_decode_len]` (per row call) and `width_trace [max_decode_len]` (per iteration)
  -1."""
  fields = {histogram: jnp.zeros((batch, size), jnp.int32),
            trace: jnp.full((batch, max_decode_len), -1, jnp.int32)}
  if width_trace is not None:
    fields[width_trace] = jnp.full((max_decode_len,), -1, jnp.int32)
  return fields


@functools.partial(xla_options.jit, static_argnames=('target', 'depth', 'size', 'fields',
                                                     'max_decode_len', 'config', 'eos_id'))
def plain_decode(target: Decoder, target_state: PyTree, rng: jax.Array, *, depth: int, size: int,
                 fields: Tuple[str, ...], max_decode_len: int, config: SamplingConfig,
                 eos_id: int, skip: Optional[jax.Array]) -> SpeculativeResult:
  """`adaptive.decode` (and `adaptive_tree.decode`) where no row speculates, as one compiled
  program: autoregressive decoding as an adaptive result of `depth` draft positions, every call
  counted at size 0 in its `fields` (`adaptive_fields`, the histogram `size` wide). `sequences`
  stay `[b, 1 + max_decode_len]` (no draft slack)."""
  r = autoregressive.decode(target, target_state, rng, max_decode_len=max_decode_len,
                            config=config, eos_id=eos_id, skip=skip)
  before = init_loop(target, target_state, None, rng, max_decode_len, depth, skip).result.replace(
      sequences=r.sequences, lengths=r.lengths,
      **adaptive_fields(r.lengths.shape[0], size, max_decode_len, *fields))
  return mark_plain(before.replace(target_calls=r.target_calls, loop_iterations=r.loop_iterations),
                    before, *fields)


def plain_loop(target: Decoder, loop: LoopState, max_decode_len: int, config: SamplingConfig,
               eos_id: int) -> LoopState:
  """`loop` run to the end with plain one-token target steps, counting target calls and loop
  iterations (`mark_plain` counts their draft sizes). The draft's state stays out of the loop's
  carry: XLA would copy a carried input buffer into the loop once per call."""
  batch = loop.done.shape[0]

  def plain_step(s: LoopState) -> LoopState:
    r = s.result
    rng, step_rng = jax.random.split(s.rng)
    active = ~s.done  # [b]
    last = jnp.take_along_axis(r.sequences, r.lengths[:, None], axis=1)  # [b, 1]
    logits, tstate = target.tokens_to_logits(s.target_state, last)  # [b, 1, V]
    t, _ = sampling.choose(step_rng, logits[:, 0], config)  # [b]
    rows = jnp.arange(batch)
    slot = r.lengths + 1  # [b]
    sequences = r.sequences.at[rows, slot].set(
        jnp.where(active, t, r.sequences[rows, slot]))  # [b, width]
    lengths = r.lengths + active  # [b]
    done = s.done | (active & (t == eos_id)) | (lengths >= max_decode_len)
    result = r.replace(sequences=sequences, lengths=lengths, target_calls=r.target_calls + active,
                       loop_iterations=r.loop_iterations + 1)
    return LoopState(target_state=target.rollback(tstate, lengths), draft_state=s.draft_state,
                     done=done, result=result, rng=rng)

  out = jax.lax.while_loop(lambda s: ~jnp.all(s.done), plain_step, loop.replace(draft_state=None))
  return out.replace(draft_state=loop.draft_state)


def mark_plain(r: SpeculativeResult, before: SpeculativeResult, histogram: str, trace: str,
               width_trace: Optional[str] = None) -> SpeculativeResult:
  """`r` with its plain steps (those past `before`, the result when they began) counted at size 0
  in the fields named `histogram`, `trace` and `width_trace` (`adaptive_fields`)."""
  calls = jnp.arange(getattr(r, trace).shape[1])  # [max_decode_len]
  plain = ((calls[None] >= before.target_calls[:, None])
           & (calls[None] < r.target_calls[:, None]))  # [b, max_decode_len]
  fields = {trace: jnp.where(plain, 0, getattr(r, trace)),
            histogram: getattr(r, histogram).at[:, 0].add(r.target_calls - before.target_calls)}
  if width_trace is not None:
    iterations = (calls >= before.loop_iterations) & (calls < r.loop_iterations)
    fields[width_trace] = jnp.where(iterations, 0, getattr(r, width_trace))
  return r.replace(**fields)
