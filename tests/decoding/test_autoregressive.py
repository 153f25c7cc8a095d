"""Autoregressive decoding, beam search, the t5x-compatible sampler and cache rollback."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from gqa_spec.decoding import autoregressive, sampling, t5x_compat
from gqa_spec.decoding.beam_search import beam_search, brevity_penalty
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder
from gqa_spec.models import decode_cache
from tests.decoding.conftest import INPUTS, MAX_LEN, model_and_params, TableDecoder


def test_greedy_equals_teacher_forced_argmax():
  model, params = model_and_params(2)
  dec = T5Decoder(model)
  enc = jnp.asarray(INPUTS)
  result = autoregressive.decode(dec, dec.init(params, enc, MAX_LEN + 1), jax.random.PRNGKey(0),
                                 max_decode_len=MAX_LEN)
  seqs = np.asarray(result.sequences)
  logits = jax.jit(lambda p, e, d: model.apply({'params': p}, e, d, jnp.ones_like(d),
                                                enable_dropout=False))(
      params, enc, seqs[:, :-1])  # [b, L, V]
  argmax = np.asarray(jnp.argmax(logits, -1))
  for row, n in enumerate(np.asarray(result.lengths)):
    assert n == MAX_LEN or seqs[row, n] == autoregressive.EOS
    np.testing.assert_array_equal(seqs[row, 1:1 + n], argmax[row, :n])
    assert not seqs[row, 1 + n:].any()


def test_skip_rows_generate_nothing_and_chunked_loops_decode_the_same():
  model, params = model_and_params(2)
  dec = T5Decoder(model)
  enc = jnp.asarray(INPUTS)
  skip = jnp.array([False, True, False, False])
  results = [autoregressive.decode(dec, dec.init(params, enc, MAX_LEN + 1), jax.random.PRNGKey(0),
                                   max_decode_len=MAX_LEN, skip=skip, loop_chunk=chunk,
                                   eos_id=16)  # a token this model emits: rows end unevenly
             for chunk in (1, 3)]
  result = results[0]
  assert np.asarray(result.lengths)[1] == 0 and np.asarray(result.target_calls)[1] == 0
  assert np.asarray(result.lengths)[[0, 2, 3]].tolist() == [9, 2, 3]  # 2 and 9: mid-chunk
  for a, b in zip(jax.tree_util.tree_leaves(results[0]), jax.tree_util.tree_leaves(results[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Seeded sampling too: the chunked loop splits the keys in the same order.
  table = np.random.RandomState(2).normal(size=(4, 6, 6)).astype(np.float32)
  sampled = [autoregressive.decode(TableDecoder(), TableDecoder().init(table, 16, 8),
                                   jax.random.PRNGKey(1), max_decode_len=7, eos_id=1,
                                   config=SamplingConfig(temperature=1.0), loop_chunk=chunk)
             for chunk in (1, 4)]
  assert len(set(np.asarray(sampled[0].lengths))) > 1
  np.testing.assert_array_equal(np.asarray(sampled[0].sequences), np.asarray(sampled[1].sequences))


def test_a_state_holds_the_parameters_not_a_copy():
  """`T5Decoder.init` once returned the parameters from its jitted function: every state (every
  batch of a run) held its own copy of the weights."""
  model, params = model_and_params(2)
  params = jax.device_put(params)
  state = T5Decoder(model).init(params, jnp.asarray(INPUTS), MAX_LEN + 1)
  pointers = lambda tree: [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(tree)]
  assert pointers(state.params) == pointers(params)


def test_rollback_leaves_no_trace_in_later_logits():
  model, params = model_and_params(1)
  dec = T5Decoder(model)
  enc = jnp.asarray(INPUTS[:2])
  seq = jnp.array([[0, 5, 9, 3, 7, 2], [0, 4, 4, 8, 1, 6]], jnp.int32)
  step = jax.jit(dec.tokens_to_logits)
  clean = dec.init(params, enc, 12)
  ref, _ = step(clean, seq)  # [2, 6, V]
  state = dec.init(params, enc, 12)
  _, state = step(state, seq[:, :3])
  _, state = step(state, jnp.full((2, 4), 11, jnp.int32))  # speculative junk
  state = dec.rollback(state, jnp.array([3, 3]))
  later, state = step(state, seq[:, 3:])
  np.testing.assert_allclose(np.asarray(later), np.asarray(ref[:, 3:]), atol=1e-5)
  assert np.asarray(dec.index(state)).tolist() == [6, 6]


def test_sampling_matches_the_table_distribution():
  rng = np.random.RandomState(1)
  table = (rng.normal(size=(3, 5, 5)) * 1.5).astype(np.float32)
  config = SamplingConfig(temperature=0.8, top_p=0.9)
  n = 30_000
  dec = TableDecoder()
  result = autoregressive.decode(dec, dec.init(table, n, 4), jax.random.PRNGKey(0),
                                 max_decode_len=3, config=config, eos_id=99)
  seqs = np.asarray(result.sequences)
  probs = np.asarray(sampling.adjust_logits(jnp.asarray(table), config), np.float64)
  exact = np.zeros((5, 5, 5))
  for a, b, c in itertools.product(range(5), repeat=3):
    exact[a, b, c] = probs[0, 0, a] * probs[1, a, b] * probs[2, b, c]
  counts = np.zeros((5, 5, 5))
  np.add.at(counts, (seqs[:, 1], seqs[:, 2], seqs[:, 3]), 1)
  assert counts[exact == 0].sum() == 0
  big = exact.ravel() * n >= 5
  obs = np.append(counts.ravel()[big], counts.ravel()[~big].sum())
  exp = np.append(exact.ravel()[big], exact.ravel()[~big].sum()) / exact.sum() * n
  obs, exp = obs[exp > 0], exp[exp > 0]
  assert stats.chisquare(obs, exp).pvalue > 1e-3


def test_adjust_logits_top_k_top_p():
  logits = jnp.log(jnp.array([0.1, 0.4, 0.2, 0.3]))
  np.testing.assert_allclose(sampling.adjust_logits(logits, SamplingConfig(temperature=1.0, top_k=2)),
                             [0, 4 / 7, 0, 3 / 7], atol=1e-6)
  np.testing.assert_allclose(sampling.adjust_logits(logits, SamplingConfig(temperature=1.0, top_p=0.6)),
                             [0, 4 / 7, 0, 3 / 7], atol=1e-6)
  np.testing.assert_allclose(sampling.adjust_logits(logits, SamplingConfig(temperature=1.0, top_p=0.4)),
                             [0, 1, 0, 0], atol=1e-6)
  np.testing.assert_allclose(sampling.adjust_logits(logits, sampling.GREEDY), [0, 1, 0, 0])


def test_beam_search_finds_the_exhaustive_best():
  v, max_len, k = 4, 3, 16
  rng = np.random.RandomState(2)
  table = (rng.normal(size=(max_len, v, v)) * 2).astype(np.float32)
  lp = np.asarray(jax.nn.log_softmax(jnp.asarray(table)), np.float64)
  best, best_seq = -np.inf, None
  for n in range(1, max_len + 1):
    for toks in itertools.product(range(v), repeat=n):
      if 1 in toks[:-1] or toks[-1] != 1:
        continue  # finished sequences end at their first EOS
      prev, score = 0, 0.0
      for pos, t in enumerate(toks):
        score, prev = score + lp[pos, prev, t], t
      score /= float(brevity_penalty(0.6, n))
      if score > best:
        best, best_seq = score, list(toks)
  dec = TableDecoder()
  seqs, scores = beam_search(dec, dec.init(table, k, max_len + 1), beam_size=k,
                             max_decode_len=max_len)
  assert np.asarray(seqs)[0, 0, 1:1 + len(best_seq)].tolist() == best_seq
  assert float(scores[0, 0]) == pytest.approx(best, abs=1e-4)
  assert (np.diff(np.asarray(scores)[0]) <= 1e-6).all()


def test_beam_of_one_is_greedy_on_t5():
  model, params = model_and_params(4)
  dec = T5Decoder(model)
  enc = jnp.asarray(INPUTS)
  greedy = autoregressive.decode(dec, dec.init(params, enc, MAX_LEN + 1), jax.random.PRNGKey(0),
                                 max_decode_len=MAX_LEN)
  seqs, _ = beam_search(dec, dec.init(params, enc, MAX_LEN + 1), beam_size=1,
                        max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(np.asarray(seqs)[:, 0], np.asarray(greedy.sequences))
  seqs4, scores4 = beam_search(dec, dec.init(params, jnp.repeat(enc, 4, axis=0), MAX_LEN + 1),
                               beam_size=4, max_decode_len=MAX_LEN)
  assert np.asarray(seqs4).shape == (4, 4, MAX_LEN + 1)
  assert (np.diff(np.asarray(scores4), axis=1) <= 1e-5).all()


def test_t5x_temperature_sample_stand_in():
  model, params = model_and_params(2)
  enc = jnp.asarray(INPUTS)
  encoded = model.apply({'params': params}, enc, method=model.encode)
  cache = decode_cache.init_decode_cache(model, params, encoded, enc, MAX_LEN)

  def tokens_to_logits(state):
    logits, new_cache = decode_cache.decode_tokens(model, params, state.cache, state.cur_token)
    return logits[:, 0], new_cache

  decodes, scores = t5x_compat.temperature_sample(jnp.zeros((4, MAX_LEN), jnp.int32), cache,
                                                  tokens_to_logits, eos_id=1)
  dec = T5Decoder(model)
  greedy = autoregressive.decode(dec, dec.init(params, enc, MAX_LEN + 1), jax.random.PRNGKey(0),
                                 max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(np.asarray(decodes)[:, 0], np.asarray(greedy.sequences)[:, 1:])
  # t5x's default topk=1 with rescale_log_probs=True scores every greedy token log 1 = 0.
  np.testing.assert_allclose(np.asarray(scores), 0.0)
  raw_decodes, raw_scores = t5x_compat.temperature_sample(
      jnp.zeros((4, MAX_LEN), jnp.int32), cache, tokens_to_logits, eos_id=1,
      rescale_log_probs=False)
  np.testing.assert_array_equal(raw_decodes, decodes)
  assert np.asarray(raw_scores).shape == (4, 1) and (np.asarray(raw_scores) < 0).all()
  decodes, scores = t5x_compat.temperature_sample(
      jnp.zeros((4, MAX_LEN), jnp.int32), cache, tokens_to_logits, eos_id=1, num_decodes=3,
      decode_rng=jax.random.PRNGKey(1), temperature=1.0, topk=0)
  assert decodes.shape == (4, 3, MAX_LEN)
  assert (np.diff(np.asarray(scores), axis=1) >= 0).all()  # t5x order: ascending log-prob
  # t5x's beam search on the same cache (per-row cache index tiled with the beams) finds the same
  # best beam as gqa-spec's own beam search.
  beams, beam_scores = t5x_compat.beam_search(jnp.zeros((4, MAX_LEN), jnp.int32), cache,
                                              tokens_to_logits, eos_id=1, num_decodes=3)
  assert beams.shape == (4, 3, MAX_LEN) and (np.diff(np.asarray(beam_scores), axis=1) >= 0).all()
  own, _ = beam_search(dec, dec.init(params, jnp.repeat(enc, 3, axis=0), MAX_LEN + 1),
                       beam_size=3, max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(np.asarray(beams)[:, -1], np.asarray(own)[:, 0, 1:])
