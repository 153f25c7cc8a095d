"""A performance guard read from the compiled program: the adaptive loops do not copy the
self-attention cache inside their loops' bodies (they write it in place, as `speculative.decode`
does), where a whole-cache copy every iteration would cost a read and a write of every layer's K
and V. Positive control: a `lax.switch` over two widths whose branches write the cache, the form
`adaptive.loops_per_width` avoids, copies it in the loop's body.
"""

import re

import jax
import jax.numpy as jnp

from gqa_spec.decoding import adaptive, adaptive_tree, speculative
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.adaptive_tree import AdaptiveTree
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length
from tests.decoding.conftest import INPUTS, MAX_LEN, model_and_params

_HEADER = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\b.*\{\s*$')
_CALLEES = re.compile(r'\b(?:calls|to_apply|body|condition|branch_computations|true_computation|'
                      r'false_computation)=(\{[^}]*\}|%?[\w.\-]+)')
_COPY = re.compile(r'=\s*(\w+\[[\d,]*\])(?:\{[^}]*\})?\s+copy\(')


def _kv_shapes(state) -> set:
  """HLO shape strings of the self-attention K and V caches in `state`."""
  return {f'f32[{",".join(map(str, leaf.shape))}]'
          for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
          if 'self_attention' in (key := jax.tree_util.keystr(path)) and 'cached_' in key}


def _loop_copies(fn, target_state, draft_state):
  """(while loops, cache copies inside them) of `fn(target_state, draft_state)` compiled: the
  `copy` instructions of a target K/V cache's shape in any computation a while loop's body or
  condition runs (fusions, calls, branches, nested loops). The draft's caches have other shapes."""
  shapes = _kv_shapes(target_state)
  assert len(shapes) == 2 and not shapes & _kv_shapes(draft_state), shapes
  text = jax.jit(fn).lower(target_state, draft_state).compile().as_text()
  comps, name = {}, None
  for line in text.splitlines():
    if not line.startswith((' ', '\t')) and (m := _HEADER.match(line)):
      name = m.group(1)
      comps[name] = []
    elif name is not None and line.strip():
      comps[name].append(line)
  callees = lambda line: [c.strip().lstrip('%') for group in _CALLEES.findall(line)
                          for c in group.strip('{}').split(',') if c.strip()]
  bodies = [c for lines in comps.values() for line in lines if re.search(r'\swhile\(', line)
            for c in callees(line)]
  seen, todo = set(), list(bodies)
  while todo:
    c = todo.pop()
    if c not in seen and c in comps:
      seen.add(c)
      todo += [d for line in comps[c] for d in callees(line)]
  copies = sum(1 for c in seen for line in comps[c]
               if (m := _COPY.search(line)) and m.group(1) in shapes)
  return len(bodies) // 2, copies  # a while names its body and its condition


def test_the_chain_loops_write_the_cache_in_place():
  model, params = model_and_params(2)
  target, enc, rng = T5Decoder(model), jnp.asarray(INPUTS), jax.random.PRNGKey(0)
  ad = AdaptiveGamma(gamma_max=8, cost_ratio=0.1)
  assert ad.speculates and len(ad.verify_widths) == 6
  state = target.init(params, enc, cache_length(MAX_LEN, ad.call_tokens) + 3)
  draft = ModelDraft.t5(model)
  dstate = draft.init(params, enc, MAX_LEN, 8)
  loops, copies = _loop_copies(lambda t, d: adaptive.decode(
      target, t, draft, d, rng, adaptive=ad, max_decode_len=MAX_LEN), state, dstate)
  assert loops >= len(ad.verify_widths) and copies == 0, (loops, copies)
  loops, copies = _loop_copies(lambda t, d: speculative.decode(
      target, t, draft, d, rng, gamma=2, max_decode_len=MAX_LEN), state, dstate)
  assert loops >= 1 and copies == 0, (loops, copies)
  # The positive control: verification in a `lax.switch` over two widths inside the loop, each
  # branch writing the cache, copies it every iteration.
  tokens = jnp.ones((len(INPUTS), 3), jnp.int32)

  def switched(t, d):
    del d
    def body(c):
      i, ts = c
      write = lambda w: lambda ts: target.tokens_to_logits(ts, tokens[:, :w])[1]
      ts = jax.lax.switch(i % 2, [write(2), write(3)], ts)
      return i + 1, target.rollback(ts, target.index(t))
    return jax.lax.while_loop(lambda c: c[0] < 4, body, (0, t))[1]
  assert _loop_copies(switched, state, dstate)[1] >= 2


def test_the_tree_loop_writes_the_cache_in_place():
  model, params = model_and_params(2)
  target, enc = T5Decoder(model), jnp.asarray(INPUTS)
  ad = AdaptiveTree.parse('best:auto:8,depth:3,width:2', cost_ratio=0.1)
  assert len(ad.widths) > 1
  state = target.init(params, enc, cache_length(MAX_LEN, ad.call_tokens) + 3)
  draft = TreeModelDraft.t5(model)
  dstate = draft.init(params, enc, MAX_LEN, ad.shape)
  loops, copies = _loop_copies(lambda t, d: adaptive_tree.decode(
      target, t, draft, d, jax.random.PRNGKey(0), adaptive=ad, max_decode_len=MAX_LEN),
                               state, dstate)
  assert loops >= len(ad.widths) and copies == 0, (loops, copies)
