"""The Chimera draft network: shapes, what each query may read, and the heads' initialisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.models import chimera
from tests.decoding.conftest import model_and_params, tiny_config

CFG = chimera.ChimeraConfig.for_target(tiny_config(2), num_draft_heads=3, mlp_dim=32,
                                       trigram_dim=24)


@pytest.fixture(scope='module')
def setup():
  _, target_params = model_and_params(2)
  params = chimera.init_params(CFG, tiny_config(2), target_params, jax.random.PRNGKey(0))
  # Trained-looking heads (the f half is zero at init and would hide the block).
  params['heads'] = params['heads'] + 0.1 * jax.random.normal(jax.random.PRNGKey(1),
                                                              params['heads'].shape)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(2, 32, (2, 7)), jnp.int32).at[:, 0].set(0)
  hidden = jnp.asarray(rng.normal(size=(2, 7, 32)), jnp.float32)
  emb = target_params['token_embedder']['embedding']
  return params, target_params, emb, tokens, hidden


def _apply(params, emb, tokens, hidden, qpos):
  return chimera.Chimera(CFG).apply({'params': params}, emb, tokens, hidden, qpos)


def test_shapes_teacher_forced_and_single_query(setup):
  params, _, emb, tokens, hidden = setup
  f, logits = _apply(params, emb, tokens, hidden, jnp.broadcast_to(jnp.arange(7), (2, 7)))
  assert f.shape == (2, 7, 32) and logits.shape == (2, 7, 3, 32) and logits.dtype == jnp.float32
  f1, logits1 = _apply(params, emb, tokens, hidden, jnp.array([[3], [5]]))
  assert f1.shape == (2, 1, 32) and logits1.shape == (2, 1, 3, 32)
  # A single query equals the same position of the teacher-forced pass.
  np.testing.assert_allclose(logits1[0, 0], logits[0, 3], atol=1e-4)
  np.testing.assert_allclose(logits1[1, 0], logits[1, 5], atol=1e-4)


def test_a_query_reads_h_before_it_and_tokens_up_to_it(setup):
  params, _, emb, tokens, hidden = setup
  qpos = jnp.array([[3], [3]])
  base = _apply(params, emb, tokens, hidden, qpos)[1]
  # The future: h_3.. and s_4.. are not visible to the query at position 3.
  later = _apply(params, emb, tokens.at[:, 4:].set(9), hidden.at[:, 3:].add(5.0), qpos)[1]
  np.testing.assert_array_equal(base, later)
  # The past is read: h_1 (through the block) and s_3 (its own trigram).
  assert not np.allclose(base, _apply(params, emb, tokens, hidden.at[:, 1].add(1.0), qpos)[1])
  assert not np.allclose(base, _apply(params, emb, tokens.at[:, 3].set(31), hidden, qpos)[1])


def test_untrained_heads_are_the_target_logits_layer_on_the_previous_hidden_state(setup):
  _, target_params, emb, tokens, hidden = setup
  params = chimera.init_params(CFG, tiny_config(2), target_params, jax.random.PRNGKey(0))
  _, logits = _apply(params, emb, tokens, hidden, jnp.array([[0, 4], [2, 6]]))
  w = target_params['decoder']['logits_dense']['kernel']
  for head in range(3):
    np.testing.assert_allclose(logits[0, 1, head], hidden[0, 3] @ w, atol=1e-4)
    np.testing.assert_allclose(logits[1, 1, head], hidden[1, 5] @ w, atol=1e-4)
    np.testing.assert_allclose(logits[0, 0, head], 0.0, atol=1e-6)  # h_{-1} = 0


def test_trigram_inputs_collapse_at_the_start():
  emb = jnp.arange(12.0).reshape(6, 2)
  x = chimera.trigram_inputs(emb, jnp.array([[1, 2, 3]]))  # [1, 3, 6]
  np.testing.assert_array_equal(x[0, 0], [0, 0, 0, 0, 2, 3])
  np.testing.assert_array_equal(x[0, 1], [0, 0, 2, 3, 4, 5])
  np.testing.assert_array_equal(x[0, 2], [2, 3, 4, 5, 6, 7])


def test_config_must_fit_the_target_and_round_trips():
  with pytest.raises(ValueError, match='does not fit the target'):
    CFG.replace(emb_dim=16).check_target(tiny_config(2))
  assert chimera.ChimeraConfig.from_dict(CFG.to_dict()) == CFG
  with pytest.raises(ValueError, match='num_draft_heads must be >= 1'):
    CFG.replace(num_draft_heads=0)


def test_the_lookup_table_and_sliced_heads_give_the_full_computations_logits(setup):
  params, _, emb, tokens, hidden = setup
  qpos = jnp.broadcast_to(jnp.arange(7), (2, 7))
  f, full = _apply(params, emb, tokens, hidden, qpos)  # [b, 7, 3, V] by the direct trigram MLP
  table = chimera.trigram_table(params, emb)  # [3, V, F]
  assert table.shape == (3, 32, 24)
  f2, two = chimera.Chimera(CFG).apply({'params': params}, None, tokens, hidden, qpos,
                                       num_heads=2, table=table)
  assert two.shape == (2, 7, 2, 32)  # only heads 1..2 are projected
  np.testing.assert_allclose(f2, f, atol=1e-5)  # the table is exact, uni/bigrams included
  np.testing.assert_allclose(two, full[:, :, :2], atol=1e-4)
  with pytest.raises(ValueError, match='num_heads 4 is not in 1..3'):
    chimera.Chimera(CFG).apply({'params': params}, emb, tokens, hidden, qpos, num_heads=4)
