"""The adaptive loops' compiled programs do not copy the self-attention cache every iteration, and
the plain path (no row speculates) compiles greedy decoding's own loop.

`adaptive.decode` and `adaptive_tree.decode` verify at several compiled widths. Inside a
`lax.switch` over them (their form until 2026-11-29), a branch that writes the cache made XLA give
the branch its own copy of it on every entry: at T5.1.1-XXL, batch 8 and 512 slots in bf16 that
cache is ~1.6 GB. They now run one while loop per width, each writing in place, so the cache is
copied only where the program starts (its inputs are not donated), as in `speculative.decode`.
Read from the compiled HLO: every `copy` whose shape is a self-attention K or V cache, once a call
and in one iteration of each loop (`tests/decoding/hlo_loops.py`).
"""

import jax
import jax.numpy as jnp

from tests.decoding import hlo_loops
from gqa_spec.decoding import adaptive, adaptive_tree, autoregressive, speculative
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.adaptive_tree import AdaptiveTree
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft
from gqa_spec.decoding.targets import T5Decoder
from tests.decoding.conftest import INPUTS, MAX_LEN, model_and_params


def _kv_shapes(state) -> set:
  """HLO shape strings of the self-attention K and V caches in `state`."""
  return {f'f32[{",".join(map(str, leaf.shape))}]'
          for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
          if 'self_attention' in (key := jax.tree_util.keystr(path)) and 'cached_' in key}


def _copies(fn, target_state, draft_state) -> dict:
  """Copies of the target's self-attention K and V caches in `fn(target_state, draft_state)`
  compiled (`tests/decoding/hlo_loops.py`): 'entry', made once a call, and 'loops', one iteration of
  each while loop's (a conditional's branch with the most). The draft's caches have other shapes
  (a copy of them would count otherwise)."""
  shapes = _kv_shapes(target_state)
  assert len(shapes) == 2 and not shapes & _kv_shapes(draft_state), shapes
  text = jax.jit(fn).lower(target_state, draft_state).compile().as_text()
  return {'entry': hlo_loops.entry_copies(text, shapes),
          'loops': [loop['cache_copies'] for loop in hlo_loops.loops(text, shapes)]}


def test_the_chain_loop_copies_the_cache_only_at_its_entry():
  model, params = model_and_params(2)
  target, enc, rng = T5Decoder(model), jnp.asarray(INPUTS), jax.random.PRNGKey(0)
  ad = AdaptiveGamma(gamma_max=8, policy='fixed', gamma_init=2)
  assert len(ad.verify_widths) == 6
  state = target.init(params, enc, adaptive.target_cache_length(MAX_LEN, ad) + 3)
  draft = ModelDraft.t5(model)
  dstate = draft.init(params, enc, MAX_LEN, 8)
  scored = _copies(lambda t, d: adaptive.decode(target, t, draft, d, rng, adaptive=ad,
                                                max_decode_len=MAX_LEN), state, dstate)
  assert len(scored['loops']) >= len(ad.verify_widths), scored  # a loop per width, parsed
  assert not any(scored['loops']), scored
  plain = _copies(lambda t, d: speculative.decode(target, t, draft, d, rng, gamma=2,
                                                  max_decode_len=MAX_LEN), state, dstate)
  assert scored['entry'] == plain['entry'] and not any(plain['loops']), (scored, plain)
  # The form this guards against, which the reader sees: verification in a `lax.switch` over two
  # widths inside the loop, each branch writing; every iteration copies each layer's K and V.
  tokens = jnp.ones((len(INPUTS), 3), jnp.int32)

  def switched(t, d):
    del d
    def body(c):
      i, ts = c
      write = lambda w: lambda ts: target.tokens_to_logits(ts, tokens[:, :w])[1]
      ts = jax.lax.switch(i % 2, [write(2), write(3)], ts)
      return i + 1, target.rollback(ts, target.index(t))
    return jax.lax.while_loop(lambda c: c[0] < 4, body, (0, t))[1]
  assert max(_copies(switched, state, dstate)['loops']) >= 4


def test_the_tree_loop_copies_the_cache_only_at_its_entry():
  model, params = model_and_params(2)
  target, enc = T5Decoder(model), jnp.asarray(INPUTS)
  ad = AdaptiveTree.parse('best:auto:8,depth:3,width:2', cost_ratio=0.1)
  assert len(ad.widths) > 1
  state = target.init(params, enc, adaptive_tree.target_cache_length(MAX_LEN, ad) + 3)
  draft = TreeModelDraft.t5(model)
  dstate = draft.init(params, enc, MAX_LEN, ad.shape)
  found = _copies(lambda t, d: adaptive_tree.decode(
      target, t, draft, d, jax.random.PRNGKey(0), adaptive=ad, max_decode_len=MAX_LEN),
                  state, dstate)
  assert len(found['loops']) >= len(ad.widths) and not any(found['loops']), found


def _loop_bodies(compiled_text: str) -> list:
  """Each decoding loop of a compiled module as `hlo_loops.loops` reads it (the
  kernels of its body by opcode, its cache copies), names aside."""
  return [{k: v for k, v in loop.items() if k != 'body'}
          for loop in hlo_loops.loops(compiled_text)]


def test_the_plain_path_runs_greedy_decodings_loop():
  """Where the policy does not speculate, `adaptive.decode` is greedy decoding's loop: the same
  while bodies, instruction for instruction (the length statistics come after the loop)."""
  model, params = model_and_params(2)
  target, enc, rng = T5Decoder(model), jnp.asarray(INPUTS), jax.random.PRNGKey(0)
  never = AdaptiveGamma(gamma_max=8, cost_ratio=5.0, verify_ratio=(5.0,) * 8, alpha_init=0.1)
  assert not never.speculates
  state = target.init(params, enc, adaptive.target_cache_length(MAX_LEN, never))
  compiled = lambda fn: _loop_bodies(jax.jit(fn).lower(state).compile().as_text())
  greedy = compiled(lambda t: autoregressive.decode(target, t, rng, max_decode_len=MAX_LEN))
  plain = compiled(lambda t: adaptive.decode(target, t, None, None, rng, adaptive=never,
                                             max_decode_len=MAX_LEN))
  assert max(loop['kernels'] for loop in greedy) > 50, greedy  # the decoding loop, parsed
  assert plain == greedy
  # the comparison can fail: a loop that speculates is another program
  fixed = AdaptiveGamma(gamma_max=8, policy='fixed', gamma_init=2)
  draft = ModelDraft.t5(model)
  dstate = draft.init(params, enc, MAX_LEN, 8)
  wide = target.init(params, enc, adaptive.target_cache_length(MAX_LEN, fixed))
  other = _loop_bodies(jax.jit(lambda t, d: adaptive.decode(
      target, t, draft, d, rng, adaptive=fixed, max_decode_len=MAX_LEN)).lower(
          wide, dstate).compile().as_text())
  assert other != greedy
