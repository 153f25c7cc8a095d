"""`gqa-spec generate --stats`: a run's statistics, summed over its batches."""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

import numpy as np

from gqa_spec.decoding.speculative import adaptive_summary, tree_nodes_summary


def summarize(results: Sequence[Tuple[Any, int]], speculative_run: bool, seconds: float,
              compile_seconds: float) -> Dict[str, Any]:
  """The statistics of `(result, real rows)` of every batch of a run: tokens, calls, time, and for a
  speculative run acceptance and what the draft did (an adaptive run's lengths or node counts)."""
  tokens = sum(int(np.sum(np.asarray(r.lengths)[:n])) for r, n in results)
  calls = sum(int(np.sum(np.asarray(r.target_calls)[:n])) for r, n in results)
  out = {'tokens': tokens, 'seconds': seconds, 'compile_seconds': compile_seconds,
         'tokens_per_second': tokens / seconds if seconds else None, 'target_calls': calls,
         'mean_tokens_per_call': tokens / calls if calls else 0.0,
         'mean_tokens_per_call_note': 'tokens / target calls; with a draft the corrected or bonus '
                                      'token is counted',
         'acceptance_rate': None, 'accepted_per_position': []}
  if not speculative_run:
    return out
  proposed = accepted = 0
  per_position = histogram = None
  beta_sum = beta_count = 0.0
  draft_calls = None
  for r, n in results:
    if r.draft_calls is not None:  # batched draft decode calls (staged drafts count them)
      draft_calls = (draft_calls or 0) + int(r.draft_calls)
    # Dummy rows of the last batch start done: the loop leaves them out of every count.
    proposed += int(np.sum(np.asarray(r.proposed)[:n]))
    accepted += int(np.sum(np.asarray(r.accepted)[:n]))
    pp = np.asarray(r.accepted_per_position)
    per_position = pp if per_position is None else per_position + pp
    h = np.asarray(r.accept_histogram)
    histogram = h if histogram is None else histogram + h
    beta_sum += float(r.beta_sum)
    beta_count += float(r.beta_count)
  if results[0][0].gamma_histogram is not None:  # --gamma auto
    parts = [adaptive_summary(r, n) for r, n in results]
    out.update({key: [x for p in parts for x in p[key]] for key in (
        'gamma_histogram_per_row', 'gamma_per_call_per_row')})
    out.update(gamma_histogram=[int(x) for x in np.sum([p['gamma_histogram'] for p in parts], 0)],
               draft_steps=sum(p['draft_steps'] for p in parts),
               draft_steps_saved=sum(p['draft_steps_saved'] for p in parts),
               draft_steps_note=parts[0]['draft_steps_note'])
  if results[0][0].tree_nodes_histogram is not None:  # --tree best:auto
    parts = [tree_nodes_summary(r, n) for r, n in results]
    out.update({key: [x for p in parts for x in p[key]] for key in (
        'tree_nodes_histogram_per_row', 'tree_nodes_per_call_per_row',
        'tree_nodes_verified_histogram_per_row', 'tree_nodes_verified_per_call_per_row')})
    out.update(tree_nodes_histogram=[int(x) for x in np.sum(
        [p['tree_nodes_histogram'] for p in parts], 0)], tree_nodes_note=parts[0]['tree_nodes_note'])
  out.update(acceptance_rate=accepted / proposed if proposed else None,
             accepted_per_position=[int(x) for x in per_position],
             accept_histogram=[int(x) for x in histogram],
             proposed=proposed, accepted=accepted,
             alpha=beta_sum / beta_count if beta_count else None, draft_calls=draft_calls)
  return out
