"""The reproduction's `speculative` stage: chains, token trees, staged and trained drafts.

Jobs (each skipped once finished):
  <task>.<target>        Leviathan Tables 2-3 at CPU scale, for the fine-tuned MHA and GQA targets:
                         the fine-tuned draft model, a bigram fitted on the task's training targets
                         and copy (prompt lookup) drafts over temperatures and gammas: alpha,
                         tokens per call, c(gamma), measured speedup, Theorem 8 (`rows`); and
                         the draft model with `--gamma auto` (gamma_max = the largest of
                         `gammas`, c and v by `calibration.measure_costs`: `auto_rows`).
  <task>.<mha>.drafts    Spector & Re and Chimera beside plain speculation, for the MHA target the
                         `drafts` stage trained against, all in one job on the same batches
                         (speedups relative to the job's own autoregressive timing):
                           chains (`drafts_rows`): the fine-tuned draft ('draft model', plain
                             speculation), the distilled draft, Chimera (heads 1..gamma) and staged
                             (the fine-tuned draft speculated by the task's bigram,
                             `stage2_gamma` tokens per draft call), over `draft_gammas` and
                             temperatures;
                           trees (`tree_rows`): the fine-tuned draft growing each of
                             `tree_shapes`, the staged tree (the fine-tuned draft growing
                             `topk:k_1,1,...,1`, the first of `tree_shapes` with single children
                             below depth 1 (depth >= 3), with `stage2_gamma` bigram tokens fed after each
                             expanded node, skipping a level when the bigram guessed all of its
                             nodes: only single-child levels can be), and Chimera as a tree
                             proposer (`chimera_tree`, top-k per head);
                         each with parameter bytes read per generated token (Spector Table 1's
                         form: a decode call reads its model's parameters once per batch; K/V not
                         counted; the staged chain's draft calls vary, not counted; the staged
                         tree's are counted, `draft_calls`) and, at
                         temperature 0, whether the output equals greedy autoregressive decoding.
The drafts job's measurement (`measure_drafts`) also measures the `premise` stage's pair
(`premise.py`), at each of its batch sizes and with `--gamma auto` rows.
A time-boxed preset narrows this (`Preset.chain_drafts`, `speculative_tasks`, `speculative_gqa`)
and without `trained_drafts` runs no drafts job: the MHA chain job then also grows `tree_shapes`
with the fine-tuned draft (`tree_rows`), against its own autoregressive runs.
Presets with `fast_compile_decoding` (smoke) compile the stage's loops with XLA's fast-compile
options (`gqa_spec.decoding.xla_options`): their times are of unoptimised code.
"""

from __future__ import annotations

from typing import Optional

import jax

from gqa_spec.decoding.tree import TreeShape
from gqa_spec.reproduce import jobs as jobs_lib


def _test_inputs(task: str, lengths, n: int):
  """`[n, inputs]` the first n test inputs of `task` (a seqio or an `exported:` name)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  feature_lengths = {'inputs': lengths[0], 'targets': lengths[1]}
  from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
  if exported.is_exported(task):
    (source,), _ = exported.resolve(task)
    _, batch = next(exported.eval_batches(source, 'test', feature_lengths, n, n))
    return batch['encoder_input_tokens'].astype(np.int32)  # [n, inputs]
  from gqa_spec.data import batches  # pylint: disable=g-import-not-at-top
  ds = batches.get_dataset(task, 'test', feature_lengths, pack=False)
  rows = [ex['encoder_input_tokens'] for ex in ds.take(n).as_numpy_iterator()]
  return np.stack(rows).astype(np.int32)  # [n, inputs]


def input_batches(ctx, task: str, lengths, examples=None, batch=None):
  """`[batch, inputs]` batches of the first `examples` test inputs (default the preset's
  `speculative_examples` and `speculative_batch`)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  examples, batch = examples or p.speculative_examples, batch or p.speculative_batch
  inputs = _test_inputs(ctx.task(task), lengths, examples)
  return [jnp.asarray(inputs[i:i + batch]) for i in range(0, len(inputs), batch)]


def param_bytes(params) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))


def weights_per_step(config, params) -> int:
  """Parameter bytes a decode step reads: the decoder's (its logits kernel included) and, where
  the logits use the embedding, the embedding table; the encoder is not read while decoding."""
  tied = param_bytes(params['token_embedder']) if config.logits_via_embedding else 0
  return param_bytes(params['decoder']) + tied


def _without_outputs(grid: dict) -> dict:
  return {t: {k: v for k, v in a.items() if k != 'outputs'}
          for t, a in grid['autoregressive'].items()}


def _load(path: str):
  """`(config, params, step)` of a checkpoint in the layout decoding runs in (unrolled)."""
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  from gqa_spec.models import layout  # pylint: disable=g-import-not-at-top
  config, params, step = native.load_checkpoint(path)
  return (*layout.for_decoding(config, params), step)


def _chain_job(ctx, task: str, lengths, target_name: str, finetuned: dict, memo) -> dict:
  from gqa_spec.reproduce import speed_grid  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.drafts import CopyDraft, ModelDraft, NgramDraft, TreeModelDraft  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.drafts.ngram import fit_ngram_on_task  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.targets import T5Decoder  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  config, params, _ = _load(finetuned[(task, target_name)])
  dconfig, dparams, _ = _load(finetuned[(task, 'draft')])
  max_len = lengths[1]
  model_draft = ModelDraft.t5(Transformer(dconfig))
  ngram = NgramDraft(config.vocab_size)
  table = (ngram.init(memo(('ngram', task, p.ngram_order),
                           lambda: fit_ngram_on_task(ctx.task(task), p.ngram_order)))
           if 'bigram' in p.chain_drafts else None)
  drafts = {
      'draft model': (model_draft, lambda enc: model_draft.init(dparams, enc, max_len, max(p.gammas))),
      'bigram': (ngram, lambda enc: table),
      'copy': (CopyDraft(config.vocab_size), lambda enc: enc),
  }
  drafts = {name: drafts[name] for name in p.chain_drafts}
  target = T5Decoder(Transformer(config))
  batches = memo(('batches', task), lambda: input_batches(ctx, task, lengths))
  grid = speed_grid.measure_grid(target, params, drafts, batches,
                              max_decode_len=max_len, gammas=p.gammas,
                              temperatures=p.temperatures, repeats=p.speculative_repeats,
                              workers=p.workers,
                              auto_drafts=tuple(d for d in ('draft model',) if d in drafts))
  rows = [dict(r, task=task, target=target_name) for r in grid['rows']]
  out = {'task': task, 'target': target_name, 'rows': rows,
         'auto_rows': [dict(r, task=task, target=target_name) for r in grid['auto_rows']],
         'target_step_seconds': grid['target_step_seconds'],
         'autoregressive': _without_outputs(grid)}
  if not p.trained_drafts and target_name == p.variants()[0].name:
    # No drafts job (`Preset.trained_drafts`): the MHA target's trees with the fine-tuned draft
    # here, on the same batches and against the same autoregressive runs.
    tree_model = TreeModelDraft.t5(Transformer(dconfig))
    trees = {f'draft model tree {s}': (tree_model, TreeShape.parse(s),
                                       lambda enc, s=s: tree_model.init(dparams, enc, max_len,
                                                                        TreeShape.parse(s)))
             for s in p.tree_shapes}
    tree_rows = speed_grid.measure_trees(target, params, trees, batches, max_decode_len=max_len,
                                      autoregressive_runs=grid['autoregressive'],
                                      repeats=p.speculative_repeats, workers=p.workers)
    t_bytes, d_bytes = param_bytes(params), param_bytes(dparams)
    out['tree_rows'] = [  # the draft model runs once per level, root included
        _bytes_per_token(dict(r, task=task, target=target_name), t_bytes, d_bytes,
                         r['depth'] if r['draft_calls'] is None
                         else r['draft_calls'] / r['loop_iterations']) for r in tree_rows]
  return out


def _bytes_per_token(row: dict, target_bytes: int, draft_bytes: int,
                     draft_calls_per_iteration: Optional[int]) -> dict:
  draft = (None if draft_calls_per_iteration is None else
           draft_bytes * draft_calls_per_iteration * row['loop_iterations'] / row['tokens'])
  return dict(row, target_bytes_per_token=target_bytes * row['loop_iterations'] / row['tokens'],
              draft_bytes_per_token=draft)


def _drafts_job(ctx, task: str, lengths, target_name: str, finetuned: dict,
                trained: dict, memo) -> dict:
  """Plain, distilled, Chimera and staged chains and the trees, side by side (module docstring)."""
  p = ctx.preset
  paths = {'target': finetuned[(task, target_name)], 'draft model': finetuned[(task, 'draft')],
           'distilled': ctx.path(trained[(task, 'distilled')]['checkpoint']),
           'chimera': ctx.path(trained[(task, 'chimera')]['run_dir'])}
  batches = memo(('batches', task), lambda: input_batches(ctx, task, lengths))
  successor = memo(('ngram', task, 2), lambda: fit_bigram(ctx, task)).successor()
  return measure_drafts(ctx, task, lengths[1], target_name, paths, batches, successor,
                        repeats=p.speculative_repeats)


def fit_bigram(ctx, task: str):
  """The bigram of `task`'s training targets (`NgramDraft`'s table) the staged drafts use."""
  from gqa_spec.decoding.drafts.ngram import fit_ngram_on_task  # pylint: disable=g-import-not-at-top
  return fit_ngram_on_task(ctx.task(task), 2)


def measure_drafts(ctx, task: str, max_len: int, target_name: str, paths: dict, batches,
                   successor, *, repeats: int, auto_drafts=()) -> dict:
  """The drafts job's measurements on `batches` (`[b, S]` encoder inputs, one b): chains of the
  'draft model', 'distilled', 'chimera' and staged drafts over the preset's `draft_gammas` and
  temperatures, the trees, and `--gamma auto` for `auto_drafts` (`auto_rows`).

  Args:
    paths: 'target', 'draft model', 'distilled' (checkpoints) and 'chimera' (its run directory).
    successor: `[V]` the task's bigram successor of each token (the staged drafts' second stage).
  """
  from gqa_spec.reproduce import speed_grid  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding import drafts as d  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.targets import T5Decoder  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import drafts as draft_records  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.chimera import trigram_table  # pylint: disable=g-import-not-at-top
  p = ctx.preset
  L, gmax = max_len, max(p.gammas)
  config, params, _ = _load(paths['target'])
  dconfig, dparams, _ = _load(paths['draft model'])
  kconfig, kparams, _ = _load(paths['distilled'])
  cconfig, cparams, _ = draft_records.load_chimera(paths['chimera'])
  emb = params['token_embedder']['embedding']  # [V, D] the frozen target's, Chimera's input
  table = jax.jit(trigram_table)(cparams, emb)  # [3, V, F] once, outside the timed decoding
  plain, distilled = d.ModelDraft.t5(Transformer(dconfig)), d.ModelDraft.t5(Transformer(kconfig))
  staged, chimera = d.StagedDraft.t5(Transformer(dconfig), p.stage2_gamma), d.ChimeraDraft(cconfig)
  chains = {
      'draft model': (plain, lambda enc: plain.init(dparams, enc, L, gmax)),
      'distilled': (distilled, lambda enc: distilled.init(kparams, enc, L, gmax)),
      'chimera': (chimera, lambda enc: chimera.init(cparams, emb, enc.shape[0], L, table)),
      f'staged (bigram {p.stage2_gamma}/call)': (
          staged, lambda enc: staged.init(dparams, enc, L, gmax, successor)),
  }
  tree_model = d.TreeModelDraft.t5(Transformer(dconfig))
  chimera_tree = d.ChimeraTreeDraft(cconfig)
  trees = {f'draft model tree {s}': (tree_model, TreeShape.parse(s),
                                     lambda enc, s=s: tree_model.init(dparams, enc, L,
                                                                      TreeShape.parse(s)))
           for s in p.tree_shapes}
  staged_shape = TreeShape.parse(staged_tree_spec(p))
  staged_tree = d.TreeModelDraft.t5(Transformer(dconfig), p.stage2_gamma)
  trees[staged_tree_name(p)] = (
      staged_tree, staged_shape,
      lambda enc: staged_tree.init(dparams, enc, L, staged_shape, successor))
  trees[f'chimera tree {p.chimera_tree}'] = (
      chimera_tree, TreeShape.parse(p.chimera_tree),
      lambda enc: chimera_tree.init(cparams, emb, enc.shape[0], L, table))
  target = T5Decoder(Transformer(config))
  grid = speed_grid.measure_grid(target, params, chains, batches, max_decode_len=L,
                              gammas=p.draft_gammas, temperatures=p.temperatures,
                              repeats=repeats, workers=p.workers, auto_drafts=auto_drafts)
  tree_rows = speed_grid.measure_trees(target, params, trees, batches, max_decode_len=L,
                                    autoregressive_runs=grid['autoregressive'],
                                    repeats=repeats, workers=p.workers)
  t_bytes = param_bytes(params)
  draft_bytes = {'draft model': param_bytes(dparams), 'distilled': param_bytes(kparams),
                 'chimera': param_bytes(cparams)}
  rows = []
  for r in grid['rows']:
    calls = {'draft model': r['gamma'], 'distilled': r['gamma'], 'chimera': 1}.get(r['draft'])
    rows.append(_bytes_per_token(dict(r, task=task, target=target_name), t_bytes,
                                 draft_bytes.get(r['draft'], 0), calls))
  out_trees = []
  for r in tree_rows:  # the draft model runs once per level (root included), Chimera once; the
    # staged tree's calls are counted (`draft_calls`, batched: per loop iteration on average)
    is_chimera = r['draft'].startswith('chimera')
    calls = (1 if is_chimera else r['depth'] if r['draft_calls'] is None
             else r['draft_calls'] / r['loop_iterations'])
    out_trees.append(_bytes_per_token(
        dict(r, task=task, target=target_name), t_bytes,
        draft_bytes['chimera' if is_chimera else 'draft model'], calls))
  ar, b = {}, batches[0].shape[0]
  for temp, a in grid['autoregressive'].items():
    steps = sum(max(min(len(o) + 1, L) for o in a['outputs'][i:i + b])
                for i in range(0, len(a['outputs']), b))  # longest row per batch
    ar[temp] = dict({k: v for k, v in a.items() if k != 'outputs'},
                    target_bytes_per_token=t_bytes * steps / a['tokens'])
  out = {'task': task, 'target': target_name, 'drafts_rows': rows, 'tree_rows': out_trees,
         'autoregressive': ar,
         'target_step_seconds': grid['target_step_seconds'],
         'param_bytes': dict(draft_bytes, target=t_bytes,
                             target_weights_per_step=weights_per_step(config, params))}
  if auto_drafts:
    out['auto_rows'] = [dict(r, task=task, target=target_name) for r in grid['auto_rows']]
  return out


def staged_tree_spec(preset) -> str:
  """`topk:k_1,1,...,1`: k_1 and the depth of the preset's first tree (`tree_shapes[0]`), depth
  at least 3 (level 1 is always fed, so a depth-2 tree has no level to skip)."""
  first = TreeShape.parse(preset.tree_shapes[0])
  return TreeShape.topk(first.branching[0], *(1,) * (max(first.depth, 3) - 1)).describe()


def staged_tree_name(preset) -> str:
  """The staged tree row's name (`tree_rows`)."""
  return f'staged draft model tree {staged_tree_spec(preset)} (bigram {preset.stage2_gamma}/node)'


def stage_speculative(ctx) -> dict:
  """Chains for the MHA and GQA targets; trees, staged and trained drafts for MHA (module docstring)."""

  jobs_lib.register_tasks(ctx)
  p = ctx.preset
  finetuned = {(r['task'], r['name']): ctx.path(r['best_checkpoint'])
               for r in ctx.read_stage('finetune')['rows']}
  trained = ({(r['task'], r['draft']): r for r in ctx.read_stage('drafts')['rows']}
             if p.trained_drafts else {})
  mha = p.variants()[0].name
  fitted = {}  # what the jobs of a task share: its bigram, its test batches (read once)

  def memo(key, build):
    if key not in fitted:
      fitted[key] = build()
    return fitted[key]

  jobs = []
  for task, lengths in p.speculative_task_lengths().items():
    for target_name in p.speculative_targets():
      jobs.append((f'{task}.{target_name}', lambda t=task, l=lengths, n=target_name:
                   _chain_job(ctx, t, l, n, finetuned, memo)))
    if p.trained_drafts:
      jobs.append((f'{task}.{mha}.drafts', lambda t=task, l=lengths:
                   _drafts_job(ctx, t, l, mha, finetuned, trained, memo)))
  from gqa_spec.decoding import xla_options  # pylint: disable=g-import-not-at-top
  with xla_options.fast_compile(p.fast_compile_decoding):
    records = jobs_lib.run_jobs(ctx, 'speculative', jobs)
  chain = [r for r in records if 'rows' in r]
  extra = [r for r in records if 'drafts_rows' in r]
  return {'rows': [r for rec in chain for r in rec['rows']],
          'auto_rows': [r for rec in chain for r in rec.get('auto_rows', ())],
          'drafts_rows': [r for rec in extra for r in rec['drafts_rows']],
          'tree_rows': [r for rec in records for r in rec.get('tree_rows', [])],
          'jobs': records, 'batch_size': p.speculative_batch,
          'examples': p.speculative_examples}

