"""Speculative decoding (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2) as one jitted loop.

One `lax.while_loop` holds the target's and the draft's states. Each iteration (`chain_step`) the
draft proposes gamma tokens with their adjusted q, the target scores [s_n, x_1..x_gamma] in one
call, `sampling.verify` accepts k tokens and draws t, and each row appends x_1..x_k, t at its own
offset, both states rolling back by index. A row is done at EOS or `max_decode_len`; done rows
are still computed but rolled back. Statistics count active rows only; alpha (Corollary 6) is the
mean beta over the positions each iteration tried.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding import sampling
from gqa_spec.decoding.autoregressive import DECODER_START, EOS, PAD, finish
from gqa_spec.decoding.drafts.base import Draft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import Decoder
from gqa_spec.decoding import xla_options

PyTree = Any


@flax.struct.dataclass
class SpeculativeResult:
  """Sequences as in `autoregressive.DecodeResult`, plus acceptance statistics.

  Attributes:
    sequences: `[b, 2 + max_decode_len + gamma]`, slot 0 the start token; PAD after the length.
    lengths: `[b]` generated tokens (an EOS included).
    target_calls: `[b]` verification calls while the row was active.
    proposed: `[b]` draft tokens proposed to the row (gamma per call).
    accepted: `[b]` draft tokens accepted (before truncation at EOS / max length).
    accepted_per_position: `[gamma]` how often draft position i was accepted (pooled).
    accept_histogram: `[gamma + 1]` how often k = 0..gamma tokens were accepted.
    beta_sum, beta_count: `[]` sum and number of tried positions' beta (alpha = sum / count).
    loop_iterations: `[]`.
    draft_calls: `[]` decode calls of a draft that counts them (staged and tree model drafts).
    gamma_histogram, gamma_trace, draft_steps: `adaptive.decode` only.
    tree_nodes_histogram `[b, N_max + 1]`, tree_nodes_trace `[b, max_decode_len]` (each row's
      choice per call), tree_width_trace `[max_decode_len]` (the nodes each iteration verified):
      `adaptive_tree.decode` only; -1 past the last call.
  """

  sequences: jax.Array
  lengths: jax.Array
  target_calls: jax.Array
  proposed: jax.Array
  accepted: jax.Array
  accepted_per_position: jax.Array
  accept_histogram: jax.Array
  beta_sum: jax.Array
  beta_count: jax.Array
  loop_iterations: jax.Array
  draft_calls: Optional[jax.Array] = None
  gamma_histogram: Optional[jax.Array] = None
  gamma_trace: Optional[jax.Array] = None
  draft_steps: Optional[jax.Array] = None
  tree_nodes_histogram: Optional[jax.Array] = None
  tree_nodes_trace: Optional[jax.Array] = None
  tree_width_trace: Optional[jax.Array] = None


@flax.struct.dataclass
class LoopState:
  """The while_loop state of the chain and tree loops."""
  target_state: PyTree
  draft_state: PyTree
  done: jax.Array  # [b] bool
  result: SpeculativeResult
  rng: jax.Array


def init_loop(target: Decoder, target_state: PyTree, draft_state: PyTree, rng: jax.Array,
              max_decode_len: int, depth: int, skip: Optional[Any]) -> LoopState:
  """The loop's first state: empty sequences and zeroed statistics; `depth` (gamma, or a tree's
  depth) is the most draft tokens one call can accept, hence `2 + max_decode_len + depth` slots."""
  batch = target.index(target_state).shape[0]
  width = 2 + max_decode_len + depth
  zeros_b = jnp.zeros((batch,), jnp.int32)
  result = SpeculativeResult(
      sequences=jnp.full((batch, width), PAD, jnp.int32).at[:, 0].set(DECODER_START),
      lengths=zeros_b, target_calls=zeros_b, proposed=zeros_b, accepted=zeros_b,
      accepted_per_position=jnp.zeros((depth,), jnp.int32),
      accept_histogram=jnp.zeros((depth + 1,), jnp.int32),
      beta_sum=jnp.zeros((), jnp.float32), beta_count=jnp.zeros((), jnp.float32),
      loop_iterations=jnp.zeros((), jnp.int32))
  return LoopState(target_state=target_state, draft_state=draft_state,
                   done=jnp.zeros((batch,), bool) if skip is None else jnp.asarray(skip, bool),
                   result=result, rng=rng)


def record_call(r: SpeculativeResult, sequences: jax.Array, lengths: jax.Array,
                active: jax.Array, proposed: Any, k: jax.Array, acc: jax.Array, tried: jax.Array,
                beta: jax.Array, gamma_max: int) -> SpeculativeResult:
  """`r` after one verification call: new `sequences` / `lengths`, and the statistics of the
  `active [b]` rows that proposed `proposed` tokens and accepted `k [b]` (`acc [b, gamma_max]`),
  with `beta [b, gamma_max]` at the `tried` positions."""
  act = active.astype(jnp.int32)  # [b]
  return r.replace(
      sequences=sequences, lengths=lengths, target_calls=r.target_calls + act,
      proposed=r.proposed + proposed * act, accepted=r.accepted + k * act,
      accepted_per_position=r.accepted_per_position + jnp.sum(acc, axis=0, dtype=jnp.int32),
      accept_histogram=r.accept_histogram + jnp.sum(
          jax.nn.one_hot(k, gamma_max + 1, dtype=jnp.int32) * act[:, None], axis=0),
      beta_sum=r.beta_sum + jnp.sum(jnp.where(tried, beta, 0.0)),
      beta_count=r.beta_count + jnp.sum(tried),
      loop_iterations=r.loop_iterations + 1)


def append_accepted(r: SpeculativeResult, new: jax.Array, k: jax.Array, active: jax.Array,
                    max_decode_len: int, eos_id: int) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Writes each `active [b]` row's `new [b, depth + 1]` tokens (its k [b] accepted ones, the
  target's token, junk) after its prefix, through its first EOS and up to max_decode_len.
  Returns (`[b, width]` sequences, `[b]` new lengths, `[b]` whether the row ended with EOS)."""
  positions = jnp.arange(new.shape[1])  # [depth + 1]
  keep = k + 1  # [b]
  is_eos = (new == eos_id) & (positions[None] < keep[:, None])  # [b, depth + 1]
  hit_eos = jnp.any(is_eos, axis=1)  # [b]
  keep = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, keep)  # through the first EOS
  keep = jnp.minimum(keep, max_decode_len - r.lengths)
  keep = jnp.where(active, keep, 0)  # [b]
  sequences = jax.vmap(lambda row, upd, i: jax.lax.dynamic_update_slice(row, upd, (i,)))(
      r.sequences, new, r.lengths + 1)  # [b, width]
  return sequences, r.lengths + keep, active & hit_eos & (keep > 0)


@functools.partial(xla_options.jit, static_argnames=('target', 'draft', 'gamma', 'max_decode_len',
                                             'config', 'eos_id'))
def decode(target: Decoder, target_state: PyTree, draft: Draft, draft_state: PyTree,
           rng: jax.Array, *, gamma: int, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None) -> SpeculativeResult:
  """Speculative decoding of a batch.

  Args:
    target: static target decoder binding.
    target_state: its state, index 0 per row, >= `targets.cache_length(max_decode_len, gamma + 1)` slots.
    draft: static draft (see `drafts.base.Draft`).
    draft_state: the draft's initial state.
    rng: PRNG key.
    gamma: draft tokens per iteration (>= 1).
    max_decode_len: most generated tokens per row (EOS included).
    config: sampling method and lenience, applied to p and q alike.
    eos_id: end-of-sequence token.
    skip: optional `[b]` bools: rows that start done (batch padding); they generate nothing and
      are left out of every statistic.

  Returns:
    `SpeculativeResult`.
  """
  if gamma < 1:
    raise ValueError(f'gamma must be >= 1, got {gamma}')
  init = init_loop(target, target_state, draft_state, rng, max_decode_len, gamma, skip)
  body = lambda s: chain_step(target, draft, s, gamma, config, max_decode_len, eos_id)[0]
  return with_draft_calls(jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, init))


class ChainStep(NamedTuple):
  """What one `chain_step` saw, for a loop's own statistics: `k [b]` draft tokens accepted,
  `limit [b]` (or None) each row's verified proposal length, `beta`/`tried [b, depth]` and
  `steps []` the draft's decode calls."""
  k: jax.Array
  limit: Optional[jax.Array]
  beta: jax.Array
  tried: jax.Array
  steps: jax.Array


def chain_step(target: Decoder, draft: Draft, s: LoopState, width: int, config: SamplingConfig,
               max_decode_len: int, eos_id: int, depth: Optional[int] = None,
               want: Optional[jax.Array] = None, confidence: float = 0.0
               ) -> Tuple[LoopState, ChainStep]:
  """One iteration of the chain loop, proposing `width` tokens (static).

  `want [b]` (optional, each <= width): row r proposes and verifies only its first want[r] tokens
  (`ModelDraft.propose_upto`, which may stop a proposal early at draft probability `confidence`).
  The statistics are `depth` (default width) positions wide, shared by loops of several widths."""
  depth = width if depth is None else depth
  r = s.result
  rng, draft_rng, verify_rng = jax.random.split(s.rng, 3)
  active = ~s.done  # [b]
  upto = None if want is None else getattr(draft, 'propose_upto', None)
  if upto is not None:
    tokens, q, limit, steps, dstate = upto(s.draft_state, r.sequences, r.lengths, draft_rng,
                                           width, config, want, confidence)  # [b, width], ...
  else:
    tokens, q, dstate = draft.propose(s.draft_state, r.sequences, r.lengths, draft_rng, width,
                                      config)  # [b, width], [b, width, V]
    limit, steps = want, jnp.asarray(width, jnp.int32)
  last = jnp.take_along_axis(r.sequences, r.lengths[:, None], axis=1)  # [b, 1]
  inputs = jnp.concatenate([last, tokens], axis=1)  # [b, width + 1]
  if getattr(draft, 'reads_target_hidden', False):  # Chimera: hidden states of this same call
    logits, hidden, tstate = target.tokens_to_logits_and_hidden(s.target_state, inputs)
    dstate = draft.observe(dstate, hidden, r.lengths)  # [b, width + 1, D] at positions n..
  else:
    logits, tstate = target.tokens_to_logits(s.target_state, inputs)  # [b, width + 1, V]
  k, t, beta = sampling.verify(verify_rng, tokens, q, logits, config, limit)  # [b], [b], [b, w]

  positions = jnp.arange(depth + 1)  # [depth + 1]
  new = jnp.concatenate([tokens, jnp.zeros_like(tokens[:, :1])], axis=1)  # [b, width + 1]
  new = jnp.where(positions[None, :width + 1] == k[:, None], t[:, None], new)  # x_1..x_k, t, junk
  if depth > width:
    new = jnp.pad(new, ((0, 0), (0, depth - width)))  # [b, depth + 1]
    beta = jnp.pad(beta, ((0, 0), (0, depth - width)))  # [b, depth]
  sequences, lengths, ended = append_accepted(r, new, k, active, max_decode_len, eos_id)
  tstate = target.rollback(tstate, lengths)
  dstate = draft.commit(dstate, sequences, lengths)
  done = s.done | ended | (lengths >= max_decode_len)

  tried = (positions[None, :depth] <= k[:, None]) & active[:, None]  # [b, depth]
  if limit is not None:
    tried &= positions[None, :depth] < limit[:, None]
  acc = (positions[None, :depth] < k[:, None]) & active[:, None]  # [b, depth]
  result = record_call(r, sequences, lengths, active, width if limit is None else limit, k, acc,
                       tried, beta, depth)
  loop = LoopState(target_state=tstate, draft_state=dstate, done=done, result=result, rng=rng)
  return loop, ChainStep(k, limit, beta, tried, steps)


def with_draft_calls(final: LoopState) -> SpeculativeResult:
  """The loop's result, sequences PAD-ed, with the draft's call count where it keeps one."""
  r = final.result
  return r.replace(sequences=finish(r.sequences, r.lengths),
                   draft_calls=getattr(final.draft_state, 'draft_calls', None))


def summarize(results: Union[Any, Sequence[Tuple[Any, Optional[int]]]]) -> Dict[str, Any]:
  """Host-side statistics (JSON-ready) of one decoding call's result, or pooled over a run's
  `[(result, real rows)]` batches, the dummy rows after the real ones left out: tokens, target
  calls and loop iterations; for a `SpeculativeResult` also acceptance, alpha and the draft's
  calls, and an adaptive run's draft lengths (`adaptive.decode`) or node counts
  (`adaptive_tree.decode`) per row and call."""
  if not isinstance(results, (list, tuple)):
    results = [(results, None)]
  results = [(jax.device_get(r), n) for r, n in results]
  rows = lambda name: np.concatenate([np.asarray(getattr(r, name))[:n] for r, n in results])
  total = lambda name: sum(np.asarray(getattr(r, name)) for r, _ in results)
  tokens, calls = int(rows('lengths').sum()), int(rows('target_calls').sum())
  iterations = int(total('loop_iterations'))
  out = {'tokens': tokens, 'target_calls': calls, 'loop_iterations': iterations,
         'mean_tokens_per_call': tokens / calls if calls else 0.0}
  first = results[0][0]
  if not isinstance(first, SpeculativeResult):
    return out
  proposed, accepted = rows('proposed'), rows('accepted')  # [rows]
  beta_count = float(total('beta_count'))
  draft_calls = [int(r.draft_calls) for r, _ in results if r.draft_calls is not None]
  out.update(
      proposed=int(proposed.sum()), accepted=int(accepted.sum()),
      acceptance_rate=float(accepted.sum() / proposed.sum()) if proposed.sum() else None,
      acceptance_rate_per_row=[float(a / p) if p else None for a, p in zip(accepted, proposed)],
      accepted_per_position=[int(x) for x in total('accepted_per_position')],
      accept_histogram=[int(x) for x in total('accept_histogram')],
      alpha=float(total('beta_sum')) / beta_count if beta_count else None,
      draft_calls=sum(draft_calls) if draft_calls else None)
  if first.gamma_histogram is not None:
    histogram = rows('gamma_histogram')  # [rows, gamma_max + 1]
    steps = int(total('draft_steps'))
    out.update(gamma_histogram=[int(x) for x in histogram.sum(axis=0)],
               gamma_histogram_per_row=histogram.tolist(),
               gamma_per_call_per_row=[[int(g) for g in row if g >= 0]
                                       for row in rows('gamma_trace')],
               draft_steps=steps,  # saved: against gamma_max every loop iteration
               draft_steps_saved=(histogram.shape[1] - 1) * iterations - steps)
  if first.tree_nodes_histogram is not None:
    histogram = rows('tree_nodes_histogram')  # [rows, N_max + 1]
    # A row's call i is its batch's loop iteration i, which verified that iteration's width.
    verified = [[int(w) for w in np.asarray(r.tree_width_trace)[:c]]
                for r, n in results for c in np.asarray(r.target_calls)[:n]]
    out.update(tree_nodes_histogram=[int(x) for x in histogram.sum(axis=0)],
               tree_nodes_histogram_per_row=histogram.tolist(),
               tree_nodes_per_call_per_row=[[int(x) for x in row if x >= 0]
                                            for row in rows('tree_nodes_trace')],
               tree_nodes_verified_histogram_per_row=[
                   np.bincount(np.asarray(v, int), minlength=histogram.shape[1]).tolist()
                   for v in verified],
               tree_nodes_verified_per_call_per_row=verified)
  return out
