"""Token trees that size themselves per row (`generate --tree best:auto[:N],depth:D[,width:W]`).

The tree loop (`tree_speculative.tree_step`) with best-first trees whose node count follows each
row's running acceptance (`tree_policy.AdaptiveTree.choose`; 0 = no tree). The draft grows the
largest tree every iteration, its nodes in rank order (`tree.by_rank`), so the first n nodes are
the best-first tree of budget n; the target verifies the first w nodes of every row, w the
narrowest compiled width holding the largest ask, each width its own while loop
(`adaptive.run_widths`). Once no active row asks for a tree the rest are plain target steps.

The output stays exact: w depends only on the batch's past, so it is a stopping rule, and the
top-w tree is verified by the lossless multi-candidate rule (`tree.py`).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import sampling, xla_options
from gqa_spec.decoding.adaptive import run_widths
from gqa_spec.decoding.autoregressive import EOS
from gqa_spec.decoding.plain_steps import adaptive_fields, plain_decode
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import LoopState, SpeculativeResult, init_loop
from gqa_spec.decoding.targets import Decoder
from gqa_spec.decoding.tree_policy import AdaptiveTree
from gqa_spec.decoding.tree_speculative import tree_step
from gqa_spec.errors import UserError

PyTree = Any
FIELDS = ('tree_nodes_histogram', 'tree_nodes_trace', 'tree_width_trace')  # `adaptive_fields`


@flax.struct.dataclass
class TreeLoopState:
  loop: LoopState
  want: jax.Array  # [b] int32 the node count each row asks for next
  gain: jax.Array  # [b, K] float32 running tokens added by the nodes ranked in [u_{j-1}, u_j)
  weight: jax.Array  # [b, K] float32 the discounted calls behind each gain


def decode(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
           rng: jax.Array, *, adaptive: AdaptiveTree, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None) -> SpeculativeResult:
  """Tree speculative decoding with per-row adaptive node counts (arguments as
  `tree_speculative.decode`, `adaptive` in place of `shape`; the target's cache has
  `targets.cache_length(max_decode_len, adaptive.call_tokens)` slots; `draft_state` may be None
  where `adaptive.speculates` is False, the call then being greedy decoding).

  Returns:
    `SpeculativeResult` as `tree_speculative.decode`'s (`proposed` counts the valid nodes each
    call verified), plus `tree_nodes_histogram` `[b, N_max + 1]`, `tree_nodes_trace`
    `[b, max_decode_len]` and `tree_width_trace` `[max_decode_len]` (`speculative.py`).
  """
  if config.lenience != 1.0:
    raise UserError('lenience < 1 is not supported with token trees')
  if adaptive.speculates:
    return _speculative(target, target_state, draft, draft_state, rng, adaptive=adaptive,
                        max_decode_len=max_decode_len, config=config, eos_id=eos_id, skip=skip)
  return plain_decode(target, target_state, rng, depth=adaptive.shape.depth,
                      size=adaptive.nodes_max + 1, fields=FIELDS, max_decode_len=max_decode_len,
                      config=config, eos_id=eos_id, skip=skip).replace(
                          draft_calls=np.zeros((), np.int32))


@functools.partial(xla_options.jit, static_argnames=('target', 'draft', 'adaptive',
                                                     'max_decode_len', 'config', 'eos_id'))
def _speculative(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
                 rng: jax.Array, *, adaptive: AdaptiveTree, max_decode_len: int,
                 config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
                 skip: Optional[jax.Array] = None,
                 first_nodes: Optional[jax.Array] = None,
                 held: Optional[jax.Array] = None) -> SpeculativeResult:
  """`decode` where some row asks for a tree. For the calibration, as `adaptive._speculative`:
  `first_nodes [b]` (traced) replaces the first node counts, and where `held []` is True every
  row keeps it (the policy's choice made, not taken)."""
  shape = adaptive.shape
  depth, nmax, widths = shape.depth, adaptive.nodes_max, adaptive.widths
  loop = init_loop(target, target_state, draft_state, rng, max_decode_len, depth, skip)
  batch = loop.done.shape[0]
  loop = loop.replace(result=loop.result.replace(
      **adaptive_fields(batch, nmax + 1, max_decode_len, *FIELDS)))
  want = (jnp.full((batch,), adaptive.first_nodes(), jnp.int32) if first_nodes is None
          else jnp.asarray(first_nodes, jnp.int32))  # [b]
  init = TreeLoopState(loop=loop, want=want,
                       gain=jnp.broadcast_to(jnp.diff(adaptive.prior(), prepend=0.0),
                                             (batch, len(widths))),
                       weight=jnp.full((batch, len(widths)), 1.0 / (1.0 - adaptive.decay)))
  width_array = jnp.asarray(widths, jnp.int32)  # [K]

  def body(a: TreeLoopState, width: int) -> TreeLoopState:
    r = a.loop.result
    active = ~a.loop.done  # [b]
    want = jnp.where(active, a.want, 0)  # [b]
    s, path, _ = tree_step(target, draft, a.loop, shape, config, max_decode_len, eos_id, width)
    # What a top-u tree would have accepted, for every compiled u <= this call's width.
    below = (path[:, None, :] >= 0) & (path[:, None, :] < width_array[None, :, None])  # [b, K, D]
    count = jnp.sum(below, axis=2).astype(jnp.float32)  # [b, K]
    observed = active[:, None] & (width_array[None] <= width)  # [b, K]
    added = jnp.diff(count, axis=1, prepend=0.0)  # [b, K] tokens each band of ranks added
    gain, weight = adaptive.observe(a.gain, a.weight, added, observed, active)  # [b, K] each
    act, rows = active.astype(jnp.int32), jnp.arange(batch)
    s = s.replace(result=s.result.replace(
        tree_nodes_histogram=r.tree_nodes_histogram.at[rows, want].add(act),
        tree_nodes_trace=r.tree_nodes_trace.at[
            rows, jnp.where(active, r.target_calls, max_decode_len)].set(want, mode='drop'),
        tree_width_trace=r.tree_width_trace.at[r.loop_iterations].set(width, mode='drop')))
    if adaptive.fixed_nodes is None:
      want = jnp.where(active, adaptive.choose(adaptive.accepted(gain, weight)), a.want)  # [b]
    else:  # every row keeps its first count
      want = a.want
    if held is not None:  # the choice made, then not taken (the calibration's timing)
      want = jnp.where(held, a.want, want)
    return TreeLoopState(loop=s, want=want, gain=gain, weight=weight)

  return run_widths(target, init, widths, body, max_decode_len, config, eos_id, *FIELDS)
