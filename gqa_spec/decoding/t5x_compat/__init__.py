"""t5x's decoding functions (`t5x.decoding`'s signatures and semantics) over gqa-spec's loops.

  decodes, scores = t5x_compat.temperature_sample(inputs, cache, tokens_to_logits, eos_id, ...)
  beams, scores = t5x_compat.beam_search(inputs, cache, tokens_to_logits, eos_id, num_decodes=4)
  decode_fn = functools.partial(t5x_compat.speculative_sample, draft=..., draft_state=..., gamma=4)

What matches t5x and what does not: docs/t5x.md.
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
