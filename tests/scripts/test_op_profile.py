"""benchmarks.op_profile: HLO parsing and op categories on small compiled functions."""

import jax
import jax.numpy as jnp

from benchmarks import op_profile


def categories(fn, *args, optimized=True):
  lowered = jax.jit(fn).lower(*args)
  text = lowered.compile().as_text() if optimized else lowered.as_text(dialect='hlo')
  comps, _ = op_profile.parse_hlo(text)
  entry = next(c for c in comps if c.startswith('main'))
  return {op_profile.categorize(op, typ, rest, comps)
          for _, op, typ, rest in comps[entry]
          if op not in ('parameter', 'constant', 'tuple', 'get-tuple-element', 'bitcast')}


def test_categories_of_small_programs():
  x = jnp.ones((64, 128))
  assert 'matmul' in categories(lambda a, b: a @ b, x, x.T)
  assert categories(lambda a: jnp.sum(a, axis=1), x) == {'reduction'}
  assert categories(lambda a: jnp.tanh(a) * 2.0, x) == {'elementwise'}
  assert 'rng' in categories(lambda k: jax.random.uniform(k, (64, 128)), jax.random.PRNGKey(0))
  assert 'rng' in categories(lambda k: jax.random.uniform(k, (64, 128)),
                             jax.random.key(0, impl='rbg'))
  # Before XLA's passes: the suite's XLA flags (tests/conftest.py, fusion emitters off) lower a
  # scatter to a loop, XLA's defaults keep a scatter fusion.
  assert 'scatter' in categories(
      lambda a, i: jnp.zeros((256, 128)).at[i].add(a), x, jnp.arange(64) % 7, optimized=False)
  # An elementwise fusion whose operand is named after a library fusion is still elementwise.
  assert 'matmul' not in categories(lambda a: jnp.transpose(jnp.exp(a)), x)


def test_profile_sums_thunks_per_category():
  x = jnp.ones((256, 256))
  result = op_profile.profile(lambda a: jnp.sum(jnp.tanh(a @ a), axis=0), (x,), repeats=2)
  assert result['by_category_ms']['matmul'] > 0
  assert abs(sum(result['by_category_ms'].values()) - result['thunk_total_ms']) < 1e-6
  assert all(r['calls'] >= 1 for r in result['top_ops'])
