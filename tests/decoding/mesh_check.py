"""Decoding on 8 virtual CPU devices vs one device; run by `test_mesh.py` in a subprocess.

XLA's device count is fixed when jax initialises, hence the separate process. Prints one
`REPORT <json>` line: per (config, mesh) the PartitionSpecs found and whether each loop's tokens
equal the single-device ones. `--full` runs every loop on every (config, mesh) pair; the default
plan runs greedy autoregressive on all pairs and each other loop on a diagonal that still covers
every config and every mesh. Token trees and staged speculation (a model tree draft with a
bigram second stage; a chain `StagedDraft`) run on MHA over 2x4 and 1x8.

Compiles are the time (~70, about 0.7 s each with tracing on 2 CPU cores; running the loops is
noise), and each init is one of its own (an encoder pass and the cache). So every loop on one
(config, placement) starts from one shared target state, its cache long enough for every loop
(`TARGET_SLOTS`), and every draft (chain, staged, tree) wraps one shared draft decoder state
(`DRAFT_SLOTS`; `init_state` as the drafts' own `init` does, with the longest of their
`cache_slots`), made once per mesh and once on one device: the draft is the same model for every
config. Only beam search, with its `BATCH * BEAMS` rows, has its own. That is 24 inits where one
per loop took 41. Slots past a loop's need are masked and change no token; the reference and the
mesh run share the lengths anyway.
"""

import json
import re
import sys

import jax
import numpy as np

from gqa_spec.decoding import autoregressive, beam_search, mesh, sampling, speculative
from gqa_spec.decoding import tree_speculative
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.drafts.model import StagedDraft
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft
from gqa_spec.decoding.tree import TreeShape
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.models import layout
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer
from gqa_spec import partitioning
from gqa_spec.training.train_step import init_params

BASE = T5Config(vocab_size=128, emb_dim=32, num_heads=8, head_dim=4, mlp_dim=64,
                num_encoder_layers=1, num_decoder_layers=1)
DRAFT = T5Config(vocab_size=128, emb_dim=16, num_heads=4, head_dim=4, mlp_dim=32,
                 num_encoder_layers=1, num_decoder_layers=1, num_kv_heads=1)
# name -> (K/V heads, init seed: one whose rows end at different steps)
KV_HEADS = {'mha': (8, 8), 'gqa2': (2, 7), 'mqa': (1, 1)}
MESHES = ((2, 4), (1, 8), (8, 1), (4, 2))
MAX_LEN, GAMMA, BEAMS, BATCH = 8, 3, 2, 8
SKIP = np.arange(BATCH) >= 6  # two padding rows
SAMPLE = sampling.SamplingConfig(temperature=1.0)
SHAPE, G2 = TreeShape.topk(2, 2), 2  # token tree; second-stage (bigram) tokens per draft call
SUCCESSOR = np.random.RandomState(1).randint(2, 128, size=128)  # a stand-in bigram's successors
TARGET_SLOTS = max(MAX_LEN + 1, cache_length(MAX_LEN, GAMMA + 1),
                   cache_length(MAX_LEN, SHAPE.num_nodes + 1))
DRAFT_SLOTS = max(MAX_LEN + GAMMA + 2,  # `ModelDraft.init`'s
                  StagedDraft(None, G2).cache_slots(MAX_LEN, GAMMA),
                  TreeModelDraft(None, G2).cache_slots(MAX_LEN, SHAPE))


def make_params(config, seed):
  params = jax.device_get(init_params(config, jax.random.PRNGKey(seed)))
  # Make EOS (id 1) a likely token, so rows end at different steps (a ragged batch).
  kernel = np.array(params['decoder']['logits_dense']['kernel'])
  kernel[:, 1] *= 2.0
  params['decoder']['logits_dense']['kernel'] = kernel
  return params


def collectives(decoder, state):
  """`[(op, elements of its result)]` of the compiled greedy loop's cross-device collectives."""
  key = next(k for k in mesh._JITTED if k[0] is autoregressive.decode and k[1] == decoder)  # pylint: disable=protected-access
  skip = jax.device_put(SKIP, decoder.partitioner.rows_sharding(BATCH))
  _COUNTING[0] = False  # this lowering traces the loop again
  text = mesh._JITTED[key].lower(state, None, jax.random.PRNGKey(3), skip).compile().as_text()  # pylint: disable=protected-access
  _COUNTING[0] = True
  found = re.findall(r'= \w+\[([\d,]*)\][^=]*? (all-gather|all-reduce|all-to-all|collective-permute)'
                     r'(?:-start)?\(', text)
  total = re.findall(r' (all-gather|all-reduce|all-to-all|collective-permute)(?:-start)?\(', text)
  assert len(found) == len(total), (found, total)  # every collective's size was read
  return [(op, int(np.prod([int(d) for d in dims.split(',') if d]))) for dims, op in found]


def spec(x):
  return [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]


# The loops by placement: (autoregressive, beam, chain speculative, tree speculative).
SINGLE = (autoregressive.decode, beam_search.beam_search, speculative.decode,
          tree_speculative.decode)
MESH = (mesh.autoregressive, mesh.beam, mesh.speculative, mesh.tree_speculative)


def run(loop, loops, decoder, state, draft_decoder, draft_state):
  """One loop's results on either placement (`loops`: `SINGLE` or `MESH`), each from the shared
  states: the target's (beam: its own, `BATCH * BEAMS` rows) and the draft decoder's, which the
  chain, staged and tree drafts all wrap."""
  autoregressive_loop, beam_loop, chain_loop, tree_loop = loops
  rng = jax.random.PRNGKey(3)
  if loop in ('greedy', 'sample'):
    out = autoregressive_loop(decoder, state, rng, max_decode_len=MAX_LEN,
                              config=SAMPLE if loop == 'sample' else sampling.GREEDY,
                              skip=SKIP if loop == 'greedy' else None)
    return out.sequences, out.lengths
  if loop == 'beam':
    return beam_loop(decoder, state, beam_size=BEAMS, max_decode_len=MAX_LEN)[0], None
  if loop == 'speculative':
    out = chain_loop(decoder, state, ModelDraft(draft_decoder), draft_state, rng, gamma=GAMMA,
                     max_decode_len=MAX_LEN, skip=SKIP)
    return out.sequences, (out.lengths, out.accepted, out.target_calls)
  if loop == 'tree':  # a staged tree draft
    draft = TreeModelDraft(draft_decoder, G2)
    out = tree_loop(decoder, state, draft, draft.init_state(draft_state, SHAPE, SUCCESSOR), rng,
                    shape=SHAPE, max_decode_len=MAX_LEN, skip=SKIP)
  else:  # a staged chain draft
    draft = StagedDraft(draft_decoder, G2)
    out = chain_loop(decoder, state, draft, draft.init_state(draft_state, SUCCESSOR), rng,
                     gamma=GAMMA, max_decode_len=MAX_LEN, skip=SKIP)
  return out.sequences, (out.lengths, out.accepted, out.target_calls, out.draft_calls)


def scanned(enc, beam_enc, refs, draft):
  """MHA with its layers scanned (`T5Config.scan_layers`: parameters and cache stacked on a
  `layers` axis) on 2x4: every loop gives the unrolled model's single-device results (`refs`),
  and the layer axis is never sharded."""
  config, params = layout.convert(BASE, make_params(BASE, KV_HEADS['mha'][1]), scan_layers=True)
  model = Transformer(config)
  decoder = mesh.MeshT5Decoder(model, partitioning.Partitioner.create(config, 2, 4))
  state = decoder.init(params, enc, TARGET_SLOTS)
  entry = {}
  for loop in ('greedy', 'beam', 'speculative', 'tree', 'staged'):
    loop_state = decoder.init(params, beam_enc, MAX_LEN + 1) if loop == 'beam' else state
    got = jax.device_get(run(loop, MESH, decoder, loop_state, *draft))
    entry[loop] = all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda a, b: bool(np.array_equal(a, b)), got, refs[loop])))
  layer = state.cache['decoder']['layers']
  entry['self_kv_spec'] = spec(layer['self_attention']['cached_key'])
  entry['kv_kernel_spec'] = spec(
      state.params['decoder']['layers']['self_attention']['key']['kernel'])
  entry['self_kv_shape'] = list(layer['self_attention']['cached_key'].shape)
  return {'mha_scanned/2x4': entry}


_TRACES = {'ar': 0, 'draft_loop': 0}
_COUNTING = [True]


def count_traces():
  """Counts the traces of the mesh's greedy and draft loops (`_TRACES`, while `_COUNTING`), to
  compare with the functions compiled (`mesh._JITTED`): one trace each."""

  call = mesh._call  # pylint: disable=protected-access

  def traced(decode, *args, **kwargs):
    _TRACES['ar' if decode is autoregressive.decode else 'draft_loop'] += _COUNTING[0]
    return call(decode, *args, **kwargs)

  mesh._call = traced  # pylint: disable=protected-access


def traces_and_compiled():
  keys = list(mesh._JITTED)  # pylint: disable=protected-access
  compiled = {'ar': sum(k[0] is autoregressive.decode for k in keys),
              'draft_loop': sum(k[0] in (speculative.decode, tree_speculative.decode) for k in keys)}
  return {'traces': dict(_TRACES), 'compiled': compiled}


def main():
  full = '--full' in sys.argv
  assert jax.device_count() == 8, jax.devices()
  enc = np.random.RandomState(0).randint(2, 128, size=(BATCH, 10)).astype(np.int32)
  enc[::2, 7:] = 0  # ragged inputs
  beam_enc = np.repeat(enc, BEAMS, 0)
  draft_params = make_params(DRAFT, 0)
  single_draft = T5Decoder(Transformer(DRAFT))
  single_draft_state = single_draft.init(draft_params, enc, DRAFT_SLOTS)
  mesh_drafts = {}  # (data, model) -> (draft decoder, state): the draft's placement is the mesh's
  report = {}
  count_traces()
  refs_of = {}  # config name -> its single-device results by loop
  for c, (name, (g, seed)) in enumerate(KV_HEADS.items()):
    config = BASE.replace(num_kv_heads=g)
    params = make_params(config, seed)
    model = Transformer(config)
    single = T5Decoder(model)
    single_states = {}  # 'target' / 'beam' -> the reference's shared states
    refs = {}
    for m, (data, model_size) in enumerate(MESHES):
      if name != 'gqa2' and (data, model_size) == (4, 2):
        continue  # 4x2 is there to shard GQA-2's two K/V heads
      part = partitioning.Partitioner.create(config, data, model_size)
      decoder = mesh.MeshT5Decoder(model, part)
      loops = ['greedy']
      if full or m == c:
        loops += ['beam', 'speculative', 'sample']
      if name == 'gqa2' and (data, model_size) == (4, 2):
        loops += ['speculative']
      if name == 'mha' and (data, model_size) in ((2, 4), (1, 8)):
        loops += ['tree', 'staged']
      if {'speculative', 'tree', 'staged'} & set(loops) and (data, model_size) not in mesh_drafts:
        draft_part = partitioning.Partitioner(part.mesh,
                                              partitioning.logical_axis_rules(DRAFT, model_size))
        draft_decoder = mesh.MeshT5Decoder(Transformer(DRAFT), draft_part)  # its own placement
        mesh_drafts[data, model_size] = (draft_decoder,
                                         draft_decoder.init(draft_params, enc, DRAFT_SLOTS))
      draft_decoder, draft_state = mesh_drafts.get((data, model_size), (None, None))
      state = decoder.init(params, enc, TARGET_SLOTS)
      entry = report[f'{name}/{data}x{model_size}'] = {}
      # A state of placed parameters holds those buffers, not a copy of them.
      again = decoder.init(state.params, enc, TARGET_SLOTS)
      entry['params_shared'] = all(
          [s.data.unsafe_buffer_pointer() for s in a.addressable_shards]
          == [s.data.unsafe_buffer_pointer() for s in b.addressable_shards]
          for a, b in zip(jax.tree_util.tree_leaves(state.params),
                          jax.tree_util.tree_leaves(again.params)))
      for loop in loops:
        kind = 'beam' if loop == 'beam' else 'target'
        if loop not in refs:
          if kind not in single_states:
            single_states[kind] = single.init(params, beam_enc if kind == 'beam' else enc,
                                              MAX_LEN + 1 if kind == 'beam' else TARGET_SLOTS)
          refs[loop] = jax.device_get(run(loop, SINGLE, single, single_states[kind], single_draft,
                                          single_draft_state))
        loop_state = decoder.init(params, beam_enc, MAX_LEN + 1) if loop == 'beam' else state
        got = run(loop, MESH, decoder, loop_state, draft_decoder, draft_state)
        if loop in ('greedy', 'sample'):
          entry['sequences_spec'] = spec(got[0])
          if loop == 'greedy' and (name, data, model_size) == ('mha', 2, 4):
            entry['collectives'] = collectives(decoder, state)
        elif loop in ('tree', 'staged'):
          entry[f'{loop}_draft_calls'] = int(got[1][3])
        elif loop == 'speculative':
          entry['draft_kv_spec'] = spec(
              draft_state.cache['decoder']['layers_0']['self_attention']['cached_key'])
          entry['lengths'] = [int(x) for x in np.asarray(got[1][0])]
        got = jax.device_get(got)
        entry[loop] = all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
            lambda a, b: bool(np.array_equal(a, b)), got, refs[loop])))
      layer = state.cache['decoder']['layers_0']
      entry['self_kv_spec'] = spec(layer['self_attention']['cached_key'])
      entry['cross_kv_spec'] = spec(layer['encoder_decoder_attention']['cached_value'])
      entry['index_spec'] = spec(state.cache['decoder']['cache_index'])
      entry['kv_kernel_spec'] = spec(
          state.params['decoder']['layers_0']['self_attention']['key']['kernel'])
      entry['query_kernel_spec'] = spec(
          state.params['decoder']['layers_0']['self_attention']['query']['kernel'])
    report[f'{name}/greedy_lengths'] = [int(x) for x in refs['greedy'][1]]
    refs_of[name] = refs
  report.update(scanned(enc, beam_enc, refs_of['mha'], mesh_drafts[2, 4]))
  report.update(traces_and_compiled())
  print('REPORT ' + json.dumps(report))


if __name__ == '__main__':
  main()
