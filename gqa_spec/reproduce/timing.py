"""Stage `timing`: time per sample vs the number of K/V groups (GQA Figure 6).

One job per setting times its models interleaved: every model is compiled and run once, then in
each of `timing_repeats` rounds every model decodes once, the order reversed every other round,
and a model's time is its median over the rounds. Timed one model after another instead (a job
per model), a tiny model's time depended on when it ran: in the smoke preset's long setting
fresh-clone runs gave MQA 5.5 and 13.6 ms per sample against MHA's 1.4 and 1.6, while interleaved
rounds of the same models give 1.00, 1.00 and 0.98 ms for 1, 2 and 4 groups.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Mapping

from gqa_spec.reproduce import jobs as jobs_lib
from gqa_spec.reproduce.jobs import Context
from gqa_spec.reproduce.presets import TRANSLATE, Preset


def decode_fn(config, params, inputs, max_decode_len: int) -> Callable[[], object]:
  """`run()`: encodes `inputs [b, S]` and greedily decodes exactly `max_decode_len` tokens (EOS
  disabled, so every model does the same work)."""
  import jax  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding import autoregressive  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.targets import T5Decoder, cache_length  # pylint: disable=g-import-not-at-top
  from gqa_spec.models import layout  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  config, params = layout.for_decoding(config, params)  # a scanned preset's models decode unrolled
  decoder = T5Decoder(Transformer(config))

  def run():
    state = decoder.init(params, inputs, cache_length(max_decode_len))
    return autoregressive.decode(decoder, state, jax.random.PRNGKey(0),
                                 max_decode_len=max_decode_len, eos_id=-1)

  return run


def interleaved_seconds(runs: Mapping[int, Callable[[], object]], rounds: int
                        ) -> Dict[int, List[float]]:
  """Seconds of each `runs[k]()` in every round, after one untimed (compiling) run of each: in a
  round every run once, in key order, reversed every other round."""
  import jax  # pylint: disable=g-import-not-at-top
  for run in runs.values():
    jax.block_until_ready(run())
  times: Dict[int, List[float]] = {k: [] for k in runs}
  for i in range(rounds):
    for k in (sorted(runs) if i % 2 == 0 else sorted(runs, reverse=True)):
      t0 = time.perf_counter()
      jax.block_until_ready(runs[k]())
      times[k].append(time.perf_counter() - t0)
  return times


def timing_settings(p: Preset) -> Dict[str, tuple]:
  """setting -> (config, (inputs, targets)) of the timing stage."""
  return {'short': (p.target, p.finetune_lengths[TRANSLATE]),
          'long': (p.long_timing_config, p.long_timing)}


def stage_timing(ctx: Context) -> dict:
  """GQA Figure 6: time per sample vs K/V groups (untrained weights: quality is irrelevant here).

  `short` uses the fine-tuning setting of the translation task with the target config; `long`
  uses long inputs and outputs, where the K/V cache, not the parameters, dominates the bytes read.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from gqa_spec.training.train_step import init_params  # pylint: disable=g-import-not-at-top
  p = ctx.preset

  def job(setting, base, inputs_len, targets_len):
    groups = [g for g in p.timing_groups if base.num_heads % g == 0]
    rng = np.random.default_rng(0)
    inputs = rng.integers(2, base.vocab_size, (p.timing_batch, inputs_len)).astype(np.int32)
    runs = {}
    for g in groups:
      config = base.replace(num_kv_heads=g)
      runs[g] = decode_fn(config, init_params(config, jax.random.PRNGKey(0)), inputs, targets_len)
    times = interleaved_seconds(runs, p.timing_repeats)
    return {'rows': [{'setting': setting, 'kv_heads': g, 'num_heads': base.num_heads,
                      'inputs': inputs_len, 'targets': targets_len, 'batch_size': p.timing_batch,
                      'time_per_sample_s': statistics.median(times[g]) / p.timing_batch,
                      'rounds_s': times[g]} for g in groups]}

  jobs = [(setting, lambda s=setting, b=base, i=inputs_len, t=targets_len: job(s, b, i, t))
          for setting, (base, (inputs_len, targets_len)) in timing_settings(p).items()]
  return {'rows': [row for record in jobs_lib.run_jobs(ctx, 'timing', jobs)
                   for row in record['rows']]}
