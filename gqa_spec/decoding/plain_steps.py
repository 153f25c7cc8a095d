"""Plain target steps in the adaptive loops, where no row speculates.

`plain_decode` is a whole call that never speculates (greedy decoding's loop with the adaptive
result's statistics); `plain_loop` finishes an adaptive call once every active row asks for 0;
`as_adaptive_result` puts `plain_decode`'s outputs in `adaptive.decode`'s result form.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import autoregressive, sampling, xla_options
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import LoopState, SpeculativeResult
from gqa_spec.decoding.targets import Decoder

PyTree = Any


@functools.partial(xla_options.jit, static_argnames=('target', 'gamma_max', 'max_decode_len',
                                                     'config', 'eos_id', 'iteration_trace'))
def plain_decode(target: Decoder, target_state: PyTree, rng: jax.Array, *, gamma_max: int,
                 max_decode_len: int, config: SamplingConfig, eos_id: int,
                 skip: Optional[jax.Array], iteration_trace: bool = False) -> Tuple[jax.Array, ...]:
  """`adaptive.decode` where no row speculates (also `adaptive_tree.decode`'s, gamma_max = N_max
  there), as one compiled program: autoregressive decoding, its `gamma_histogram`
  `[b, gamma_max + 1]` and `gamma_trace` `[b, max_decode_len]` (every call at draft length 0), and
  with `iteration_trace` the trees' `tree_width_trace` `[max_decode_len]` (-1 after the last)."""
  r = autoregressive.decode(target, target_state, rng, max_decode_len=max_decode_len,
                            config=config, eos_id=eos_id, skip=skip)
  batch = r.target_calls.shape[0]
  calls = jnp.arange(max_decode_len)[None]  # [1, max_decode_len]
  histogram = jnp.zeros((batch, gamma_max + 1), jnp.int32).at[:, 0].set(r.target_calls)
  trace = jnp.where(calls < r.target_calls[:, None], 0, -1).astype(jnp.int32)  # [b, L]
  if iteration_trace:
    return r, histogram, trace, jnp.where(calls[0] < r.loop_iterations, 0, -1).astype(jnp.int32)
  return r, histogram, trace


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


def mark_plain(s: LoopState, before: SpeculativeResult, histogram: str, trace: str,
               width_trace: Optional[str] = None) -> LoopState:
  """`s` after `plain_loop`, its plain steps (those past `before`, the result when they began)
  counted at size 0 in the result's fields named `histogram` (`[b, K + 1]`), `trace`
  (`[b, max_decode_len]`, per row call) and `width_trace` (`[max_decode_len]`, per iteration)."""
  r = s.result
  calls = jnp.arange(getattr(r, trace).shape[1])  # [max_decode_len]
  plain = ((calls[None] >= before.target_calls[:, None])
           & (calls[None] < r.target_calls[:, None]))  # [b, max_decode_len]
  fields = {trace: jnp.where(plain, 0, getattr(r, trace)),
            histogram: getattr(r, histogram).at[:, 0].add(r.target_calls - before.target_calls)}
  if width_trace is not None:
    iterations = (calls >= before.loop_iterations) & (calls < r.loop_iterations)
    fields[width_trace] = jnp.where(iterations, 0, getattr(r, width_trace))
  return s.replace(result=r.replace(**fields))


def as_adaptive_result(r: autoregressive.DecodeResult, depth: int, **fields) -> SpeculativeResult:
  """`plain_decode`'s result `r` as the adaptive loops' result, statistics `depth` draft positions
  wide, with their own `fields` (`gamma_histogram`, `tree_nodes_trace`, ...); `sequences` stay
  `[b, 1 + max_decode_len]` (no draft slack), the statistics that are zeros are host constants."""
  zeros_b = np.zeros((r.lengths.shape[0],), np.int32)
  return SpeculativeResult(
      sequences=r.sequences, lengths=r.lengths, target_calls=r.target_calls, proposed=zeros_b,
      accepted=zeros_b, accepted_per_position=np.zeros((depth,), np.int32),
      accept_histogram=np.zeros((depth + 1,), np.int32),
      beta_sum=np.zeros((), np.float32), beta_count=np.zeros((), np.float32),
      loop_iterations=r.loop_iterations, **fields)
