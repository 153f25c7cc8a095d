"""Token trees that size themselves per row (`generate --tree best:auto[:N],depth:D[,width:W]`).

The tree loop of `tree_speculative.py` with best-first trees (EAGLE-2's) whose node count follows
each row's running acceptance, inside the jitted loop, shapes static:

  1. the draft grows the largest tree, N_max nodes (`tree.grow`, D draft calls, as always);
  2. its nodes are put in rank order, best path score first (`tree.by_rank`). A child scores at
     most its parent and ties go to the lower candidate index, so the first n nodes are a tree of
     their own, exactly the best-first tree of budget n (same candidates, q and draws): for every
     n the top-n tree is "the first n nodes";
  3. each active row r asks for N_r nodes (`AdaptiveTree.choose`, below; 0 = no tree). The target
     verifies the first w nodes of every row in ONE call, w the narrowest compiled width
     (`tree_policy.node_widths`: 1, 2, 4, 8, ..., N_max) that holds max_r N_r: each width has its
     own while loop (the target call and `tree.verify` at that width), run while the batch's asks
     need it (`adaptive.loops_per_width`), so a batch asking for small trees pays for a small call
     (and a small verification scan);
  4. acceptance, cache compaction and the draft's commit as in `tree_speculative.py` (the path
     mapped back to the draft's node order for `commit_tree`).

Every row verifies all w nodes of the call, not only its own N_r: the extra nodes cost nothing in
that call (the draft grew them anyway, the target scores w tokens for every row), and they can
only add accepted tokens. Once no active row asks for a tree, the rest runs as plain one-token
target steps without the draft (`plain_steps.plain_loop`), as `--gamma auto` does at gamma 0.

Exactness: w depends only on the batch's past, never on the current iteration's draws, so it is a
stopping rule, and the top-w tree is a best-first tree of budget w, verified by the lossless
multi-candidate rule (`tree.py`): greedy output is token-identical to greedy decoding and sampled
output has the target's distribution whatever sizes were used.

The choice of each row's N_r (policy 'optimal': the lasting prior, the bands' running gains, the
batch's pricing) is `tree_policy.py`'s.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import sampling, tree as tree_lib, tree_speculative, xla_options
from gqa_spec.decoding.adaptive import Calibration, loops_per_width
from gqa_spec.decoding.calibration import first_stage, time_widths
from gqa_spec.decoding.autoregressive import EOS
from gqa_spec.decoding.plain_steps import plain_decode, plain_loop
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.speculative import (LoopState, SpeculativeResult, init_loop,
                                           with_draft_calls)
from gqa_spec.decoding.targets import Decoder
from gqa_spec.decoding.tree_policy import AdaptiveTree, TreeCalibration
from gqa_spec.errors import UserError
from gqa_spec.partitioning import to_host

PyTree = Any


@flax.struct.dataclass
class TreeLoopState:
  loop: LoopState
  want: jax.Array  # [b] int32 the node count each row asks for next
  gain: jax.Array  # [b, K] float32 running tokens added by the nodes ranked in [u_{j-1}, u_j)
  weight: jax.Array  # [b, K] float32 the discounted calls behind each gain


def measure_costs(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
                  max_decode_len: int, adaptive: AdaptiveTree,
                  more: Iterable[Tuple[PyTree, PyTree]] = (),
                  config: SamplingConfig = sampling.GREEDY) -> TreeCalibration:
  """(c, v, alpha) on this machine and batch, for decoding at `config`, in units of one step of
  autoregressive decoding at `config`, as `calibration.measure_costs` gives them for chains, in
  the same two stages (seconds, compiles included; each time the fastest of a few runs):

    c = one of the D draft calls that grow an N_max tree (`propose_tree` and a `commit_tree` of
        nothing accepted);
    v = (v(u) for each compiled width u): an iteration of this loop with every row verifying u
        nodes, timed whole at `config` (the policy's own loop `held` at u: its choice made every
        iteration, not taken; the first node counts a traced argument of `_speculative`: one
        compiled loop for every width), per iteration (at least that of every
        narrower width), less its tree's D draft calls; the widths and the unit again timed in
        interleaved rounds (`timing.interleaved_per_iteration`), v over that unit. It holds the
        target call at width u (the tree mask), ranking, verification at `config`, the path's
        append and compaction, statistics and the loop per width
        (`calibration.time_widths`; at T = 1 sampling makes wide verifications dearer);
    alpha = the top-ranked node's acceptance, every row's starting per-token estimate
        (`calibrated`): in the first stage at temperature 0, its token against greedy decoding's
        at every position of greedy decoding's output on this batch, the draft fed the true prefix
        (`timing.teacher_forced`, the same pass that times c); where the second stage runs, the
        acceptance in its 1-node run of this loop at `config` (as for `--gamma auto`); both over
        at least `calibration.CALIBRATION_POSITIONS` positions, reading batches of `more` where
        this one holds fewer (as `calibration.measure_costs`);
    accepted = where the second stage runs, the draft tokens this loop accepted per call with
        every row verifying u nodes, for each width, on the same batches as that alpha
        (`TreeCalibration.accepted`: the prior of `calibrated`, `AdaptiveTree.accepted_init`).

  First the unit (autoregressive decoding per step at `config`), c, alpha and the target's calls
  of 1 and 2 tokens. If the prior at that alpha pays for no tree even with v(u) = 1 + (the 2-token
  call - the 1-token call) in steps for every width (a lower bound: an iteration does all that a
  greedy step does besides its call, with a call at least 2 tokens wide), v is that bound and
  nothing else is compiled or timed: `decode` is greedy decoding from the start (what the optimistic
  0.9 cost before: docs/adaptive.md). Otherwise the loop at every width, as above. A draft that
  reads the target's hidden states (Chimera) grows its trees from those of the loop's own calls,
  which the teacher-forced pass does not make: the first stage does not stop it.
  """
  shape = adaptive.shape
  rng = jax.random.PRNGKey(0)
  batch = target.index(target_state).shape[0]
  nothing = jnp.full((batch, shape.depth), -1, jnp.int32)  # no path

  def top_token(dstate, seqs, at):
    tree, dstate = draft.propose_tree(dstate, seqs, at, rng, shape, sampling.GREEDY)
    return tree_lib.first_nodes(tree_lib.by_rank(tree)[0], 1).tokens[:, 0], dstate  # [b]

  first = first_stage(target, target_state, max_decode_len, top_token,
                      lambda dstate, seqs, at: draft.commit_tree(dstate, seqs, at, nothing),
                      draft_state, shape.depth + 1, more, config)
  t_step, t_tree, alpha = first.t_step, first.t_draft, first.alpha
  c = t_tree / shape.depth / t_step
  floor = (first.v_floor,) * len(adaptive.widths)
  reads_hidden = getattr(draft, 'reads_target_hidden', False)
  batch_shape = dict(lengths=first.lengths)  # what the batch waits for
  if not reads_hidden and not adaptive.calibrated(
      Calibration(c, floor, alpha, **batch_shape)).speculates:
    return TreeCalibration(c, floor, alpha, t_step, **batch_shape)
  # The policy's own loop (its choice made every iteration, not taken), at the first stage's
  # numbers: the constants differ from the run's, the program does not.
  policy = adaptive.calibrated(Calibration(c, floor, alpha, **batch_shape))
  held = np.ones((), bool)
  run = lambda u, ts=target_state, ds=draft_state: _speculative(  # one loop for every width
      target, ts, draft, ds, rng, adaptive=policy, max_decode_len=max_decode_len, config=config,
      first_nodes=np.full((batch,), u, np.int32), held=held)
  # seconds per greedy step and per iteration of this loop with every row verifying u nodes
  t_step, t_iter = time_widths(target, target_state, max_decode_len, config, run, adaptive.widths)
  # this loop's own acceptance at each width, on the first stage's batches (multi-process too):
  # the starting alpha at one node, and the prior, draft tokens accepted per call at each width
  results = {u: to_host([run(u)] + [run(u, ts, ds) for ts, ds in first.more])
             for u in adaptive.widths}
  total = lambda u, field: sum(float(np.sum(getattr(r, field))) for r in results[u])
  alpha = total(1, 'accepted') / max(total(1, 'proposed'), 1.0)
  accepted = tuple(total(u, 'accepted') / max(total(u, 'target_calls'), 1.0)
                   for u in adaptive.widths)
  return TreeCalibration(c, tuple(max(t_iter[u] / t_step - shape.depth * c, first.v_floor)
                              for u in adaptive.widths), alpha, t_step, accepted, **batch_shape)


def decode(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
           rng: jax.Array, *, adaptive: AdaptiveTree, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None) -> SpeculativeResult:
  """Tree speculative decoding with per-row adaptive node counts (arguments as
  `tree_speculative.decode`, with `adaptive` in place of `shape`; the draft is a tree draft grown
  for `adaptive.shape`, and the target's cache has `targets.cache_length(max_decode_len, adaptive.call_tokens)` slots).

  `draft_state` may be None where `adaptive.speculates` is False: the call is then greedy decoding
  of the target alone (`plain_steps.plain_decode`, as `--gamma auto` where no row speculates), with
  `sequences` `[b, 1 + max_decode_len]`.

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
  r, histogram, trace, widths = plain_decode(
      target, target_state, rng, gamma_max=adaptive.nodes_max, max_decode_len=max_decode_len,
      config=config, eos_id=eos_id, skip=skip, iteration_trace=True)
  depth, batch = adaptive.shape.depth, r.lengths.shape[0]
  zeros_b = np.zeros((batch,), np.int32)
  return SpeculativeResult(
      sequences=r.sequences, lengths=r.lengths, target_calls=r.target_calls, proposed=zeros_b,
      accepted=zeros_b, accepted_per_position=np.zeros((depth,), np.int32),
      accept_histogram=np.zeros((depth + 1,), np.int32), beta_sum=np.zeros((), np.float32),
      beta_count=np.zeros((), np.float32), loop_iterations=r.loop_iterations,
      draft_calls=np.zeros((), np.int32), tree_nodes_histogram=histogram,
      tree_nodes_trace=trace, tree_width_trace=widths)


@functools.partial(xla_options.jit, static_argnames=('target', 'draft', 'adaptive',
                                                     'max_decode_len', 'config', 'eos_id'))
def _speculative(target: Decoder, target_state: PyTree, draft: Any, draft_state: PyTree,
                 rng: jax.Array, *, adaptive: AdaptiveTree, max_decode_len: int,
                 config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
                 skip: Optional[jax.Array] = None,
                 first_nodes: Optional[jax.Array] = None,
                 held: Optional[jax.Array] = None) -> SpeculativeResult:
  """`decode` where some row asks for a tree: the loop of the module docstring. `first_nodes`
  `[b]` int32 (optional, traced): each row's first node count in place of the policy's; with
  `fixed_nodes` a row keeps it. `held` `[]` bool (optional, traced): where True a row keeps it
  too, the policy's choice made every iteration and not taken, so that the program is the one a
  run compiles (`measure_costs` times every width so, through one compiled loop; as
  `adaptive.decode`'s `held`)."""
  shape = adaptive.shape
  depth, nmax, widths = shape.depth, adaptive.nodes_max, adaptive.widths
  reads_hidden = getattr(draft, 'reads_target_hidden', False)
  loop = init_loop(target, target_state, draft_state, rng, max_decode_len, depth, skip)
  batch = loop.done.shape[0]
  loop = loop.replace(result=loop.result.replace(
      tree_nodes_histogram=jnp.zeros((batch, nmax + 1), jnp.int32),
      tree_nodes_trace=jnp.full((batch, max_decode_len), -1, jnp.int32),
      tree_width_trace=jnp.full((max_decode_len,), -1, jnp.int32)))
  want = (jnp.full((batch,), adaptive.first_nodes(), jnp.int32) if first_nodes is None
          else jnp.asarray(first_nodes, jnp.int32))  # [b]
  init = TreeLoopState(loop=loop, want=want,
                       gain=jnp.broadcast_to(jnp.diff(adaptive.prior(), prepend=0.0),
                                             (batch, len(widths))),
                       weight=jnp.full((batch, len(widths)), 1.0 / (1.0 - adaptive.decay)))
  positions = jnp.arange(depth + 1)  # [D + 1]
  width_array = jnp.asarray(widths, jnp.int32)  # [K]

  def verify(w, tstate, ranked, last, lengths, verify_rng):
    """The first w nodes (static: each width has its loop, `adaptive.loops_per_width`) verified in
    one target call: `(path [b, D], k [b], t [b], tstate, hidden [b, D + 1, E] of the root and the
    path, or a placeholder)`."""
    sub = tree_lib.first_nodes(ranked, w)  # [b, w] nodes
    tokens = jnp.concatenate([last, sub.tokens], axis=1)  # [b, w + 1]
    tree_positions = lengths[:, None] + jnp.concatenate(
        [jnp.zeros((batch, 1), jnp.int32), sub.depths], axis=1)  # [b, w + 1]
    mask = tree_lib.attention_mask(sub.parents, depth)  # [b, w + 1, w + 1]
    if reads_hidden:  # Chimera: the hidden states of this same call
      logits, hidden, tstate = target.tokens_to_logits_and_hidden(
          tstate, tokens, tree_positions, mask)  # [b, w + 1, V], [b, w + 1, E]
    else:
      logits, tstate = target.tokens_to_logits(tstate, tokens, tree_positions,
                                               mask)  # [b, w + 1, V]
    path, k, t = tree_lib.verify(verify_rng, sub, logits, depth, config)  # [b, D], [b], [b]
    if reads_hidden:  # the root's and the path's, at positions n, n + 1, ... (junk past it)
      rows = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), path + 1], axis=1)  # [b, D + 1]
      hidden = jnp.take_along_axis(hidden, rows[..., None], axis=1)  # [b, D + 1, E]
    else:
      hidden = jnp.zeros((), jnp.float32)
    return path, k, t, tstate, hidden

  def body(a: TreeLoopState, width: int) -> TreeLoopState:
    s, r = a.loop, a.loop.result
    rng, draft_rng, verify_rng = jax.random.split(s.rng, 3)
    active = ~s.done  # [b]
    want = jnp.where(active, a.want, 0)  # [b]
    tree, dstate = draft.propose_tree(s.draft_state, r.sequences, r.lengths, draft_rng, shape,
                                      config)  # [b, N_max] nodes
    ranked, order = tree_lib.by_rank(tree)  # [b, N_max] best first; order: rank -> tree index
    last = jnp.take_along_axis(r.sequences, r.lengths[:, None], axis=1)  # [b, 1]
    path, k, t, tstate, hidden = verify(width, s.target_state, ranked, last, r.lengths,
                                        verify_rng)
    if reads_hidden:
      dstate = draft.observe(dstate, hidden, r.lengths)

    sequences, lengths, ended, tstate = tree_speculative.accept_path(
        target, tstate, r, ranked.tokens, path, k, t, active, max_decode_len, eos_id)
    draft_path = jnp.where(path >= 0, jnp.take_along_axis(order, jnp.maximum(path, 0), axis=1),
                           -1)  # [b, D] in the draft's node order
    dstate = draft.commit_tree(dstate, sequences, lengths, draft_path)
    done = s.done | ended | (lengths >= max_decode_len)

    # What a top-u tree would have accepted, for every compiled u <= this call's width.
    below = (path[:, None, :] >= 0) & (path[:, None, :] < width_array[None, :, None])  # [b, K, D]
    count = jnp.sum(below, axis=2).astype(jnp.float32)  # [b, K]
    observed = active[:, None] & (width_array[None] <= width)  # [b, K]
    added = jnp.diff(count, axis=1, prepend=0.0)  # [b, K] tokens each band of ranks added
    gain, weight = adaptive.observe(a.gain, a.weight, added, observed, active)  # [b, K] each

    act = active.astype(jnp.int32)  # [b]
    rows = jnp.arange(batch)
    verified = jnp.sum(ranked.valid & (jnp.arange(nmax)[None] < width), axis=1,
                       dtype=jnp.int32)  # [b]
    acc = (positions[None, :depth] < k[:, None]) & active[:, None]  # [b, D]
    result = r.replace(
        sequences=sequences, lengths=lengths, target_calls=r.target_calls + act,
        proposed=r.proposed + verified * act, accepted=r.accepted + k * act,
        accepted_per_position=r.accepted_per_position + jnp.sum(acc, axis=0, dtype=jnp.int32),
        accept_histogram=r.accept_histogram + jnp.sum(
            jax.nn.one_hot(k, depth + 1, dtype=jnp.int32) * act[:, None], axis=0),
        loop_iterations=r.loop_iterations + 1,
        tree_nodes_histogram=r.tree_nodes_histogram.at[rows, want].add(act),
        tree_nodes_trace=r.tree_nodes_trace.at[
            rows, jnp.where(active, r.target_calls, max_decode_len)].set(want, mode='drop'),
        tree_width_trace=r.tree_width_trace.at[r.loop_iterations].set(width, mode='drop'))
    loop = LoopState(target_state=tstate, draft_state=dstate, done=done, result=result, rng=rng)
    if adaptive.fixed_nodes is None:
      want = jnp.where(active, adaptive.choose(adaptive.accepted(gain, weight)), a.want)  # [b]
    else:  # every row keeps its first count
      want = a.want
    if held is not None:  # the choice made, then not taken (the calibration's timing)
      want = jnp.where(held, a.want, want)
    return TreeLoopState(loop=loop, want=want, gain=gain, weight=weight)

  def plain_statistics(s: LoopState, before: SpeculativeResult) -> LoopState:
    """The plain steps' node count 0 in the traces and the histogram."""
    r = s.result
    calls = jnp.arange(max_decode_len)  # [max_len]
    plain = ((calls[None] >= before.target_calls[:, None])
             & (calls[None] < r.target_calls[:, None]))  # [b, max_len]
    plain_iteration = (calls >= before.loop_iterations) & (calls < r.loop_iterations)  # [max_len]
    return s.replace(result=r.replace(
        tree_nodes_trace=jnp.where(plain, 0, r.tree_nodes_trace),
        tree_nodes_histogram=r.tree_nodes_histogram.at[:, 0].add(
            r.target_calls - before.target_calls),
        tree_width_trace=jnp.where(plain_iteration, 0, r.tree_width_trace)))

  # Tree iterations while some active row asks for a tree; then plain target steps to the end.
  final = loops_per_width(
      widths, lambda a: ~jnp.all(a.loop.done) & jnp.any(~a.loop.done & (a.want > 0)),
      lambda a: jnp.max(jnp.where(a.loop.done, 0, a.want)), body, init)
  loop = plain_loop(target, final.loop, max_decode_len, config, eos_id)
  return with_draft_calls(plain_statistics(loop, final.loop.result))
