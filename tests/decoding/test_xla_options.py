"""`decoding.xla_options.fast_compile`: the loops compiled with XLA's fast-compile options give the
same tokens, and the options reach XLA's compiler. (The suite's XLA_FLAGS are those options
already, tests/conftest.py, so the compiled code itself is the same here.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import autoregressive, speculative, xla_options
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length
from tests.decoding.conftest import INPUTS, MAX_LEN, model_and_params, perturbed


def test_fast_compile_gives_the_same_tokens_with_other_code():
  model, params = model_and_params(2)
  enc = jnp.asarray(INPUTS)
  target, draft = T5Decoder(model), ModelDraft.t5(model)
  draft_params = perturbed(params, 0.3)

  def run():
    state = target.init(params, enc, cache_length(MAX_LEN, 3))
    chain = speculative.decode(target, state, draft, draft.init(draft_params, enc, MAX_LEN, 2),
                               jax.random.PRNGKey(0), gamma=2, max_decode_len=MAX_LEN)
    state = target.init(params, enc, MAX_LEN + 1)
    greedy = autoregressive.decode(target, state, jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
    return chain, greedy

  chain, greedy = run()
  assert xla_options.current() is None
  with xla_options.fast_compile():
    assert xla_options.current() == xla_options.FAST_COMPILE
    fast_chain, fast_greedy = run()
    with xla_options.fast_compile(False):  # nested: the defaults again
      assert xla_options.current() is None
  assert xla_options.current() is None
  for got, want in ((fast_chain, chain), (fast_greedy, greedy)):
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_the_options_reach_the_compiler_of_every_loop_kind(monkeypatch):
  from gqa_spec.decoding import mesh  # pylint: disable=g-import-not-at-top
  from gqa_spec.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  model, params = model_and_params(2)
  enc = jnp.asarray(INPUTS)
  monkeypatch.setattr(xla_options, 'FAST_COMPILE', {'xla_gqa_spec_no_such_option': True})
  decoder = mesh.MeshT5Decoder(model, Partitioner.create(model.config, 1, 1))
  for target, loop in ((T5Decoder(model), autoregressive.decode),
                       (decoder, mesh.autoregressive)):
    state = target.init(params, enc, MAX_LEN + 1)
    with xla_options.fast_compile():
      with pytest.raises(Exception, match='xla_gqa_spec_no_such_option'):
        loop(target, state, jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
      with pytest.raises(Exception, match='xla_gqa_spec_no_such_option'):
        target.init(params, enc, MAX_LEN + 1)  # the encoder and cache init too


def test_first_runs_side_by_side_keep_their_order_and_the_options(monkeypatch):
  """`speed_grid.first_runs` (the speculative stage's compiling runs, `workers` at a time): results
  in order, two really at once, and each thread compiles with the caller's options."""
  import threading  # pylint: disable=g-import-not-at-top
  from gqa_spec.reproduce import speed_grid as timing  # pylint: disable=g-import-not-at-top
  together = threading.Barrier(2, timeout=60)  # passes only when two runs are under way at once
  seen = []

  def run(i):
    if i < 2:
      together.wait()
    seen.append(xla_options.current())
    return jnp.full((2,), i)

  with xla_options.fast_compile():
    out = timing.first_runs([lambda i=i: run(i) for i in range(3)], workers=2)
  assert [int(o[0]) for o in out] == [0, 1, 2]
  assert seen == [xla_options.FAST_COMPILE] * 3
  assert [int(o[0]) for o in timing.first_runs([lambda: run(2)] * 2, workers=1)] == [2, 2]
  with pytest.raises(ValueError, match='workers must be >= 1'):
    timing.first_runs([lambda: run(2)], workers=0)

  model, params = model_and_params(2)
  target, enc = T5Decoder(model), jnp.asarray(INPUTS)
  state = target.init(params, enc, MAX_LEN + 1)
  monkeypatch.setattr(xla_options, 'FAST_COMPILE', {'xla_gqa_spec_no_such_option': True})
  with xla_options.fast_compile(), pytest.raises(Exception, match='xla_gqa_spec_no_such_option'):
    timing.first_runs([lambda: autoregressive.decode(target, state, jax.random.PRNGKey(0),
                                                      max_decode_len=MAX_LEN)] * 2, workers=2)


def test_a_decoding_function_built_on_another_compiles_with_the_options():
  """`adaptive.decode` where no row speculates is `autoregressive.decode` inside a jit of its own
  (JAX refuses compiler options on a nested jit: the smoke reproduction's speculative stage
  crashed so once): inside `fast_compile()` it runs, and gives greedy decoding's tokens."""
  from gqa_spec.decoding import adaptive  # pylint: disable=g-import-not-at-top
  model, params = model_and_params(2)
  enc = jnp.asarray(INPUTS)
  target = T5Decoder(model)
  auto = adaptive.AdaptiveGamma(gamma_max=2, cost_ratio=2.0)
  assert not auto.speculates
  state = target.init(params, enc, cache_length(MAX_LEN, auto.call_tokens))
  greedy = autoregressive.decode(target, state, jax.random.PRNGKey(0), max_decode_len=MAX_LEN)
  with xla_options.fast_compile():
    got = adaptive.decode(target, state, None, None, jax.random.PRNGKey(0), adaptive=auto,
                          max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(got.sequences, greedy.sequences)
