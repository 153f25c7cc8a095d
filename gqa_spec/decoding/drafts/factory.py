"""Drafts from a one-string spec, as `gqa-spec generate --draft` and `gqa-spec eval` take them.

  copy          prompt lookup over the encoder input (`CopyDraft`)
  unigram:PATH  an n-gram file from `gqa-spec ngram fit`, used as a unigram (`NgramDraft`)
  bigram:PATH   the same, as a bigram (the file must hold order-2 counts)
  CKPT_DIR      a native checkpoint of a smaller T5 with the target's vocabulary (`ModelDraft`)
  chimera:DIR   a `gqa-spec train-draft --kind chimera` run (`ChimeraDraft`); its token embedding
                is that of the target it was trained against (recorded in DIR/draft.json)
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Tuple

from gqa_spec.errors import UserError

PyTree = Any
SPECS = 'copy, unigram:PATH, bigram:PATH, chimera:RUN_DIR or a draft checkpoint directory'


def check_spec(spec: str, name: str = 'draft') -> None:
  """Raises a one-line `UserError` (naming the option `name`) unless `spec` is a draft spec."""
  if spec == 'copy' or spec.startswith(('unigram:', 'bigram:')) or os.path.isdir(spec):
    return
  if spec.startswith('chimera:'):
    directory = spec.split(':', 1)[1]
    if not os.path.isdir(directory):
      raise UserError(f'{name} {spec}: Chimera draft directory not found: {directory}')
    return
  raise UserError(f'{name} must be {SPECS}; {spec!r} is none of these')


def make_draft(spec: str, target_config, gamma: int, max_decode_len: int,
               mesh: Any = None, param_dtype: Optional[str] = None
               ) -> Tuple[Any, Callable[[Any], PyTree], str]:
  """Builds the draft a spec names.

  Args:
    spec: see the module docstring.
    target_config: the target's `T5Config`; the draft must share its vocabulary size.
    gamma: draft tokens per target call (sizes a model draft's cache).
    max_decode_len: most generated tokens per row (sizes a model draft's cache).
    mesh: a `jax.sharding.Mesh` to place a model draft on (`gqa_spec.decoding.mesh`); other
      drafts' states are small and replicated by the mesh loops.
    param_dtype: cast a model draft's floating parameters to it once, at load
      (`checkpoints.param_dtype`; None: as stored).

  Returns:
    `(draft, init, description)`: the static `Draft`, `init(encoder_input_tokens [b, S])` giving
    its initial state for a batch, and a human-readable description.

  Raises:
    UserError: a malformed spec, a missing file or checkpoint, or a vocabulary mismatch.
  """
  from gqa_spec.decoding.drafts.copy import CopyDraft  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.drafts.model import ModelDraft  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.drafts.ngram import NgramDraft, load_ngram  # pylint: disable=g-import-not-at-top
  check_spec(spec)
  vocab_size = target_config.vocab_size
  if spec == 'copy':
    draft = CopyDraft(vocab_size)
    return draft, draft.init, 'copy (prompt lookup over the encoder input)'
  if spec.startswith(('unigram:', 'bigram:')):
    kind, path = spec.split(':', 1)
    model = _ngram(path, vocab_size, 'a bigram draft') if kind == 'bigram' else load_ngram(
        path).for_model(vocab_size, path)
    model = type(model)(order=1 if kind == 'unigram' else 2, unigram=model.unigram,
                        bigram=model.bigram)
    draft = NgramDraft(vocab_size)
    table = draft.init(model)
    return draft, lambda enc: table, f'{kind} ({path})'
  if spec.startswith('chimera:'):
    return _chimera(spec.split(':', 1)[1], target_config, gamma, max_decode_len)
  decoder, params = _model_decoder(spec, target_config, mesh, param_dtype)
  draft = ModelDraft(decoder)
  return draft, lambda enc: draft.init(params, enc, max_decode_len, gamma), f'model ({spec})'


def _ngram(path: str, vocab_size: int, what: str):
  """The order-2 n-gram file at `path` over a model's `vocab_size` ids (`what` needs it)."""
  from gqa_spec.decoding.drafts.ngram import load_ngram  # pylint: disable=g-import-not-at-top
  model = load_ngram(path)
  if model.order < 2:
    raise UserError(f'{path} holds order-{model.order} counts; {what} needs order 2')
  return model.for_model(vocab_size, path)


def _model_decoder(spec: str, target_config, mesh: Any, param_dtype: Optional[str]):
  """`(decoder, params)` of the draft checkpoint `spec`: a `T5Decoder`, or with `mesh` a
  `mesh.MeshT5Decoder` by the draft config's own rules with its parameters placed (once, not per
  batch); floating parameters cast to `param_dtype` (None: as stored)."""
  from gqa_spec.checkpoints import load, param_dtype as dtype_lib  # pylint: disable=g-import-not-at-top  (slow imports)
  from gqa_spec.decoding.targets import T5Decoder  # pylint: disable=g-import-not-at-top
  from gqa_spec.models import layout  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  config, params, _ = load.load_model(spec)  # or a run directory
  if config.vocab_size != target_config.vocab_size:
    raise UserError(f'draft vocabulary {config.vocab_size} != target vocabulary '
                    f'{target_config.vocab_size}')
  config, params = dtype_lib.cast(config, params, param_dtype)
  config, params = layout.for_decoding(config, params)
  if mesh is None:
    return T5Decoder(Transformer(config)), params
  from gqa_spec.decoding import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  decoder = mesh_lib.draft_decoder(config, mesh)
  return decoder, mesh_lib.place_params(decoder.partitioner, params)


def _chimera(run_dir: str, target_config, gamma: int, max_decode_len: int, tree: bool = False):
  """A Chimera chain draft (gamma tokens) or, with `tree`, tree proposer of depth `gamma`."""
  from gqa_spec.decoding.drafts.chimera import ChimeraDraft, ChimeraTreeDraft  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import drafts as draft_records  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints.load import load_any  # pylint: disable=g-import-not-at-top
  config, params, target_path = draft_records.load_chimera(run_dir)
  try:
    config.check_target(target_config)
  except ValueError as e:
    raise UserError(f'{run_dir}: {e}') from None
  if not os.path.exists(target_path):
    raise UserError(f'{run_dir}: the target it was trained against ({target_path}) is gone; its '
                    'token embedding is part of the draft')
  embedding = load_any(target_path)[1]['token_embedder']['embedding']  # [V, D]
  draft = ChimeraTreeDraft(config) if tree else ChimeraDraft(config)
  if not 1 <= gamma <= config.num_draft_heads:
    raise UserError(f'{"tree depth" if tree else "gamma"} {gamma}: the Chimera draft has '
                    f'{config.num_draft_heads} heads')
  return (draft, lambda enc: draft.init(params, embedding, enc.shape[0], max_decode_len),
          f'chimera ({run_dir}, {config.num_draft_heads} heads)')


def make_tree_draft(spec: str, target_config, shape, max_decode_len: int, mesh: Any = None,
                    param_dtype: Optional[str] = None
                    ) -> Tuple[Any, Callable[[Any], PyTree], str]:
  """Builds the tree draft a spec names (`make_draft`'s contract; `shape` a `tree.TreeShape`).

  Model drafts (a checkpoint directory), `bigram:PATH` (top-k successors, deterministic) and
  `chimera:DIR` (head d's top-k at depth d; depth <= its heads) grow trees; other specs raise
  `UserError`. `mesh` and `param_dtype` apply to a model draft, as in `make_draft`.
  """
  from gqa_spec.decoding.drafts.tree_model import TreeModelDraft  # pylint: disable=g-import-not-at-top
  check_spec(spec)
  if spec.startswith('chimera:'):
    draft, init, description = _chimera(spec.split(':', 1)[1], target_config, shape.depth,
                                         max_decode_len, tree=True)
    return draft, init, f'{description}, tree {shape.describe()}'
  if spec.startswith('bigram:'):
    from gqa_spec.decoding.drafts.ngram import NgramTreeDraft  # pylint: disable=g-import-not-at-top
    path = spec.split(':', 1)[1]
    model = _ngram(path, target_config.vocab_size, 'a bigram tree draft')
    draft = NgramTreeDraft(target_config.vocab_size)
    state = draft.init(model, shape)
    return draft, lambda enc: state, f'bigram tree ({path}, {shape.describe()})'
  if not os.path.isdir(spec):
    raise UserError(f'token trees need a model draft (a checkpoint directory), bigram:PATH or '
                    f'chimera:DIR; {spec!r} is none of these')
  decoder, params = _model_decoder(spec, target_config, mesh, param_dtype)
  draft = TreeModelDraft(decoder)
  return (draft, lambda enc: draft.init(params, enc, max_decode_len, shape),
          f'model tree ({spec}, {shape.describe()})')


def make_staged_draft(spec: str, stage2: str, target_config, gamma: int, inner_gamma: int,
                      max_decode_len: int, shape=None, mesh: Any = None,
                      param_dtype: Optional[str] = None
                      ) -> Tuple[Any, Callable[[Any], PyTree], str]:
  """A model draft (checkpoint `spec`) whose generation a bigram (`stage2` = `bigram:PATH`)
  speculates, `inner_gamma` bigram tokens per draft call (`make_draft`'s contract): a chain
  `StagedDraft` of gamma tokens or, with `shape` (a `tree.TreeShape`), a `TreeModelDraft` growing
  that tree with `inner_gamma` chain tokens after each expanded node. `mesh` and `param_dtype` as
  in `make_draft`."""
  from gqa_spec.decoding.drafts.model import StagedDraft  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.drafts.tree_model import TreeModelDraft  # pylint: disable=g-import-not-at-top
  check_spec(spec)
  if not os.path.isdir(spec):
    raise UserError(f'a second stage needs a model draft (a checkpoint directory); {spec!r} is not '
                    'one')
  if not stage2.startswith('bigram:'):
    raise UserError(f'--stage2 must be bigram:PATH, got {stage2!r}')
  path = stage2.split(':', 1)[1]
  ngram = _ngram(path, target_config.vocab_size, 'the second stage')
  decoder, params = _model_decoder(spec, target_config, mesh, param_dtype)
  successor = ngram.successor()
  if shape is not None:
    tree = TreeModelDraft(decoder, inner_gamma)
    return (tree, lambda enc: tree.init(params, enc, max_decode_len, shape, successor),
            f'staged tree (model {spec} <- bigram {path}, {shape.describe()}, {inner_gamma} chain '
            'tokens per expanded node)')
  draft = StagedDraft(decoder, inner_gamma)
  return (draft, lambda enc: draft.init(params, enc, max_decode_len, gamma, successor),
          f'staged (model {spec} <- bigram {path}, {inner_gamma} per draft call)')
