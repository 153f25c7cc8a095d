"""Greedy speculative decoding of T5 targets is token-identical to greedy autoregressive decoding.

Grid: MHA / GQA-2 / MQA targets x drafts {the target itself (always accepted), the target with
perturbed weights (partial acceptance), a bigram fitted on the target's outputs, copy} x gamma
{1, 3, 7} on a ragged batch of 4; a different smaller T5 (rarely accepted) at gamma 3; batch 1 at
gamma 3. Jit compiles dominate the time, so caches have one length for every gamma.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import autoregressive, speculative
from gqa_spec.decoding.drafts import CopyDraft, ModelDraft, NgramDraft, fit_ngram
from gqa_spec.decoding.targets import T5Decoder, cache_length
from tests.decoding.conftest import INPUTS, MAX_LEN, VOCAB, model_and_params, perturbed

KV_HEADS = {'mha': 4, 'gqa': 2, 'mqa': 1}
# One cache length for every gamma (<= 7), so each model's jitted init compiles once.
TARGET_SLOTS = cache_length(MAX_LEN, 8)
DRAFT_SLOTS = MAX_LEN + 7 + 2


@functools.lru_cache(maxsize=None)
def perturbed_params(kind):
  return perturbed(model_and_params(KV_HEADS[kind])[1], 0.3)


@functools.lru_cache(maxsize=None)
def greedy_reference(kind, batch):
  model, params = model_and_params(KV_HEADS[kind])
  dec = T5Decoder(model)
  enc = jnp.asarray(INPUTS[:batch])
  result = autoregressive.decode(dec, dec.init(params, enc, MAX_LEN + 1), jax.random.PRNGKey(0),
                                 max_decode_len=MAX_LEN)
  return np.asarray(result.sequences), np.asarray(result.lengths)


def _draft(kind, draft_kind, batch, gamma):
  model, params = model_and_params(KV_HEADS[kind])
  enc = jnp.asarray(INPUTS[:batch])
  if draft_kind in ('self', 'perturbed'):
    draft = ModelDraft.t5(model)
    p = params if draft_kind == 'self' else perturbed_params(kind)
    return draft, draft.decoder.init(p, enc, DRAFT_SLOTS)
  if draft_kind == 'small':
    small, small_params = model_and_params(1, seed=3, emb_dim=16, num_heads=2, mlp_dim=32,
                                           num_decoder_layers=1)
    draft = ModelDraft.t5(small)
    return draft, draft.decoder.init(small_params, enc, DRAFT_SLOTS)
  if draft_kind == 'bigram':
    seqs, lengths = greedy_reference(kind, len(INPUTS))
    ngram = fit_ngram([s[1:1 + n] for s, n in zip(seqs, lengths)], order=2, vocab_size=VOCAB)
    draft = NgramDraft(VOCAB)
    return draft, draft.init(ngram)
  draft = CopyDraft(VOCAB)
  return draft, draft.init(enc)


def _check(kind, draft_kind, gamma, batch):
  model, params = model_and_params(KV_HEADS[kind])
  target = T5Decoder(model)
  enc = jnp.asarray(INPUTS[:batch])
  draft, draft_state = _draft(kind, draft_kind, batch, gamma)
  result = speculative.decode(
      target, target.init(params, enc, TARGET_SLOTS), draft,
      draft_state, jax.random.PRNGKey(0), gamma=gamma, max_decode_len=MAX_LEN)
  ref_seqs, ref_lengths = greedy_reference(kind, batch)
  np.testing.assert_array_equal(np.asarray(result.lengths), ref_lengths)
  np.testing.assert_array_equal(np.asarray(result.sequences)[:, :MAX_LEN + 1], ref_seqs)
  assert not np.asarray(result.sequences)[:, MAX_LEN + 1:].any()
  return speculative.summarize(result)


@pytest.mark.parametrize('gamma', [1, 3, 7])
@pytest.mark.parametrize('kind', ['mha', 'gqa', 'mqa'])
def test_model_drafts_are_exact(kind, gamma):
  s = _check(kind, 'self', gamma, 4)
  assert s['acceptance_rate'] == 1.0
  # All accepted: every call yields gamma + 1 tokens until EOS / max length truncates a row's last.
  assert s['accept_histogram'] == [0] * gamma + [s['target_calls']]
  assert s['target_calls'] >= s['tokens'] / (gamma + 1)
  s = _check(kind, 'perturbed', gamma, 4)
  assert 0.0 < s['acceptance_rate'] < 1.0, s
  assert len(set(s['acceptance_rate_per_row'])) > 1  # ragged: rows accept different counts
  if gamma == 3:  # a different, smaller T5 (its own compile; rarely accepted)
    s = _check(kind, 'small', gamma, 4)
    assert s['acceptance_rate'] < 1.0


@pytest.mark.parametrize('gamma', [1, 3, 7])
@pytest.mark.parametrize('kind', ['mha', 'gqa', 'mqa'])
@pytest.mark.parametrize('draft_kind', ['bigram', 'copy'])
def test_deterministic_drafts_are_exact(kind, gamma, draft_kind):
  s = _check(kind, draft_kind, gamma, 4)
  if draft_kind == 'bigram':
    assert s['accepted'] > 0  # fitted on the target's own outputs


@pytest.mark.parametrize('kind', ['mha', 'gqa', 'mqa'])
@pytest.mark.parametrize('draft_kind', ['perturbed', 'bigram', 'copy'])
def test_batch_of_one_is_exact(kind, draft_kind):
  _check(kind, draft_kind, 3, 1)
