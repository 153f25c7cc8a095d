"""Adafactor as T5 configures it, the schedules and the z-loss cross-entropy."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gqa_spec.training import losses, optimizer


def test_rsqrt_decay_is_constant_through_warmup_then_decays():
  lr = optimizer.rsqrt_decay(base_learning_rate=1.0, warmup_steps=10_000)
  assert float(lr(0)) == pytest.approx(0.01)
  assert float(lr(10_000)) == pytest.approx(0.01)
  assert float(lr(40_000)) == pytest.approx(0.005)
  assert float(optimizer.constant(1e-3)(123)) == pytest.approx(1e-3)


def test_adafactor_matches_optax_with_learning_rate_inside():
  """Scaling the rate-free updates by lr afterwards equals optax's adafactor with that lr."""
  params = {'w': jnp.linspace(-1, 1, 256 * 128).reshape(256, 128), 'b': jnp.ones(7)}
  grads = jax.tree_util.tree_map(lambda p: jnp.sin(3 * p) + 0.1, params)
  ours = optimizer.adafactor()
  reference = optax.adafactor(learning_rate=0.01, decay_rate=0.8, clipping_threshold=1.0)
  updates, state = ours.update(grads, ours.init(params), params)
  expected, _ = reference.update(grads, reference.init(params), params)
  jax.tree_util.tree_map(lambda u, e: np.testing.assert_allclose(0.01 * u, e, rtol=1e-6),
                         updates, expected)
  assert {state[0].v_row['w'].shape, state[0].v_col['w'].shape} == {(256,), (128,)}  # factored


def test_cross_entropy_gradient_is_softmax_minus_one_hot_plus_z_loss_term():
  """d/dlogits of (log Z - logit_t + z log(Z)^2) = softmax * (1 + 2 z log Z) - one_hot(t)."""
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 11)) * 3  # [b, l, V]
  targets = jnp.array([[0, 10, 4], [7, 7, 1]])
  z = 0.01
  grad = jax.grad(lambda x: jnp.sum(losses.cross_entropy_with_logits(x, targets, z)[0]))(logits)
  log_z = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
  expected = (jax.nn.softmax(logits) * (1 + 2 * z * log_z)
              - jax.nn.one_hot(targets, 11, dtype=jnp.float32))
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


def test_cross_entropy_with_z_loss():
  logits = jnp.array([[[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]]])  # [1, 2, 3]
  targets = jnp.array([[0, 2]])
  weights = jnp.array([[1, 0]])
  log_z = jax.nn.logsumexp(logits[0, 0])
  objective, m = losses.weighted_cross_entropy(logits, targets, weights, z_loss=1e-4)
  expected = log_z - 2.0 + 1e-4 * log_z ** 2
  np.testing.assert_allclose(objective, expected, rtol=1e-6)  # None: summed over the batch
  np.testing.assert_allclose(m['z_loss_sum'], 1e-4 * log_z ** 2, rtol=1e-6)
  assert float(m['correct_sum']) == 1.0 and float(m['weight_sum']) == 1.0
  normalized, _ = losses.weighted_cross_entropy(logits, targets, jnp.ones((1, 2)), 1e-4,
                                                losses.NUM_REAL_TARGET_TOKENS)
  summed, _ = losses.weighted_cross_entropy(logits, targets, jnp.ones((1, 2)), 1e-4, None)
  np.testing.assert_allclose(normalized, summed / 2, rtol=1e-6)
  with pytest.raises(ValueError, match='loss_normalizing_factor'):
    losses.weighted_cross_entropy(logits, targets, weights, 1e-4, 'tokens')


def test_scanned_layers_are_a_batch_axis_for_adafactor():
  """A scanned stack's update is its unrolled layers' updates stacked (t5x: `layers` is a BATCH
  factor dim): factoring, the parameter-scale RMS and clipping stay within each layer. Two steps,
  so the per-layer statistics are read back too; the layers differ in scale, so pooling them over
  the stack would change the result."""
  layer = lambda i: {'w': (i + 1.0) * jnp.linspace(-1, 1, 256 * 130).reshape(256, 130),
                     'scale': jnp.full((130,), i + 2.0)}
  unrolled = {'decoder': {'layers_0': layer(0), 'layers_1': layer(4)}, 'emb': jnp.ones((3, 5))}
  scanned = {'decoder': {'layers': jax.tree.map(lambda *x: jnp.stack(x, axis=1), layer(0),
                                                layer(4))}, 'emb': jnp.ones((3, 5))}
  grad = lambda p, t: jax.tree.map(lambda x: jnp.sin(3 * x + t), p)
  tx = optimizer.adafactor()
  out = {}
  for name, params in (('unrolled', unrolled), ('scanned', scanned)):
    state = tx.init(params)
    for t in range(2):
      updates, state = tx.update(grad(params, t), state, params)
      params = optax.apply_updates(params, updates)
    out[name] = params
  stacked = jax.tree.map(lambda *x: jnp.stack(x, axis=1), out['unrolled']['decoder']['layers_0'],
                         out['unrolled']['decoder']['layers_1'])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4),  # |p| <= 5
               out['scanned']['decoder']['layers'], stacked)
  np.testing.assert_array_equal(out['scanned']['emb'], out['unrolled']['emb'])
  pooled = optax.adafactor(learning_rate=None, decay_rate=0.8, clipping_threshold=1.0,
                           momentum=None)  # the whole stack as one parameter: not per layer
  u, _ = pooled.update(grad(scanned, 0), pooled.init(scanned), scanned)
  u_ours, _ = tx.update(grad(scanned, 0), tx.init(scanned), scanned)
  assert not np.allclose(u['decoder']['layers']['w'], u_ours['decoder']['layers']['w'], rtol=1e-3)


def test_scanned_stacks_of_different_depths_map_apart():
  """An encoder of 3 scanned layers beside a decoder of 2 (the gpu preset's 1-decoder-layer
  draft): each stack's layers are updated as the unrolled layers would be (one map per depth: a
  single map over both failed with "vmap got inconsistent sizes")."""
  layer = lambda i: {'w': (i + 1.0) * jnp.linspace(-1, 1, 128 * 130).reshape(128, 130),
                     'scale': jnp.full((130,), i + 2.0)}
  stack = lambda ids: jax.tree.map(lambda *x: jnp.stack(x, axis=1), *[layer(i) for i in ids])
  scanned = {'encoder': {'layers': stack([0, 1, 2])}, 'decoder': {'layers': stack([3, 5])},
             'emb': jnp.ones((3, 5))}
  unrolled = {'encoder': {f'layers_{j}': layer(i) for j, i in enumerate([0, 1, 2])},
              'decoder': {f'layers_{j}': layer(i) for j, i in enumerate([3, 5])},
              'emb': jnp.ones((3, 5))}
  grad = lambda p, t: jax.tree.map(lambda x: jnp.cos(2 * x + t), p)
  tx = optimizer.adafactor()
  out = {}
  for name, params in (('unrolled', unrolled), ('scanned', scanned)):
    state = tx.init(params)
    for t in range(2):
      updates, state = jax.jit(tx.update)(grad(params, t), state, params)
      params = optax.apply_updates(params, updates)
    out[name] = params
  assert isinstance(state.scanned, tuple) and len(state.scanned) == 2  # one state per depth
  for part, n in (('encoder', 3), ('decoder', 2)):
    stacked = jax.tree.map(lambda *x: jnp.stack(x, axis=1),
                           *[out['unrolled'][part][f'layers_{j}'] for j in range(n)])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4),
                 out['scanned'][part]['layers'], stacked)
