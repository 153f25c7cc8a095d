"""Stage `timing`: time per sample vs the number of K/V groups (GQA Figure 6)."""

from __future__ import annotations

from typing import Dict

from gqa_spec.reproduce import jobs as jobs_lib
from gqa_spec.reproduce.jobs import Context
from gqa_spec.reproduce.presets import TRANSLATE, Preset

def time_per_sample(config, params, inputs, max_decode_len: int, repeats: int) -> float:
  """Median seconds per sample of encoding `inputs [b, S]` and greedily decoding exactly
  `max_decode_len` tokens (EOS disabled, so every model does the same work), after compilation."""
  import jax  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding import autoregressive, speedup  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.targets import T5Decoder  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  decoder = T5Decoder(Transformer(config))

  def run():
    state = decoder.init(params, inputs, max_decode_len + 1)
    return autoregressive.decode(decoder, state, jax.random.PRNGKey(0),
                                 max_decode_len=max_decode_len, eos_id=-1)

  return float(speedup.median_time(run, repeats)) / inputs.shape[0]


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
  settings = timing_settings(p)
  jobs = []
  for setting, (base, (inputs_len, targets_len)) in settings.items():
    for g in p.timing_groups:
      if base.num_heads % g:
        continue
      def job(setting=setting, base=base, g=g, inputs_len=inputs_len, targets_len=targets_len):
        config = base.replace(num_kv_heads=g)
        params = init_params(config, jax.random.PRNGKey(0))
        rng = np.random.default_rng(0)
        inputs = rng.integers(2, config.vocab_size, (p.timing_batch, inputs_len)).astype(np.int32)
        seconds = time_per_sample(config, params, inputs, targets_len, p.timing_repeats)
        return {'setting': setting, 'kv_heads': g, 'num_heads': config.num_heads,
                'inputs': inputs_len, 'targets': targets_len, 'batch_size': p.timing_batch,
                'time_per_sample_s': seconds}
      jobs.append((f'{setting}.g{g}', job))
  return {'rows': jobs_lib.run_jobs(ctx, 'timing', jobs)}
