"""Tree speculative decoding (Spector & Re 2023; Sequoia's verification) as one jitted loop.

The loop of `speculative.py` with a token tree in place of the chain. Each iteration the draft
grows a tree under each row's last token (`tree.grow`), the target scores root and nodes in one
call (positions by depth, the ancestors-and-self mask), `tree.verify` accepts a path and a next
token, the target's cache moves the path's slots into place (`move_slots`) and rolls back, and
the draft commits the path (`TreeDraft`). `topk:1,...,1` is chain speculation.

Statistics reuse `SpeculativeResult`: `proposed` counts valid nodes, `accepted_per_position` is
per depth, `accept_histogram` counts path lengths 0..D, and the alpha fields stay 0.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Protocol, Tuple

import jax
import jax.numpy as jnp

from gqa_spec.decoding import sampling, tree as tree_lib
from gqa_spec.decoding.autoregressive import EOS
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import (LoopState, SpeculativeResult, append_accepted, init_loop,
                                           record_call, with_draft_calls)
from gqa_spec.decoding.targets import Decoder
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.decoding import xla_options

PyTree = Any


class TreeDraft(Protocol):
  """Proposes a token tree per row and commits the accepted path (`path [b, D]`: the accepted
  nodes by depth, -1 past them). Drafts with `reads_target_hidden` (Chimera) also have
  `observe(state, hidden [b, D + 1, E], start [b])`: the target's hidden states of the root and
  the path from the verification call."""

  def propose_tree(self, state: PyTree, sequences: jax.Array, lengths: jax.Array, rng: jax.Array,
                   shape: TreeShape, config: SamplingConfig) -> Tuple[tree_lib.Tree, PyTree]:
    ...

  def commit_tree(self, state: PyTree, sequences: jax.Array, lengths: jax.Array,
                  path: jax.Array) -> PyTree:
    ...


@functools.partial(xla_options.jit, static_argnames=('target', 'draft', 'shape', 'max_decode_len',
                                             'config', 'eos_id'))
def decode(target: Decoder, target_state: PyTree, draft: TreeDraft, draft_state: PyTree,
           rng: jax.Array, *, shape: TreeShape, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None) -> SpeculativeResult:
  """Tree speculative decoding of a batch: arguments as `speculative.decode`'s, with a static
  tree `shape` in place of gamma (lenience must be 1; the target needs `move_slots` and
  `targets.cache_length(max_decode_len, N + 1)` slots).
  """
  init = init_loop(target, target_state, draft_state, rng, max_decode_len, shape.depth, skip)
  body = lambda s: tree_step(target, draft, s, shape, config, max_decode_len, eos_id)[0]
  return with_draft_calls(jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, init))


def tree_step(target: Decoder, draft: TreeDraft, s: LoopState, shape: TreeShape,
              config: SamplingConfig, max_decode_len: int, eos_id: int,
              width: Optional[int] = None) -> Tuple[LoopState, jax.Array, jax.Array]:
  """One iteration of the tree loop. With `width` (static) only the first `width` nodes in rank
  order (`tree.by_rank`), the best-first tree of that budget, are verified. Returns the new state, the accepted path `[b, D]`
  (node indices in the verified order, -1 past it) and `k [b]`."""
  r = s.result
  depth, batch = shape.depth, r.lengths.shape[0]
  rng, draft_rng, verify_rng = jax.random.split(s.rng, 3)
  active = ~s.done  # [b]
  nodes, dstate = draft.propose_tree(s.draft_state, r.sequences, r.lengths, draft_rng, shape,
                                     config)  # [b, N] nodes
  order = None
  if width is not None:  # order: rank -> the draft's node index
    ranked, order = tree_lib.by_rank(nodes)
    nodes = tree_lib.first_nodes(ranked, width)  # [b, width]
  last = jnp.take_along_axis(r.sequences, r.lengths[:, None], axis=1)  # [b, 1]
  tokens = jnp.concatenate([last, nodes.tokens], axis=1)  # [b, N + 1]
  tree_positions = r.lengths[:, None] + jnp.concatenate(
      [jnp.zeros((batch, 1), jnp.int32), nodes.depths], axis=1)  # [b, N + 1]
  mask = tree_lib.attention_mask(nodes.parents, depth)  # [b, N + 1, N + 1]
  reads_hidden = getattr(draft, 'reads_target_hidden', False)
  if reads_hidden:  # Chimera: the hidden states of this same call
    logits, hidden, tstate = target.tokens_to_logits_and_hidden(
        s.target_state, tokens, tree_positions, mask)  # [b, N + 1, V], [b, N + 1, E]
  else:
    logits, tstate = target.tokens_to_logits(s.target_state, tokens, tree_positions,
                                             mask)  # [b, N + 1, V]
  path, k, t = tree_lib.verify(verify_rng, nodes, logits, depth, config)  # [b, D], [b], [b]
  if reads_hidden:  # the root's and the path's hidden states, at positions n, n + 1, ...
    rows = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), path + 1],
                           axis=1)  # [b, D + 1]; -1 past the path -> the root's (junk slots)
    dstate = draft.observe(dstate, jnp.take_along_axis(hidden, rows[..., None], axis=1),
                           r.lengths)

  sequences, lengths, ended, tstate = accept_path(target, tstate, r, nodes.tokens, path, k, t,
                                                  active, max_decode_len, eos_id)
  draft_path = path if order is None else jnp.where(
      path >= 0, jnp.take_along_axis(order, jnp.maximum(path, 0), axis=1), -1)  # [b, D]
  dstate = draft.commit_tree(dstate, sequences, lengths, draft_path)
  done = s.done | ended | (lengths >= max_decode_len)

  acc = (jnp.arange(depth)[None] < k[:, None]) & active[:, None]  # [b, D]
  untried = jnp.zeros_like(acc)  # alpha is a chain quantity
  result = record_call(r, sequences, lengths, active,
                       jnp.sum(nodes.valid, axis=1, dtype=jnp.int32), k, acc, untried,
                       untried.astype(jnp.float32), depth)
  loop = LoopState(target_state=tstate, draft_state=dstate, done=done, result=result, rng=rng)
  return loop, path, k


def accept_path(target: Decoder, tstate: PyTree, r: SpeculativeResult, tokens: jax.Array,
                path: jax.Array, k: jax.Array, t: jax.Array, active: jax.Array,
                max_decode_len: int, eos_id: int):
  """Appends each row's accepted path (`path [b, D]` node indices into `tokens [b, N]`, -1 past
  its `k [b]` nodes) and the target's token `t [b]`, moves the path's cache slots (n + 1 + node)
  to n + 1, ... and rolls the cache back to the new length. Returns (sequences, lengths, ended,
  target state)."""
  depth = path.shape[1]
  positions = jnp.arange(depth + 1)  # [D + 1]
  path_tokens = jnp.take_along_axis(tokens, jnp.maximum(path, 0), axis=1)  # [b, D]
  new = jnp.concatenate([path_tokens, jnp.zeros_like(t[:, None])], axis=1)  # [b, D + 1]
  new = jnp.where(positions[None] == k[:, None], t[:, None], new)  # path, t, junk
  sequences, lengths, ended = append_accepted(r, new, k, active, max_decode_len, eos_id)
  dest = r.lengths[:, None] + 1 + positions[None, :depth]  # [b, D]
  source = jnp.where(path >= 0, r.lengths[:, None] + 1 + path, dest)  # [b, D]
  tstate = target.rollback(target.move_slots(tstate, r.lengths + 1, source), lengths)
  return sequences, lengths, ended, tstate
