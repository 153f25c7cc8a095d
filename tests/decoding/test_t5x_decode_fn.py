"""`t5x_compat.speculative_sample` as a t5x `DecodeFnCallable` (draft by partial application)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import t5x_compat
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.drafts.copy import CopyDraft

V, L, GAMMA = 6, 8, 3
TABLE = jnp.asarray(np.random.RandomState(0).randn(L + GAMMA + 2, V, V).astype(np.float32) * 2)
TABLE = TABLE.at[:, :, 0].set(-1e9)  # never PAD


def t5x_style_tokens_to_logits(state):
  """Stub target in t5x's calling convention, over a cache with a per-row `cache_index`:
  the logits at position t are `TABLE[t, token]`; k tokens per row are scored at once."""
  tokens = state.cur_token  # [b, k]
  index = state.cache['decoder']['cache_index']  # [b]
  positions = index[:, None] + jnp.arange(tokens.shape[1])  # [b, k]
  logits = TABLE[jnp.minimum(positions, TABLE.shape[0] - 1), tokens]  # [b, k, V]
  cache = {'decoder': {'cache_index': index + tokens.shape[1]}}
  return (logits[:, 0] if tokens.shape[1] == 1 else logits), cache


def fresh_cache(batch):
  return {'decoder': {'cache_index': jnp.zeros((batch,), jnp.int32)}}


def test_greedy_speculative_decode_fn_matches_t5x_greedy_sampling():
  batch = 3
  encoder_tokens = jnp.asarray(np.random.RandomState(1).randint(2, V, (batch, 5)), jnp.int32)
  draft = CopyDraft(vocab_size=V)
  decode_fn = functools.partial(t5x_compat.speculative_sample, draft=draft,
                                draft_state=draft.init(encoder_tokens), gamma=GAMMA)
  inputs = jnp.zeros((batch, L), jnp.int32)
  # Called as t5x's EncoderDecoderModel.predict_batch_with_aux calls its decode_fn.
  decodes, scores = decode_fn(inputs=inputs, cache=fresh_cache(batch),
                              tokens_to_logits=t5x_style_tokens_to_logits, num_decodes=1,
                              cache_offset=0, eos_id=1, decode_rng=jax.random.PRNGKey(0),
                              temperature=0.0)
  expected, _ = t5x_compat.temperature_sample(inputs, fresh_cache(batch),
                                              t5x_style_tokens_to_logits, 1, temperature=0.0)
  assert decodes.shape == (batch, 1, L) and scores.shape == (batch, 1)
  np.testing.assert_array_equal(decodes, expected)
  assert np.isnan(np.asarray(scores)).all()  # no log-probs from the speculative loop
  assert np.asarray(decodes).any()
  short, _ = decode_fn(inputs=inputs, cache=fresh_cache(batch),
                       tokens_to_logits=t5x_style_tokens_to_logits, num_decodes=1,
                       cache_offset=0, eos_id=1, decode_rng=None, temperature=0.0,
                       max_decode_steps=2)
  np.testing.assert_array_equal(np.asarray(short)[:, 0, 2:], 0)
  np.testing.assert_array_equal(np.asarray(short)[:, 0, :2], np.asarray(expected)[:, 0, :2])


def test_adaptive_gamma_decode_fn_matches_t5x_greedy_sampling():
  batch = 3
  encoder_tokens = jnp.asarray(np.random.RandomState(1).randint(2, V, (batch, 5)), jnp.int32)
  draft = CopyDraft(vocab_size=V)
  decodes, _ = t5x_compat.speculative_sample(
      inputs=jnp.zeros((batch, L), jnp.int32), cache=fresh_cache(batch),
      tokens_to_logits=t5x_style_tokens_to_logits, eos_id=1, num_decodes=1,
      decode_rng=jax.random.PRNGKey(0), cache_offset=0, draft=draft,
      draft_state=draft.init(encoder_tokens), temperature=0.0,
      gamma=AdaptiveGamma(gamma_max=GAMMA, policy='heuristic', gamma_init=1))
  expected, _ = t5x_compat.temperature_sample(jnp.zeros((batch, L), jnp.int32), fresh_cache(batch),
                                              t5x_style_tokens_to_logits, 1, temperature=0.0)
  np.testing.assert_array_equal(decodes, expected)
  assert np.asarray(decodes).any()


def test_sampled_first_token_follows_the_target_distribution():
  """Speculative sampling stays exact through the adapter: 4000 rows' first tokens vs softmax
  of the target's first-step logits (tolerance 0.03, about 4 standard errors)."""
  batch = 4000
  draft = CopyDraft(vocab_size=V)
  decodes, _ = t5x_compat.speculative_sample(
      inputs=jnp.zeros((batch, 2), jnp.int32), cache=fresh_cache(batch),
      tokens_to_logits=t5x_style_tokens_to_logits, eos_id=1, num_decodes=1,
      decode_rng=jax.random.PRNGKey(3), cache_offset=0, draft=draft,
      draft_state=draft.init(jnp.full((batch, 4), 3, jnp.int32)), gamma=2, topk=0)
  freq = np.bincount(np.asarray(decodes)[:, 0, 0], minlength=V) / batch
  np.testing.assert_allclose(freq, np.asarray(jax.nn.softmax(TABLE[0, 0])), atol=0.03)


def test_unsupported_arguments_are_named():
  draft = CopyDraft(vocab_size=V)
  base = dict(inputs=jnp.zeros((2, L), jnp.int32), cache=fresh_cache(2),
              tokens_to_logits=t5x_style_tokens_to_logits, eos_id=1, draft=draft,
              draft_state=draft.init(jnp.ones((2, 3), jnp.int32)), gamma=GAMMA)
  cases = [(dict(num_decodes=2), 'num_decodes'), (dict(cache_offset=1), 'cache_offset'),
           (dict(initial_index=jnp.zeros(2, jnp.int32)), 'initial_index'),
           (dict(logit_callback_fn=lambda l, s: l), 'logit_callback_fn'),
           (dict(inputs=jnp.ones((2, L), jnp.int32)), 'decoder prompts'),
           (dict(temperature=jnp.ones(2)), 'temperature'),
           (dict(cache={'cache_index': jnp.zeros((), jnp.int32)}), 'per-row `cache_index`')]
  for extra, message in cases:
    with pytest.raises(NotImplementedError, match=message):
      t5x_compat.speculative_sample(**{**base, **extra})
  with pytest.raises(ValueError, match='At most one'):
    t5x_compat.speculative_sample(**base, topk=2, topp=0.5)

  @jax.jit
  def jitted(inputs):  # as t5x's predict_batch_with_aux calls its decode_fn: inputs traced
    return t5x_compat.speculative_sample(**{**base, 'inputs': inputs})

  assert jitted(jnp.zeros((2, L), jnp.int32))[0].shape == (2, 1, L)
  with pytest.raises(Exception, match='decoder prompts'):
    jax.block_until_ready(jitted(jnp.ones((2, L), jnp.int32)))

  def one_token_only(state):
    logits, cache = t5x_style_tokens_to_logits(state)
    return (logits[:, 0] if logits.ndim == 3 else logits), cache

  with pytest.raises(ValueError, match=r'needs \[rows, k, V\]'):
    t5x_compat.speculative_sample(**{**base, 'tokens_to_logits': one_token_only})

