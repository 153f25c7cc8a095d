"""The decoder's final hidden states, exposed by the same pass that computes the logits."""

import jax
import jax.numpy as jnp
import numpy as np

from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models import decode_cache as dc
from gqa_spec.models.t5 import Transformer
from tests.decoding.conftest import INPUTS, model_and_params


def _logits_from_hidden(params, hidden):
  return hidden @ params['decoder']['logits_dense']['kernel']  # [b, k, V]


def test_decode_call_hidden_states_match_teacher_forcing_and_give_the_logits():
  model, params = model_and_params(2)
  enc = jnp.asarray(INPUTS)
  dec = jnp.asarray(np.random.default_rng(0).integers(2, 32, (4, 6)), jnp.int32).at[:, 0].set(0)
  tf_logits, tf_hidden = model.apply({'params': params}, enc, dec, jnp.ones_like(dec),
                                     enable_dropout=False, return_hidden=True,
                                     method=lambda m, *a, **k: m.decode(m.encode(a[0]), *a, **k))
  plain = model.apply({'params': params}, enc, dec, jnp.ones_like(dec), enable_dropout=False)
  np.testing.assert_array_equal(tf_logits, plain)  # asking for hidden states changes nothing
  assert tf_hidden.shape == (4, 6, 32)
  np.testing.assert_allclose(_logits_from_hidden(params, tf_hidden), tf_logits, atol=1e-5)

  target = T5Decoder(model)
  state = target.init(params, enc, 8)
  # Two decode calls (3 + 3 tokens), as a verification loop makes them.
  l1, h1, state = target.tokens_to_logits_and_hidden(state, dec[:, :3])
  only_logits, _ = target.tokens_to_logits(target.rollback(state, jnp.zeros(4, jnp.int32)),
                                           dec[:, :3])
  np.testing.assert_array_equal(l1, only_logits)
  l2, h2, state = target.tokens_to_logits_and_hidden(state, dec[:, 3:])
  hidden = jnp.concatenate([h1, h2], axis=1)  # [b, 6, D]
  np.testing.assert_allclose(hidden, tf_hidden, atol=1e-5)
  np.testing.assert_allclose(jnp.concatenate([l1, l2], axis=1), tf_logits, atol=1e-4)
  np.testing.assert_array_equal(dc.cache_index(state.cache), [6, 6, 6, 6])
