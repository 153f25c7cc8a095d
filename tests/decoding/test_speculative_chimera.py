"""A Chimera draft in the chain and tree speculative loops: greedy output is token-identical to
greedy autoregressive decoding, and the draft reads the target's hidden states of each verification
call (in trees: of the accepted path)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import autoregressive, sampling, speculative, tree_speculative
from gqa_spec.decoding.drafts.chimera import ChimeraDraft, ChimeraTreeDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.models import chimera
from tests.decoding.conftest import INPUTS, MAX_LEN, model_and_params, tiny_config

CFG = chimera.ChimeraConfig.for_target(tiny_config(2), num_draft_heads=3, mlp_dim=32,
                                       trigram_dim=24)
GAMMA_MAX = 3
_RECORD = []  # (sequences, lengths, tokens) of every proposal of `_Recording`


@dataclasses.dataclass(frozen=True)
class _Recording(ChimeraDraft):

  def propose(self, state, sequences, lengths, rng, gamma, config):
    tokens, q, state = super().propose(state, sequences, lengths, rng, gamma, config)
    jax.debug.callback(lambda *a: _RECORD.append([np.asarray(x) for x in a]), sequences, lengths,
                       tokens)
    return tokens, q, state


def _setup(trained_like):
  model, params = model_and_params(2)
  draft_params = chimera.init_params(CFG, tiny_config(2), params, jax.random.PRNGKey(0))
  if trained_like:  # heads that also read the full-context state
    draft_params['heads'] = draft_params['heads'] + 0.5 * jax.random.normal(
        jax.random.PRNGKey(1), draft_params['heads'].shape)
  return model, params, draft_params


def _run(draft, model, params, draft_params, gamma):
  enc = jnp.asarray(INPUTS)
  target = T5Decoder(model)
  tstate = target.init(params, enc, cache_length(MAX_LEN, gamma + 1))
  dstate = draft.init(draft_params, params['token_embedder']['embedding'], 4, MAX_LEN)
  return speculative.decode(target, tstate, draft, dstate, jax.random.PRNGKey(0), gamma=gamma,
                            max_decode_len=MAX_LEN)


@pytest.mark.parametrize('gamma', [1, 3])
def test_greedy_speculative_with_chimera_equals_greedy_autoregressive(gamma):
  model, params, draft_params = _setup(trained_like=True)
  target = T5Decoder(model)
  ref = autoregressive.decode(target, target.init(params, jnp.asarray(INPUTS), MAX_LEN + 1),
                              jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
  result = _run(ChimeraDraft(CFG), model, params, draft_params, gamma)
  n = ref.sequences.shape[1]
  np.testing.assert_array_equal(result.lengths, ref.lengths)
  np.testing.assert_array_equal(result.sequences[:, :n], ref.sequences)
  assert int(np.sum(result.target_calls)) > 0


def test_the_draft_sees_the_hidden_state_that_predicted_the_newest_token():
  # Untrained heads are [W_lm; 0]: at position N every head outputs the target's logits from
  # h_{N-1}, whose greedy argmax is s_N itself. So every proposal must repeat the row's newest
  # token exactly when the buffer holds, at every iteration, the hidden state of the right call.
  model, params, draft_params = _setup(trained_like=False)
  _RECORD.clear()
  result = _run(_Recording(CFG), model, params, draft_params, GAMMA_MAX)
  final = np.asarray(result.lengths)
  checked = 0
  for sequences, lengths, tokens in _RECORD:
    for row in range(4):
      n = lengths[row]
      if n == 0 or n >= final[row]:  # nothing to read yet / the row is done
        continue
      np.testing.assert_array_equal(tokens[row], np.full(GAMMA_MAX, sequences[row, n]))
      checked += 1
  assert checked >= 4
  # Before any verification there is no hidden state: h_{-1} = 0 gives all-zero logits.
  np.testing.assert_array_equal(_RECORD[0][2], 0)


def test_gamma_beyond_the_heads_is_a_clear_error():
  model, params, draft_params = _setup(trained_like=False)
  with pytest.raises(ValueError, match='gamma 4 needs 1..3 Chimera heads'):
    _run(ChimeraDraft(CFG), model, params, draft_params, 4)


# Chimera as a tree proposer (top-k per head) in the tree loop.
TOPK_TREE = TreeShape.topk(2, 2, 1)
BEST_TREE = TreeShape.best(5, depth=3, width=2)


def _run_tree(draft, model, params, draft_params, shape, config=sampling.GREEDY):
  enc = jnp.asarray(INPUTS)
  target = T5Decoder(model)
  tstate = target.init(params, enc, cache_length(MAX_LEN, shape.num_nodes + 1))
  dstate = draft.init(draft_params, params['token_embedder']['embedding'], 4, MAX_LEN)
  return tree_speculative.decode(target, tstate, draft, dstate, jax.random.PRNGKey(0),
                                 shape=shape, max_decode_len=MAX_LEN, config=config)


@pytest.mark.parametrize('shape', [TOPK_TREE, BEST_TREE], ids=['topk', 'best'])
def test_greedy_tree_speculative_with_chimera_equals_greedy_autoregressive(shape):
  model, params, draft_params = _setup(trained_like=True)
  target = T5Decoder(model)
  ref = autoregressive.decode(target, target.init(params, jnp.asarray(INPUTS), MAX_LEN + 1),
                              jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
  result = _run_tree(ChimeraTreeDraft(CFG), model, params, draft_params, shape)
  n = ref.sequences.shape[1]
  np.testing.assert_array_equal(result.lengths, ref.lengths)
  np.testing.assert_array_equal(result.sequences[:, :n], ref.sequences)
  assert int(np.sum(result.accepted)) > 0  # the tree proposed tokens the target took


@dataclasses.dataclass(frozen=True)
class _RecordingTree(ChimeraTreeDraft):

  def propose_tree(self, state, sequences, lengths, rng, shape, config):
    tree, state = super().propose_tree(state, sequences, lengths, rng, shape, config)
    jax.debug.callback(lambda *a: _RECORD.append([np.asarray(x) for x in a]), sequences, lengths,
                       tree.tokens, tree.depths)
    return tree, state


def test_the_tree_draft_sees_the_hidden_state_of_the_accepted_path():
  # Untrained heads give the target's logits from h_{N-1}: at every depth the first (top-1) child
  # is s_N itself, iff `observe` stored the hidden states of the root and the accepted path's nodes
  # (not of rejected nodes) of the last verification call.
  model, params, draft_params = _setup(trained_like=False)
  _RECORD.clear()
  shape = TreeShape.topk(2, 1, 1)  # nodes 0, 1 at depth 1; first child of node 0 first
  result = _run_tree(_RecordingTree(CFG), model, params, draft_params, shape)
  final = np.asarray(result.lengths)
  checked = 0
  for sequences, lengths, tokens, depths in _RECORD:
    for row in range(4):
      n = lengths[row]
      if n == 0 or n >= final[row]:
        continue
      first = [tokens[row][np.argmax(depths[row] == d)] for d in (1, 2, 3)]
      np.testing.assert_array_equal(first, np.full(3, sequences[row, n]))
      checked += 1
  assert checked >= 4
  assert int(np.sum(result.accepted)) > 0


def test_a_tree_deeper_than_the_heads_is_a_clear_error():
  model, params, draft_params = _setup(trained_like=False)
  with pytest.raises(ValueError, match='gamma 4 needs 1..3 Chimera heads'):
    _run_tree(ChimeraTreeDraft(CFG), model, params, draft_params, TreeShape.topk(1, 1, 1, 1))
