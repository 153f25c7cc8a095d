"""Drafts for speculative decoding, behind the `Draft` protocol of `base.py`."""

from gqa_spec.decoding.drafts.base import Draft
from gqa_spec.decoding.drafts.chimera import ChimeraDraft, ChimeraTreeDraft
from gqa_spec.decoding.drafts.copy import CopyDraft
from gqa_spec.decoding.drafts.factory import check_spec, make_draft
from gqa_spec.decoding.drafts.model import ModelDraft, StagedDraft
from gqa_spec.decoding.drafts.ngram import (NgramDraft, NgramModel, NgramTreeDraft, fit_ngram,
                                             load_ngram, save_ngram)
from gqa_spec.decoding.drafts.tree_model import TreeModelDraft

__all__ = ['Draft', 'ChimeraDraft', 'ChimeraTreeDraft', 'CopyDraft', 'ModelDraft', 'NgramDraft', 'NgramModel',
           'NgramTreeDraft', 'StagedDraft', 'TreeModelDraft', 'check_spec', 'fit_ngram',
           'load_ngram', 'make_draft', 'save_ngram']
