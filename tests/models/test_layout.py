"""Scanned vs unrolled layers (`T5Config.scan_layers`): one function, interchangeable parameters."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.decoding import autoregressive, beam_search, speculative, tree_speculative
from gqa_spec.decoding.drafts.chimera import ChimeraDraft
from gqa_spec.decoding.drafts.model import ModelDraft
from gqa_spec.decoding.drafts.model import StagedDraft
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.models import chimera
from gqa_spec.models import decode_cache as dc
from gqa_spec.models import layout
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

TINY = T5Config(vocab_size=64, emb_dim=16, num_heads=4, head_dim=4, mlp_dim=32,
                num_encoder_layers=2, num_decoder_layers=2)


def _pair(kv_heads: int):
  """Unrolled and scanned models with the same weights, and a padded batch."""
  rng = np.random.default_rng(kv_heads)
  enc = rng.integers(2, TINY.vocab_size, (3, 7))
  enc[1, 4:] = 0
  dec = rng.integers(2, TINY.vocab_size, (3, 6))
  dec[:, 0] = 0
  enc, dec = jnp.asarray(enc, jnp.int32), jnp.asarray(dec, jnp.int32)
  config = TINY.replace(num_kv_heads=kv_heads)
  unrolled = Transformer(config)
  params = unrolled.init(jax.random.PRNGKey(0), enc, dec, dec, enable_dropout=False)['params']
  scanned_config, scanned_params = layout.convert(config, params, scan_layers=True)
  return (unrolled, params), (Transformer(scanned_config), scanned_params), enc, dec


@pytest.mark.parametrize('kv_heads', [4, 1], ids=['mha', 'mqa'])  # the two ends of G
def test_scanned_and_unrolled_give_the_same_logits_and_greedy_tokens(kv_heads):
  (model, params), (smodel, sparams), enc, dec = _pair(kv_heads)
  # The conversion is the scanned model's own layout, and exact both ways.
  abstract = jax.eval_shape(lambda: smodel.init(jax.random.PRNGKey(0), enc, dec, dec))['params']
  assert jax.tree.map(jnp.shape, abstract) == jax.tree.map(jnp.shape, sparams)
  assert 'layers' in sparams['decoder'] and 'layers_0' not in sparams['decoder']
  assert sparams['decoder']['layers']['mlp']['wo']['kernel'].shape == (32, 2, 16)  # [mlp, L, emb]
  jax.tree.map(np.testing.assert_array_equal, layout.unstack_layers(sparams), params)

  forced = lambda m, p: m.apply({'params': p}, enc, dec, jnp.ones_like(dec), enable_dropout=False)
  np.testing.assert_allclose(forced(smodel, sparams), forced(model, params), rtol=1e-5, atol=1e-5)

  # Incremental decoding, a rollback and a tree-style slot move act alike on both caches.
  @functools.partial(jax.jit, static_argnums=0)
  def incremental(m, p):
    encoded = m.apply({'params': p}, enc, method=Transformer.encode)
    cache = dc.init_decode_cache(m, p, encoded, enc, 10)
    first, cache = dc.decode_tokens(m, p, cache, dec[:, :4])
    cache = dc.move_slots(dc.set_cache_index(cache, jnp.full((3,), 1)), jnp.full((3,), 1),
                          jnp.array([[3, 2]] * 3))
    cache = dc.set_cache_index(cache, jnp.full((3,), 3))
    second, cache = dc.decode_tokens(m, p, cache, dec[:, 4:])
    return first, second
  for got, want in zip(incremental(smodel, sparams), incremental(model, params)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  cache = jax.eval_shape(lambda: T5Decoder(smodel).init(sparams, enc, 9).cache)
  assert dc.self_attention_kv_bytes(cache) == 2 * 3 * kv_heads * 9 * 4 * 2 * 4  # L b G slots d K/V

  greedy = lambda m, p: autoregressive.decode(T5Decoder(m), T5Decoder(m).init(p, enc, 9),
                                              jax.random.PRNGKey(0), max_decode_len=8)
  np.testing.assert_array_equal(greedy(smodel, sparams).sequences,
                                greedy(model, params).sequences)


def test_every_decoding_loop_runs_on_scanned_models():
  """Beam search (cache reorder), chain and tree speculation (rollback, slot moves), staged
  speculation (a bigram second stage inside the draft) and a Chimera draft (which reads the
  target's hidden states) on scanned targets and drafts return what they return on the unrolled
  ones."""
  (model, params), (smodel, sparams), enc, _ = _pair(2)
  # The draft: the same architecture with other weights, one layer shallower.
  dconfig = TINY.replace(num_kv_heads=2, num_decoder_layers=1)
  dparams = Transformer(dconfig).init(jax.random.PRNGKey(1), enc, enc[:, :2], enc[:, :2])['params']
  ccfg = chimera.ChimeraConfig.for_target(TINY.replace(num_kv_heads=2), num_draft_heads=3,
                                          mlp_dim=16, trigram_dim=8)
  cparams = chimera.init_params(ccfg, TINY.replace(num_kv_heads=2), params, jax.random.PRNGKey(2))
  cparams['heads'] = cparams['heads'] + 0.5 * jax.random.normal(jax.random.PRNGKey(3),
                                                                cparams['heads'].shape)
  successor = np.random.RandomState(0).randint(2, TINY.vocab_size, size=TINY.vocab_size)
  key, shape = jax.random.PRNGKey(0), TreeShape.parse('topk:2,1')
  emb = params['token_embedder']['embedding']

  def run(scan):
    m, p = (smodel, sparams) if scan else (model, params)
    dc_, dp = layout.convert(dconfig, dparams, scan)
    target, draft = T5Decoder(m), ModelDraft.t5(Transformer(dc_))
    chain_state = lambda: target.init(p, enc, cache_length(8, 4))
    tree_state = lambda: target.init(p, enc, cache_length(8, shape.num_nodes + 1))
    beams, _ = beam_search.beam_search(target, target.init(p, jnp.repeat(enc, 2, axis=0), 9),
                                       beam_size=2, max_decode_len=8)
    chain = speculative.decode(target, chain_state(), draft, draft.init(dp, enc, 8, 3), key,
                               gamma=3, max_decode_len=8)
    staged = StagedDraft.t5(Transformer(dc_), inner_gamma=2)
    stage2 = speculative.decode(target, chain_state(), staged,
                                staged.init(dp, enc, 8, 3, successor), key, gamma=3,
                                max_decode_len=8)
    tdraft = TreeModelDraft(T5Decoder(Transformer(dc_)))
    tree = tree_speculative.decode(target, tree_state(), tdraft, tdraft.init(dp, enc, 8, shape),
                                   key, shape=shape, max_decode_len=8)
    cchain = speculative.decode(target, chain_state(), ChimeraDraft(ccfg),
                                ChimeraDraft(ccfg).init(cparams, emb, enc.shape[0], 8), key,
                                gamma=3, max_decode_len=8)
    return (beams, chain.sequences, stage2.sequences, tree.sequences, cchain.sequences,
            cchain.target_calls)

  for got, want in zip(run(True), run(False)):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize('scan', [False, True], ids=['unrolled', 'scanned'])
def test_remat_policies_keep_the_gradients_and_checkpoint_the_layers(scan):
  (_, params), _, enc, dec = _pair(2)
  params = layout.to_layout(params, scan)

  def grads(policy):
    model = Transformer(TINY.replace(num_kv_heads=2, scan_layers=scan, remat_policy=policy))
    loss = lambda p: jnp.sum(model.apply({'params': p}, enc, dec, dec, enable_dropout=False) ** 2)
    return jax.grad(loss), params

  # 'none' has no remat; the others wrap each layer (the scan body) in one checkpoint.
  counts = {p: str(jax.make_jaxpr(grads(p)[0])(params)).count('remat')
            for p in ('none', 'minimal', 'full')}
  assert counts['none'] == 0 and counts['minimal'] > 0 and counts['full'] > 0, counts
  want = jax.jit(grads('none')[0])(params)
  # Recomputation reorders float32 sums: gradients up to ~15 agree to ~1e-6 relative.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               jax.jit(grads('full')[0])(params), want)
