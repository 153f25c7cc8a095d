"""t5x-compatible decoding: `t5x.decoding`'s functions with its signatures and semantics.

  from gqa_spec.decoding import t5x_compat
  decodes, scores = t5x_compat.temperature_sample(inputs, cache, tokens_to_logits, eos_id, ...)
  beams, scores = t5x_compat.beam_search(inputs, cache, tokens_to_logits, eos_id, num_decodes=4)
  decode_fn = functools.partial(t5x_compat.speculative_sample, draft=..., draft_state=...,
                                gamma=4)  # a t5x DecodeFnCallable on gqa-spec's speculative loop

Both take t5x's `tokens_to_logits(DecodingState) -> ([rows, V], cache)` and a t5x-style cache
mapping; both return t5x's shapes in t5x's ascending score order. `sampling.py` and `beam.py` say
what is the same as t5x and the few places that are not; `speculative.py` what the speculative
decode_fn needs and does not support.
"""

from gqa_spec.decoding.t5x_compat.beam import BeamState, beam_search
from gqa_spec.decoding.t5x_compat.common import (MIN_TEMPERATURE, NEG_INF, DecodingState,
                                                 TokensIdsToLogitsCallable, cache_map)
from gqa_spec.decoding.t5x_compat.sampling import (LogitCallbackFn, SamplingLoopState,
                                                   StateCallbackFn, temperature_sample)
from gqa_spec.decoding.t5x_compat.speculative import CallableDecoder, speculative_sample

__all__ = ['BeamState', 'CallableDecoder', 'DecodingState', 'LogitCallbackFn', 'MIN_TEMPERATURE',
           'NEG_INF', 'SamplingLoopState', 'StateCallbackFn', 'TokensIdsToLogitsCallable',
           'beam_search', 'cache_map', 'speculative_sample', 'temperature_sample']
