"""t5x_compat against t5x's documented behaviours: the scenarios of t5x's `decoding_test.py`
(stub `tokens_to_logits`, same inputs, same expected outputs), plus RNG-order, scores and checks."""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import t5x_compat
from gqa_spec.decoding.t5x_compat import sampling as t5x_sampling

EOS_ID = 1
NEG_INF = float(t5x_compat.NEG_INF)
RNG0 = jax.random.PRNGKey(0)


def constant_logits(rows):
  """A `tokens_to_logits` stub returning fixed `[rows, V]` logits."""
  logits = np.asarray(rows, np.float32)
  return lambda state: (jnp.asarray(logits), state.cache)


def counted(fn):
  """Wraps a stub to count its calls in the cache; returns (stub, cache, calls-of-last-run)."""
  calls = []

  def counting(state):
    logits, cache = fn(state)
    return logits, dict(cache, calls=state.cache['calls'] + 1)

  def record_final(state):  # the state callback also runs once on the final state, outside the loop
    if not isinstance(state.cache['calls'], jax.core.Tracer):
      calls.append(int(state.cache['calls']))
    return state

  return counting, {'calls': jnp.zeros((), jnp.int32)}, record_final, calls


SAMPLE_2_3 = [[-1e7, -1e7, 0, -1e7], [-1e7, -1e7, -1e7, 0]]  # row 0 -> 2, row 1 -> 3


def single(inputs, logits, **kw):
  """One decode per row, as t5x's `_temperature_sample_single_trial` tests see it."""
  decodes, scores = t5x_compat.temperature_sample(np.asarray(inputs, np.int32), {},
                                                  constant_logits(logits), EOS_ID, RNG0, **kw)
  return np.asarray(decodes)[:, 0], np.asarray(scores)[:, 0]


# --- prompts ------------------------------------------------------------------------------------

def test_uneven_prefix_with_initial_index_and_eos_in_prompt():
  out, _ = single([[0, 5, 7, 1, 0, 0], [0, 6, 1, 0, 0, 0]], SAMPLE_2_3, topk=0,
                  initial_index=np.array([3, 2]))
  np.testing.assert_array_equal(out, [[5, 7, 1, 2, 2, 2], [6, 1, 3, 3, 3, 3]])


def test_no_prefix():
  out, _ = single(np.zeros((2, 3)), SAMPLE_2_3, topk=0)
  np.testing.assert_array_equal(out, [[2, 2, 2], [3, 3, 3]])


def test_prefix_is_shifted_by_one():
  out, _ = single([[0, 5, 6, 7, 0], [0, 8, 9, 0, 0]], SAMPLE_2_3, topk=0)
  np.testing.assert_array_equal(out, [[5, 6, 7, 2, 2], [8, 9, 3, 3, 3]])


def test_prefix_ending_with_eos_does_not_end_the_row():
  out, _ = single([[0, 5, 6, 1, 0], [0, 8, 1, 0, 0]], SAMPLE_2_3, topk=1)
  np.testing.assert_array_equal(out, [[5, 6, 1, 2, 2], [8, 1, 3, 3, 3]])


def test_zero_temperature_is_argmax_whatever_topk():
  out, _ = single(np.zeros((2, 3)), [[1700.47, 1700.48, 1700.51, 1700.45], [3.2, 4.8, -5.3, 5.6]],
                  topk=4, temperature=0.0)
  np.testing.assert_array_equal(out, [[2, 2, 2], [3, 3, 3]])


# --- callbacks ----------------------------------------------------------------------------------

def test_state_callback_can_write_the_sequences():
  def add_eos_after_3(index, sequences):  # host side, as t5x's test (pure_callback for hcb.call)
    sequences = np.array(sequences)
    for row, i in enumerate(np.asarray(index)):
      if sequences[row, i] == 3:
        sequences[row, i + 1] = EOS_ID
    return sequences

  def state_callback_fn(state):
    seqs = jax.pure_callback(add_eos_after_3,
                             jax.ShapeDtypeStruct(state.sequences.shape, state.sequences.dtype),
                             state.cur_index, state.sequences)
    return state.replace(sequences=seqs)

  out, _ = single([[0, 5, 6, 7, 0], [0, 8, 9, 0, 0]], [[-1e7, -1e7, -1e7, 0]] * 2, topk=0,
                  temperature=0.0, state_callback_fn=state_callback_fn)
  np.testing.assert_array_equal(out, [[5, 6, 7, 3, EOS_ID], [8, 9, 3, EOS_ID, 0]])


def test_logit_callback_rewrites_the_logits():
  def logit_callback_fn(logits, state):
    del state
    return logits.at[0, 2].set(0.0).at[1, 3].set(0.0)

  out, _ = single([[0, 5, 6, 7, 0], [0, 8, 9, 0, 0]], [[-1e7] * 4] * 2, topk=0, temperature=0.0,
                  logit_callback_fn=logit_callback_fn)
  np.testing.assert_array_equal(out, [[5, 6, 7, 2, 2], [8, 9, 3, 3, 3]])


# --- early stopping, scores and the key-split order ---------------------------------------------

def scripted_categorical(max_decode_len):
  """t5x's mock of `jax.random.categorical`: the token depends only on WHICH key it is given,
  found by replaying t5x's split order (per step: sample key, next loop key = split(loop key))."""
  ret = [np.array([2, 3]) for _ in range(max_decode_len)]
  ret[3] = np.array([2, 1])  # row 1 generates EOS at loop step 3
  ret[4] = np.array([1, 3])  # row 0 generates EOS at loop step 4
  ret = jnp.array(ret)

  def categorical(rng_input, logits, *args, **kwargs):
    del logits, args, kwargs
    rng, k = RNG0, 0
    for j in range(max_decode_len):
      sample_key, rng = jax.random.split(rng)
      k += j * (sample_key == rng_input).all()
    return ret[k]

  return categorical


def test_early_stop_log_probs_exclude_prompt_and_follow_the_split_order():
  logits = np.random.RandomState(0).randn(2, 4).astype(np.float32)
  inputs = [[0, 5, 1, 0, 0, 0, 0], [0, 8, 0, 0, 0, 0, 0]]
  with mock.patch.object(jax.random, 'categorical', new=scripted_categorical(7)):
    out, scores = single(inputs, logits, topk=0)
  np.testing.assert_array_equal(out, [[5, 1, 2, 2, 1, 0, 0], [8, 3, 3, 1, 0, 0, 0]])
  lp = np.asarray(jax.nn.log_softmax(logits))
  np.testing.assert_allclose(scores, [lp[0, 2] * 2 + lp[0, 1], lp[1, 3] * 2 + lp[1, 1]],
                             atol=1e-5)


def test_same_key_draws_the_same_samples_as_t5x_split_order():
  """Without mocks: step j samples `categorical(k_j, logits / T)` with
  `k_j, key = split(key)` starting from `decode_rng`, on rows expanded example-major."""
  logits = np.random.RandomState(1).randn(4, 16).astype(np.float32)
  logits[:, EOS_ID] = -1e9  # never ends early
  decodes, _ = t5x_compat.temperature_sample(
      np.zeros((2, 6), np.int32), {}, constant_logits(logits), EOS_ID,
      decode_rng=jax.random.PRNGKey(7), num_decodes=2, temperature=0.7, topk=0)
  key, expected = jax.random.PRNGKey(7), []
  for _ in range(6):
    sample_key, key = jax.random.split(key)
    expected.append(np.asarray(jax.random.categorical(sample_key, logits / 0.7)))
  expected = np.stack(expected, axis=1).reshape(2, 2, 6)  # [b, n, L] before sorting
  got = np.asarray(decodes)
  for b in range(2):  # sorted by score: compare as sets of rows
    assert sorted(map(tuple, got[b])) == sorted(map(tuple, expected[b]))


def test_per_example_temperature_uses_one_unbatched_key_per_step_as_t5x():
  """t5x vmaps its per-example sampling over rows with the step's key unbatched: every row draws
  `categorical(k_j, row_logits[None] / t_row)`, so the n copies of an example draw alike."""
  logits = np.random.RandomState(2).randn(4, 16).astype(np.float32)
  logits[:, EOS_ID] = -1e9
  temps = np.array([0.7, 1.3])
  decodes, _ = t5x_compat.temperature_sample(
      np.zeros((2, 5), np.int32), {}, constant_logits(logits), EOS_ID,
      decode_rng=jax.random.PRNGKey(5), num_decodes=2, temperature=temps, topk=0)
  key, expected = jax.random.PRNGKey(5), []
  for _ in range(5):
    sample_key, key = jax.random.split(key)
    expected.append([int(jax.random.categorical(sample_key, logits[r][None] / temps[r // 2])[0])
                     for r in range(4)])
  expected = np.array(expected).T.reshape(2, 2, 5)
  for b in range(2):
    assert sorted(map(tuple, np.asarray(decodes)[b])) == sorted(map(tuple, expected[b]))


def test_greedy_topk_scores_rescaled_and_raw():
  logits = [[-1e7, -1e7, -0.510825624, -0.916290732]]  # p(2) = 0.6, p(3) = 0.4
  out, scores = single([[0, 2, 2, 2, 0]], logits, topk=1, rescale_log_probs=True)
  np.testing.assert_array_equal(out, [[2, 2, 2, 2, 2]])
  np.testing.assert_allclose(scores, [0.0], atol=1e-6)
  out, scores = single([[0, 2, 2, 3, 0]], logits, topk=1, rescale_log_probs=False)
  np.testing.assert_array_equal(out, [[2, 2, 3, 2, 2]])
  np.testing.assert_allclose(scores, [-1.02165125], atol=1e-5)  # 2 x log 0.6, prompt excluded


# --- num_decodes ordering -----------------------------------------------------------------------

@pytest.mark.parametrize('initial_index', [None, np.array([1, 2], np.int32)])
def test_num_decodes_expands_example_major_and_sorts_ascending(initial_index):
  inputs = np.array([[0, 5, 1, 0], [0, 8, 7, 0]], np.int32)
  expanded_decodes = np.array([[5, 1, 4, 4], [5, 1, 5, 5], [5, 1, 3, 3],
                               [8, 7, 5, 5], [8, 7, 3, 3], [8, 7, 4, 4]])
  expanded_log_prob = np.array([-2.3, -1.3, -3.6, -0.5, -2.5, -1.9])
  cache = {'layer': {'cached_key': jnp.arange(2.0)[:, None], 'cache_index': jnp.array([1, 2])}}
  with mock.patch.object(t5x_sampling, '_single_trial') as trial:
    trial.return_value = expanded_decodes, expanded_log_prob
    decodes, scores = t5x_compat.temperature_sample(inputs, cache, mock.Mock(), EOS_ID, RNG0,
                                                    num_decodes=3, initial_index=initial_index)
  args, kwargs = trial.call_args
  np.testing.assert_array_equal(args[0], np.repeat(inputs, 3, axis=0))
  np.testing.assert_array_equal(args[1]['layer']['cached_key'][:, 0], [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(args[1]['layer']['cache_index'], [1, 1, 1, 2, 2, 2])
  if initial_index is not None:
    np.testing.assert_array_equal(kwargs['initial_index'], [1, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(decodes, [[[5, 1, 3, 3], [5, 1, 4, 4], [5, 1, 5, 5]],
                                          [[8, 7, 3, 3], [8, 7, 4, 4], [8, 7, 5, 5]]])
  np.testing.assert_allclose(scores, [[-3.6, -2.3, -1.3], [-2.5, -1.9, -0.5]])


def test_scalar_cache_index_is_not_expanded():
  seen = {}

  def fn(state):
    seen['index'] = state.cache['cache_index']
    return jnp.zeros((4, 4)).at[:, 2].set(1e3), state.cache

  t5x_compat.temperature_sample(np.zeros((2, 2), np.int32), {'cache_index': jnp.array(0)}, fn,
                                EOS_ID, num_decodes=2)
  assert seen['index'].shape == ()


# --- max_decode_steps ---------------------------------------------------------------------------

ALWAYS_3 = [[-1e7, -1e7, -1e7, 0]]


@pytest.mark.parametrize('initial_index,expected_calls', [
    (None, 6), (np.array([1, 2], np.int32), 4), (np.array([1, 1], np.int32), 5)])
def test_max_decode_steps_counts_from_the_prompt_end(initial_index, expected_calls):
  fn, cache, final, calls = counted(constant_logits(ALWAYS_3 * 2))
  decodes, scores = t5x_compat.temperature_sample(
      np.array([[0, 2, 0, 0, 0, 0, 0, 0], [0, 2, 2, 0, 0, 0, 0, 0]], np.int32), cache, fn, EOS_ID,
      RNG0, initial_index=initial_index, topk=4, max_decode_steps=4, state_callback_fn=final)
  assert calls == [expected_calls]
  np.testing.assert_array_equal(np.asarray(decodes)[:, 0], [[2, 3, 3, 3, 3, 0, 0, 0],
                                                            [2, 2, 3, 3, 3, 3, 0, 0]])
  np.testing.assert_array_equal(scores, [[0.0], [0.0]])


def test_max_decode_steps_rows_that_end_early_are_padded():
  fn, cache, final, calls = counted(constant_logits(ALWAYS_3 * 3))
  decodes, _ = t5x_compat.temperature_sample(
      np.array([[0, 2, 0, 0, 0, 0, 0, 0], [0, 2, 2, 2, 2, 2, 2, 0], [0, 2, 2, 2, 0, 0, 0, 0]],
               np.int32), cache, fn, EOS_ID, RNG0, initial_index=np.array([1, 6, 0]), topk=4,
      max_decode_steps=4, state_callback_fn=final)
  # Row 2 needs 3 calls to leave its prompt and 4 more; row 0 ends after 4 and then only pads.
  assert calls == [7]
  np.testing.assert_array_equal(np.asarray(decodes)[:, 0], [
      [2, 3, 3, 3, 3, 0, 0, 0], [2, 2, 2, 2, 2, 2, 3, 3], [2, 2, 2, 3, 3, 3, 3, 0]])


def test_max_decode_steps_docstring_example_4():
  fn, cache, final, calls = counted(constant_logits(SAMPLE_2_3))
  decodes, _ = t5x_compat.temperature_sample(
      np.array([[0, 2, 0, 0, 0, 0, 0, 0], [0, 3, 4, 0, 0, 0, 0, 0]], np.int32), cache, fn, EOS_ID,
      RNG0, initial_index=np.array([1, 2]), topk=4, max_decode_steps=2, state_callback_fn=final)
  assert calls == [2]
  np.testing.assert_array_equal(np.asarray(decodes)[:, 0], [[2, 2, 2, 0, 0, 0, 0, 0],
                                                            [3, 4, 3, 3, 0, 0, 0, 0]])


def test_max_decode_steps_hard_limit_and_per_row_steps():
  inputs = np.array([[0, 2, 0, 0, 0, 0, 0, 0], [0, 2, 2, 0, 0, 0, 0, 0]], np.int32)
  out, _ = single(inputs, ALWAYS_3 * 2, topk=4, max_decode_steps=10,
                  max_decode_steps_hard_limit=4)
  np.testing.assert_array_equal(out, [[2, 3, 3, 3, 3, 0, 0, 0], [2, 2, 3, 3, 3, 3, 0, 0]])
  out, _ = single(inputs, ALWAYS_3 * 2, topk=4, max_decode_steps=np.array([1, 3]))
  np.testing.assert_array_equal(out, [[2, 3, 0, 0, 0, 0, 0, 0], [2, 2, 3, 3, 3, 0, 0, 0]])


# --- top-p, per-example and traced parameters ---------------------------------------------------

P_03_0_01_06 = [[-1.2, -1e7, -2.3, -0.51]]  # probabilities (0.3, 0, 0.1, 0.6)


def test_topp_below_the_top_token_is_deterministic():
  out, scores = single(np.zeros((1, 20)), P_03_0_01_06, topp=0.55, topk=0)
  np.testing.assert_array_equal(out, [[3] * 20])
  np.testing.assert_array_equal(scores, [0.0])
  # Temperature first: (0.27, 0, 0.069, 0.65), so topp 0.63 keeps only token 3.
  out, scores = single(np.zeros((1, 20)), P_03_0_01_06, temperature=0.8, topp=0.63, topk=0)
  np.testing.assert_array_equal(out, [[3] * 20])
  np.testing.assert_array_equal(scores, [0.0])


def test_per_example_temperature():
  logits = np.repeat(np.array([[-1.2, -1e7, -2.3, -0.51], [-0.51, -1.2, -1e7, -2.3],
                               [-1.2, -1e7, -0.51, -2.3], [-1.2, -0.51, -1e7, -2.3]],
                              np.float32), 2, axis=0)
  decodes, scores = t5x_compat.temperature_sample(
      np.zeros((4, 20), np.int32), {}, constant_logits(logits), EOS_ID, RNG0,
      temperature=np.array([0.5, 0, 0.3, 0.2]), topp=0.63, topk=0, num_decodes=2)
  expected = np.array([[3] * 20, [0] * 20, [2] * 20, [1] + [0] * 19])  # row 3 hits EOS
  np.testing.assert_array_equal(decodes, np.repeat(expected[:, None], 2, axis=1))
  np.testing.assert_array_equal(scores, np.zeros((4, 2)))


def test_traced_temperature_topp_and_max_decode_steps():
  fn = constant_logits(P_03_0_01_06)

  @jax.jit
  def decode(inputs, temperature, topp, steps):
    return t5x_compat.temperature_sample(inputs, {}, fn, EOS_ID, RNG0, temperature=temperature,
                                         topp=topp, topk=0, max_decode_steps=steps)

  decodes, scores = decode(np.zeros((1, 20), np.int32), 0.8, 0.63, 10)
  np.testing.assert_array_equal(decodes, [[[3] * 10 + [0] * 10]])
  np.testing.assert_array_equal(scores, [[0.0]])


def test_per_example_topp():
  logits = np.array([[-1.2, -1e7, -2.3, -0.51]] * 2, np.float32)
  out, _ = single(np.zeros((2, 30)), logits, topk=0, topp=np.array([0.55, 1.0]))
  assert (out[0] == 3).all()  # nucleus = {3}
  assert set(out[1]) - {0} <= {0, 2, 3} and len(set(out[1])) > 1  # full distribution sampled


def test_topp_mask_of_the_scaled_logits():
  """t5x's `test_topp_log_probs`: what categorical sees at temperature 1.4, topp 0.7."""
  from gqa_spec.decoding.sampling import topp_mask
  scaled = jnp.asarray([[-1.2, NEG_INF, -2.3, -0.51]], jnp.float32) / 1.4
  np.testing.assert_allclose(topp_mask(scaled, 0.7),
                             [[-0.85714293, NEG_INF, NEG_INF, -0.36428571]], rtol=1e-6)
  np.testing.assert_allclose(topp_mask(scaled, 0.0), scaled)  # p = 0: off
  kept = [0, 2, 3]  # p = 1: every token of non-zero probability
  np.testing.assert_allclose(np.asarray(topp_mask(scaled, 1.0))[0, kept], scaled[0, kept])


def test_masks_keep_ties_as_t5x_binary_search():
  """t5x's masks keep every value tied with the k-th largest / the nucleus edge."""
  from gqa_spec.decoding.sampling import topk_mask, topp_mask
  logits = jnp.asarray([[2.0, 1.0, 1.0, 0.0]])
  np.testing.assert_array_equal(topk_mask(logits, 2), [[2.0, 1.0, 1.0, NEG_INF]])
  np.testing.assert_array_equal(topk_mask(logits, 9), logits)  # k >= V: everything
  # probabilities ~ (0.53, 0.20, 0.20, 0.07): 0.6 needs one of the tied pair, keeps both.
  np.testing.assert_array_equal(topp_mask(logits, 0.6), [[2.0, 1.0, 1.0, NEG_INF]])


def test_num_decodes_expands_the_cache_at_cache_offset():
  cache = {'layer': {'cached_key': jnp.arange(6.0).reshape(3, 2)}}  # [layers, b]
  with mock.patch.object(t5x_sampling, '_single_trial') as trial:
    trial.return_value = np.zeros((4, 2), np.int32), np.zeros(4)
    t5x_compat.temperature_sample(np.zeros((2, 2), np.int32), cache, mock.Mock(), EOS_ID,
                                  num_decodes=2, cache_offset=1)
  np.testing.assert_array_equal(trial.call_args[0][1]['layer']['cached_key'],
                                [[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5]])


def test_topk_masks_all_but_the_k_best():
  logits = [[0.0, 0.1, 5.0, 4.9, -3.0]]
  out, _ = single(np.zeros((1, 40)), logits, topk=2, temperature=10.0)
  assert set(out[0]) == {2, 3}


# --- argument checks ----------------------------------------------------------------------------

def test_argument_errors():
  fn = constant_logits(SAMPLE_2_3)
  inputs = np.zeros((2, 4), np.int32)
  with pytest.raises(ValueError, match='At most one of `topp` or `topk`'):
    t5x_compat.temperature_sample(inputs, {}, fn, EOS_ID, topk=5, topp=0.9)
  with pytest.raises(ValueError, match='more steps than the sequence length'):
    t5x_compat.temperature_sample(inputs, {}, fn, EOS_ID, max_decode_steps=5)
  with pytest.raises(NotImplementedError, match='topk'):
    t5x_compat.temperature_sample(inputs, {}, fn, EOS_ID, topk=np.array([1, 2]))
  with pytest.raises(ValueError, match='temperature must be a scalar or have shape'):
    t5x_compat.temperature_sample(inputs, {}, fn, EOS_ID, temperature=np.ones(3))
  with pytest.raises(NotImplementedError, match='cache must be a mapping'):
    t5x_compat.temperature_sample(inputs, (jnp.zeros(2),), fn, EOS_ID, num_decodes=2)


# --- beam search --------------------------------------------------------------------------------

def markov_beam_problem(batch_size, beam_size, offset):
  """t5x's toy beam problem: PAD, A, B, START, END with first-order edge potentials."""
  num_states = 5
  ab = np.asarray([[[1, -1], [-1, 1]], [[-1, 1], [1, -1]], [[1, -1], [-1, 1]],
                   [[-1, 1], [1, -1]]])
  edges = np.ones([6, 5, 5]) * NEG_INF
  edges[1:5, 1:3, 1:3] = ab
  edges[0, 3, 1] = edges[0, 3, 2] = 0  # START -> A or B
  edges[5, 1, 4] = edges[5, 2, 4] = 0  # A or B -> END
  edges[:, 0, :] = 0
  edges = jnp.asarray(edges)[None]
  logits0 = jnp.asarray([[NEG_INF, NEG_INF, NEG_INF, 0, NEG_INF]])

  def tokens_to_logits(state):
    cur_iter = state.cache['cur_iter'][0] if offset else state.cache['cur_iter']  # [b*k, 1]
    step = jnp.maximum(0, cur_iter[:, 0].astype(jnp.int32) - 1)
    potentials = jnp.take_along_axis(edges, step.reshape(-1, 1, 1, 1), axis=1)[:, 0]
    onehot = jax.nn.one_hot(state.cur_token, num_states, axis=1).reshape(-1, 1, num_states)
    logits = jnp.matmul(onehot, potentials)[:, 0]
    new = cur_iter + 1
    return (jnp.where(cur_iter == 0, logits0, logits),
            {'cur_iter': new[None] if offset else new})

  shape = (1, batch_size, 1) if offset else (batch_size, 1)
  return tokens_to_logits, {'cur_iter': jnp.zeros(shape)}


@pytest.mark.parametrize('offset', [0, 1])
def test_beam_search_markov_toy(offset):
  states = ['PAD', 'A', 'B', 'START-', '-END']
  fn, cache = markov_beam_problem(2, 2, offset)
  beams, _ = t5x_compat.beam_search(np.zeros([2, 7]), cache, fn, eos_id=4, num_decodes=2,
                                    alpha=0.0, max_decode_len=7, cache_offset=offset)
  strings = [''.join(states[t] for t in np.asarray(beams)[0, i]) for i in range(2)]
  assert strings == ['START-AABBA-END', 'START-BBAAB-END']


def flat_beam_logits(rows, beam_size):
  logits = np.repeat(np.asarray(rows, np.float32), beam_size, axis=0)  # [b * k, V]
  return lambda state: (jnp.asarray(logits), state.cache)


def test_beam_search_force_decode_prefix_and_scores():
  rows = [[-1e7, -1e10, -0.1, -0.9, -1e4, -1e4, -1e4, -1e4],
          [-1e7, -1e10, -0.9, -0.1, -1e4, -1e4, -1e4, -1e4]]
  inputs = np.array([[0, 7, 0, 0, 0], [0, 4, 5, 0, 0]], np.int32)
  beams, scores = t5x_compat.beam_search(inputs, {}, flat_beam_logits(rows, 2), EOS_ID,
                                         num_decodes=2, alpha=0)
  assert np.all(np.diff(np.asarray(scores)) >= 0)  # ascending: best last
  expected = np.array([[[7, 3, 2, 2, 2], [7, 2, 2, 2, 2]], [[4, 5, 2, 3, 3], [4, 5, 3, 3, 3]]])
  np.testing.assert_array_equal(beams, expected)
  rolled = np.array([[7, 0, 0, 0, 0], [4, 5, 0, 0, 0]])
  expected_scores = []
  for batch, logits, prompt in zip(expected, rows, rolled):
    lp = np.asarray(jax.nn.log_softmax(np.asarray(logits)))
    expected_scores.append([sum(0 if p else lp[t] for t, p in zip(beam, prompt))
                            for beam in batch])
  np.testing.assert_allclose(scores, expected_scores, atol=1e-5)


def test_beam_search_no_prefix_returns_live_beams_ascending():
  rows = [[-1e7, -1e10, -0.1, -0.9], [-1e7, -1e10, -0.9, -0.1]]
  beams, scores = t5x_compat.beam_search(np.zeros((2, 5), np.int32), {},
                                         flat_beam_logits(rows, 2), EOS_ID, num_decodes=2)
  assert np.all(np.diff(np.asarray(scores)) >= 0)
  np.testing.assert_array_equal(beams, [[[3, 2, 2, 2, 2], [2, 2, 2, 2, 2]],
                                        [[2, 3, 3, 3, 3], [3, 3, 3, 3, 3]]])


def test_beam_search_max_decode_len_and_alpha():
  rows = [[-1e7, -1.0, -0.1, -0.9]] * 1
  fn = flat_beam_logits(rows, 3)
  beams, scores = t5x_compat.beam_search(np.zeros((1, 8), np.int32), {}, fn, EOS_ID,
                                         num_decodes=3, alpha=0.6, max_decode_len=4)
  assert beams.shape == (1, 3, 4)
  # The best beam finished with EOS; its score is log p / ((5 + len) / 6) ** 0.6.
  best = np.asarray(beams)[0, -1]
  length = int(np.argmax(best == EOS_ID)) + 1
  lp = np.asarray(jax.nn.log_softmax(np.asarray(rows[0])))
  raw = sum(lp[t] for t in best[:length])
  np.testing.assert_allclose(np.asarray(scores)[0, -1], raw / ((5 + length) / 6) ** 0.6,
                             rtol=1e-5)


@pytest.mark.parametrize('argument', ['initial_index', 'min_log_prob'])
def test_beam_search_arguments_of_later_t5x_raise_not_implemented(argument):
  fn = flat_beam_logits([[-1e7, -1.0, -0.1, -0.9]], 2)
  value = np.zeros((1,), np.int32) if argument == 'initial_index' else -1e3
  with pytest.raises(NotImplementedError, match=argument):
    t5x_compat.beam_search(np.zeros((1, 4), np.int32), {}, fn, EOS_ID, num_decodes=2,
                           **{argument: value})
