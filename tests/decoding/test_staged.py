"""Staged speculation: the n-gram second stage changes the draft's cost, never its proposals.

Greedy: `StagedDraft` proposes exactly what `ModelDraft` proposes (the whole speculative run is
identical, statistics included) in fewer draft calls. Sampling: its proposals follow the draft's
own distribution (chi-square of x_1..x_3 against the product of the draft's table rows) and the
outer loop stays lossless (chi-square of the output against the target's exact distribution).
Table stubs as in `test_speculative_stub.py`; one T5 run checks the real cache bookkeeping.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import autoregressive, sampling, speculative
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.drafts.model import StagedDraft
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length
from tests.decoding.conftest import INPUTS, MAX_LEN, model_and_params, perturbed, TableDecoder
from tests.decoding.test_speculative_stub import (N, NO_EOS, P_VALUE_THRESHOLD, V, _chisquare,
                                                  _empirical, _exact_first_three, _tables)

TARGET = TableDecoder()


def _successor(q_table):
  return np.argmax(q_table[1], axis=-1).astype(np.int32)  # a bigram that often agrees


def _staged_run(p, q, config, gamma, g2, max_len, batch, seed=0):
  draft = StagedDraft(TableDecoder(), g2)
  ds = draft.init_state(TableDecoder().init(q, batch, draft.cache_slots(max_len, gamma)),
                        _successor(q))
  ts = TARGET.init(p, batch, cache_length(max_len, gamma + 1))
  return speculative.decode(TARGET, ts, draft, ds, jax.random.PRNGKey(seed), gamma=gamma,
                            max_decode_len=max_len, config=config, eos_id=NO_EOS)


@pytest.mark.parametrize('gamma, g2', [(4, 2), (3, 1)])
def test_greedy_staged_draft_proposes_what_the_model_draft_proposes(gamma, g2):
  rng = np.random.RandomState(3)
  p = rng.normal(size=(12, V, V)).astype(np.float32) * 1.5  # 12 positions
  q = (p + rng.normal(size=p.shape) * 1.2).astype(np.float32)  # agrees with p often, not always
  batch, max_len = 8, 11
  ts = TARGET.init(p, batch, cache_length(max_len, gamma + 1))
  plain = speculative.decode(TARGET, ts, ModelDraft(TableDecoder()),
                             TableDecoder().init(q, batch, max_len + gamma + 2),
                             jax.random.PRNGKey(0), gamma=gamma, max_decode_len=max_len,
                             eos_id=NO_EOS)
  staged = _staged_run(p, q, sampling.GREEDY, gamma, g2, max_len, batch)
  for field in ('sequences', 'lengths', 'target_calls', 'accepted', 'accept_histogram'):
    np.testing.assert_array_equal(getattr(staged, field), getattr(plain, field))
  assert 0 < int(plain.accepted.sum()) < int(plain.proposed.sum())


def test_sampled_proposals_follow_the_draft_distribution():
  _, q = _tables(1)
  draft = StagedDraft(TableDecoder(), 2)
  state = draft.init_state(TableDecoder().init(q, N, draft.cache_slots(3, 3)), _successor(q))
  seqs = jnp.zeros((N, 8), jnp.int32)
  config = SamplingConfig(temperature=0.9, top_k=4)
  tokens, qs, state = jax.jit(draft.propose, static_argnums=(4, 5))(
      state, seqs, jnp.zeros((N,), jnp.int32), jax.random.PRNGKey(0), 3, config)
  tokens = np.asarray(tokens)
  counts = np.zeros((V, V, V))
  np.add.at(counts, (tokens[:, 0], tokens[:, 1], tokens[:, 2]), 1)
  assert _chisquare(counts, _exact_first_three(q, config)) > P_VALUE_THRESHOLD
  # q handed to verification is the draft's full distribution at each proposed position.
  probs = np.asarray(sampling.adjust_logits(jnp.asarray(q), config))  # [3, V, V]
  np.testing.assert_allclose(np.asarray(qs)[:, 0], np.broadcast_to(probs[0, 0], (N, V)), atol=1e-6)
  np.testing.assert_allclose(np.asarray(qs)[:, 1], probs[1, tokens[:, 0]], atol=1e-6)
  del state


def test_a_bigram_that_knows_the_draft_needs_fewer_draft_calls():
  _, q = _tables()
  q = np.tile(q[-1:], (8, 1, 1))  # position-free: the draft's argmax successor is a bigram
  gamma, batch = 7, 4
  draft = StagedDraft(TableDecoder(), 3)
  state = draft.init_state(TableDecoder().init(q, batch, draft.cache_slots(3, gamma)),
                           np.argmax(q[0], axis=-1))
  seqs, lengths = jnp.zeros((batch, 12), jnp.int32), jnp.zeros((batch,), jnp.int32)
  tokens, _, state = draft.propose(state, seqs, lengths, jax.random.PRNGKey(0), gamma,
                                   sampling.GREEDY)
  plain, _, _ = ModelDraft(TableDecoder()).propose(TableDecoder().init(q, batch, 12), seqs,
                                                   lengths, jax.random.PRNGKey(0), gamma,
                                                   sampling.GREEDY)
  np.testing.assert_array_equal(tokens, plain)
  assert int(state.draft_calls) == 1 + 2  # the pending token, then 4 + 4 tokens in two calls


def test_outer_loop_with_a_staged_draft_is_lossless():
  p, q = _tables()
  config = SamplingConfig(temperature=1.0)
  result = _staged_run(p, q, config, 2, 2, 3, N)
  assert _chisquare(_empirical(np.asarray(result.sequences)),
                    _exact_first_three(p, config)) > P_VALUE_THRESHOLD


def test_t5_staged_draft_is_exact_and_matches_the_model_draft():
  model, params = model_and_params(2)
  target, enc, gamma = T5Decoder(model), jnp.asarray(INPUTS), 3
  draft_params = perturbed(params, 0.3)
  ref = autoregressive.decode(target, target.init(params, enc, MAX_LEN + 1),
                              jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
  # The bigram: fitted on the draft's own greedy outputs (the paper fits on the draft's samples).
  own = autoregressive.decode(target, target.init(draft_params, enc, MAX_LEN + 1),
                              jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
  succ = np.zeros((model.config.vocab_size,), np.int32)
  for row, n in zip(np.asarray(own.sequences), np.asarray(own.lengths)):
    for a, b in zip(row[:n], row[1:n + 1]):
      succ[a] = b
  staged = StagedDraft.t5(model, 2)
  out = speculative.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, gamma + 1)), staged,
      staged.init(draft_params, enc, MAX_LEN, gamma, succ), jax.random.PRNGKey(0), gamma=gamma,
      max_decode_len=MAX_LEN)
  plain = speculative.decode(
      target, target.init(params, enc, cache_length(MAX_LEN, gamma + 1)),
      ModelDraft.t5(model), T5Decoder(model).init(draft_params, enc, MAX_LEN + gamma + 2),
      jax.random.PRNGKey(0), gamma=gamma, max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(np.asarray(out.sequences)[:, :MAX_LEN + 1], ref.sequences)
  for field in ('lengths', 'target_calls', 'accepted'):
    np.testing.assert_array_equal(getattr(out, field), getattr(plain, field))
