"""Sizes of the reproduction: `smoke` (pipeline check, minutes), `cpu` (the real CPU-scale study)
and `gpu` (the study as one device call of at most 6 minutes on one H100).

One frozen dataclass holds every knob, so a run's `results/<preset>/preset.json` records exactly
what was run. The study design follows the papers:
  GQA (Ainslie et al. 2023): MHA target -> MQA and GQA-G by mean / first / random conversion,
    uptrained for alpha in {0, 0.05, 0.10} of the pre-training steps, fine-tuned (constant lr,
    dropout 0.1, best validation checkpoint; the paper's lr is 1e-3, see `finetune_learning_rate`), evaluated with greedy decoding; time per sample.
    Two deviations a preset may choose for budget (`pretrain_task`, `finetune_multitask`): T5's
    multi-task pre-training mixture in place of span corruption, and one fine-tuning job per
    model on translate + summarize in place of one per task.
  Speculative decoding (Leviathan et al. 2023): a small draft (nano) and trivial drafts (bigram,
    copy) for the fine-tuned MHA and GQA targets at temperature 0 and 1 over a gamma grid.
  Staged speculation (Spector & Re 2023): token trees and a draft speculated by a bigram;
  Chimera (2024) and sequence-level distillation: drafts trained against the frozen MHA target.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

from gqa_spec.data import vocab_fit
from gqa_spec.errors import UserError
from gqa_spec.models.config import T5Config, preset as model_preset

TRANSLATE = 'ddtp_translate_en_de'
SUMMARIZE = 'ddtp_summarize'
PRETRAIN = 'ddtp_span_corruption'
PRETRAIN_MIXTURE = 'ddtp_mixture'  # span corruption + translate + summarize, example-proportional
PRETRAIN_TASKS = (PRETRAIN, PRETRAIN_MIXTURE)
MULTITASK = 'ddtp_translate_summarize'  # translate + summarize 1:1 (`finetune_multitask`)
TASK_METRIC = {TRANSLATE: 'bleu', SUMMARIZE: 'rouge1'}  # the metric each task is judged by
CHAIN_DRAFTS = ('draft model', 'bigram', 'copy')  # the speculative stage's chain drafts


@dataclasses.dataclass(frozen=True)
class Variant:
  """One converted target: `kv_heads` groups by `method`, uptrained for `alpha` of pre-training."""

  kv_heads: int
  method: Optional[str] = None  # None: the unconverted MHA target
  alpha: float = 0.0

  @property
  def name(self) -> str:
    if self.method is None:
      return f'mha_g{self.kv_heads}'
    return f'g{self.kv_heads}_{self.method}_a{self.alpha:g}'


@dataclasses.dataclass(frozen=True)
class PremisePair:
  """The `premise` stage's speculative pair: a target trained by the study whose batch-1 greedy
  step is bound by reading its weights, and the preset's draft architecture distilled against it
  (c far below the main target's). `target` is pre-trained on the preset's `pretrain_task` at
  `pretrain_lengths` (rsqrt schedule: `pretrain_peak_lr` after `warmup_steps`) and fine-tuned on
  `task` alone at its `finetune_lengths` (the preset's constant lr, best validation checkpoint);
  the distilled and Chimera drafts train `draft_steps` at `draft_batch` against it (the preset's
  draft lrs; the distilled one starts from the study's fine-tuned draft). Its speculative rows
  decode the first `examples` test inputs of `task` at each of `batches`, `repeats` timed runs."""

  target: T5Config
  pretrain_steps: int
  pretrain_batch: int
  warmup_steps: int
  pretrain_peak_lr: float
  finetune_steps: int
  finetune_batch: int
  draft_steps: int
  draft_batch: int
  batches: Tuple[int, ...] = (1, 8)
  examples: int = 16
  repeats: int = 2
  task: str = TRANSLATE


# Numeric preset fields where 0 means something (no uptraining, greedy decoding); every other
# number is a size, a count of steps or a rate, and must be positive.
_MAY_BE_ZERO = ('alphas', 'method_ablation_alpha', 'temperatures')


@dataclasses.dataclass(frozen=True)
class Preset:
  """Every size and grid of one reproduction."""

  name: str
  use_sample_corpus: bool  # the DDTP excerpt shipped with the package (offline, seconds)
  vocab_pieces: int
  target: T5Config
  draft: T5Config
  pretrain_steps: int
  pretrain_batch: int
  pretrain_lengths: Tuple[int, int]
  warmup_steps: int
  kv_heads: Tuple[int, ...]  # converted variants' groups (MHA is always included)
  alphas: Tuple[float, ...]
  method_ablation_alpha: float  # first / random conversions are run at this alpha ...
  method_ablation_kv_heads: int  # ... and this many groups (the paper: MQA)
  finetune_steps: int
  # Constant fine-tuning lr. The GQA paper's 1e-3 is for thousands of steps at batch 128; in the
  # cpu preset's 150 steps at batch 16 it left the mini target at train loss 6.6 and test BLEU 0.03
  # (measured); `cpu` takes its rate from `gqa-spec calibrate` (see `_cpu`).
  finetune_learning_rate: float
  finetune_batch: int
  finetune_lengths: Dict[str, Tuple[int, int]]
  eval_period: int
  validation_examples: int
  test_examples: int
  eval_batch: int
  timing_repeats: int  # rounds of the timing stage: every model once a round, interleaved
  timing_batch: int
  timing_groups: Tuple[int, ...]  # Figure 6's x axis
  long_timing: Tuple[int, int]  # (inputs, targets) of the long-input timing setting
  long_timing_config: T5Config
  speculative_examples: int
  speculative_batch: int
  gammas: Tuple[int, ...]
  temperatures: Tuple[float, ...]
  speculative_repeats: int
  # The `drafts` stage: per task, a Chimera draft (max(gammas) heads) and a distilled model draft
  # (the preset's draft architecture, started from the fine-tuned draft) trained against the frozen
  # fine-tuned MHA target on its greedy outputs for the task's training inputs (Adam, constant lr).
  chimera_steps: int
  chimera_batch: int
  chimera_learning_rate: float
  distill_steps: int
  distill_batch: int
  distill_learning_rate: float
  # Rows the speculative stage adds for the MHA target: token trees with the fine-tuned draft,
  # Chimera as a tree proposer (depth <= max(gammas)), staged (draft <- bigram, stage2_gamma bigram
  # tokens per draft call), Chimera and distilled chains.
  draft_gammas: Tuple[int, ...]  # gammas of those chain rows (each <= max(gammas), the heads)
  tree_shapes: Tuple[str, ...]  # `TreeShape.parse` specs: a top-k and a best-first tree
  chimera_tree: str
  stage2_gamma: int
  ngram_order: int = 2
  # Peak of the rsqrt pre-training schedule (`peak * sqrt(warmup) / sqrt(max(step, warmup))`);
  # None: T5's 1 / sqrt(warmup_steps). Uptraining continues the target's schedule.
  pretrain_peak_lr: Optional[float] = None
  draft_pretrain_peak_lr: Optional[float] = None  # None: the target's schedule
  draft_finetune_learning_rate: Optional[float] = None  # None: finetune_learning_rate
  # The study design. `pretrain_task`: the task of the target's and the draft's pre-training and of
  # every variant's uptraining (the GQA paper uptrains with the pre-training recipe), at
  # `pretrain_lengths`: span corruption (the paper's), or T5's multi-task pre-training mixture
  # (Raffel et al. 2020, sec. 3.5.3), which teaches the tasks while pre-training so that a short
  # fine-tuning suffices.
  pretrain_task: str = PRETRAIN
  # False: one fine-tuning job per model per task (the paper's). True: one job per model on
  # MULTITASK at (max inputs, max targets) over `finetune_lengths`, the best checkpoint chosen by
  # the mean of the tasks' validation metrics; each task is still evaluated at its own lengths.
  finetune_multitask: bool = False
  # The Chimera drafts' labels (`train-draft`'s LABEL_SOURCE): 'data', the dataset's target tokens
  # (the Chimera paper's Eq. 4), or 'target', the frozen target's greedy outputs (the distilled
  # draft's labels; the cpu study's committed run used these).
  chimera_label_source: str = 'data'
  # The speculative stage's decoding loops compiled with XLA's fast-compile options
  # (`decoding.xla_options.FAST_COMPILE`: LLVM optimisation off). Its ~40 compiles per job are
  # then ~3x cheaper and its loops ~2x slower, so its times and speedups are of unoptimised code;
  # tokens, acceptance and calls do not change. For the smoke preset, whose loops run 3 times each.
  fast_compile_decoding: bool = False
  # Threads for work that times nothing: training jobs side by side (pretrain, uptrain, finetune,
  # drafts; `jobs.run_jobs`) and the speculative stage's first, compiling runs of its loops
  # (`timing.first_runs`). A tiny model's step keeps about one core busy and XLA compiles outside
  # Python's lock, so on 2 cores two of either run at once (results/benchmarks/side_by_side.md).
  # Timed work (evaluate, timing, the speculative stage's timed runs) always runs alone. A training
  # job's `wall_seconds` then counts time shared with another job. 1 for models whose steps use
  # every core.
  workers: int = 1
  # Evaluate jobs side by side. 1 (the default): each job's time per sample is measured alone. On a
  # GPU host with many cores one job compiles on the host while another decodes on the device, so
  # the stage takes about the longest compile instead of their sum; a time per sample may then
  # include another job's decoding (GQA Figure 6 comes from the `timing` stage, always alone).
  eval_workers: int = 1
  # What a time-boxed study leaves out (the gpu preset's 6-minute device call). False:
  # `method_ablation` no first / random conversions (GQA Figure 4); `trained_drafts` no `drafts`
  # stage (Chimera, distilled), and the speculative stage then grows `tree_shapes` with the
  # fine-tuned draft inside the MHA chain job, on its batches and baselines; `speculative_gqa` no
  # chains for the GQA target. `chain_drafts`: the chain jobs' drafts, of 'draft model', 'bigram'
  # and 'copy'; `speculative_tasks`: the tasks it decodes (empty: every fine-tuning task).
  method_ablation: bool = True
  trained_drafts: bool = True
  speculative_gqa: bool = True
  chain_drafts: Tuple[str, ...] = CHAIN_DRAFTS
  speculative_tasks: Tuple[str, ...] = ()
  # The `premise` stage's pair (`PremisePair`); None: the preset has none, and the stage records so.
  premise: Optional[PremisePair] = None

  def __post_init__(self):
    for field in dataclasses.fields(self):  # sizes, steps, rates: positive (`_MAY_BE_ZERO`: >= 0)
      value = getattr(self, field.name)
      values = value if isinstance(value, tuple) else (value,)
      low = 0 if field.name in _MAY_BE_ZERO else None
      bad = [x for x in values if isinstance(x, (int, float)) and not isinstance(x, bool)
             and (x < 0 or (low is None and x == 0) or x != x)]
      if bad:
        raise UserError(f'preset field {field.name} must be {">=" if low == 0 else ">"} 0, got '
                        f'{bad[0]}')
    for role in ('target', 'draft'):  # up front, not when a stage meets the task
      vocab_fit.check({f'ddtp ({self.vocab_pieces} pieces + {vocab_fit.EXTRA_IDS} extra ids)':
                       self.vocab_pieces + vocab_fit.EXTRA_IDS},
                      getattr(self, role).vocab_size, f"the preset's {role}")
    if self.pretrain_task not in PRETRAIN_TASKS:
      raise UserError(f'pretrain_task {self.pretrain_task!r} is not one of '
                      f'{", ".join(PRETRAIN_TASKS)}')
    if self.chimera_label_source not in ('data', 'target'):
      raise UserError(f'chimera_label_source {self.chimera_label_source!r} is not data or target')
    if self.chimera_steps != self.distill_steps:
      raise UserError(f'chimera_steps {self.chimera_steps} != distill_steps {self.distill_steps}: '
                      'the study compares drafts trained equally long')
    unknown = [d for d in self.chain_drafts if d not in CHAIN_DRAFTS]
    if unknown or not self.chain_drafts:
      raise UserError(f'chain_drafts {self.chain_drafts!r}: expected some of '
                      f'{", ".join(CHAIN_DRAFTS)}')
    unknown = [t for t in self.speculative_tasks if t not in self.finetune_lengths]
    if unknown:
      raise UserError(f'speculative_tasks {unknown} are not fine-tuning tasks '
                      f'({", ".join(self.finetune_lengths)})')
    for name in ('method_ablation', 'trained_drafts', 'speculative_gqa'):
      if not isinstance(getattr(self, name), bool):
        raise UserError(f'{name} must be true or false, got {getattr(self, name)!r}')
    for name in ('workers', 'eval_workers'):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f'{name} must be a positive integer, got {value!r}')
    if not isinstance(self.fast_compile_decoding, bool):
      raise UserError(f'fast_compile_decoding must be true or false, got '
                      f'{self.fast_compile_decoding!r}')
    if not isinstance(self.finetune_multitask, bool):
      raise UserError(f'finetune_multitask must be true or false, got {self.finetune_multitask!r}')
    if self.finetune_multitask and set(self.finetune_lengths) != {TRANSLATE, SUMMARIZE}:
      raise UserError(f'finetune_multitask fine-tunes on {MULTITASK} ({TRANSLATE} + {SUMMARIZE}); '
                      f'finetune_lengths has {sorted(self.finetune_lengths)}')

    if self.premise is not None:
      self._check_premise()

  def _check_premise(self) -> None:
    pair = self.premise
    for field in dataclasses.fields(pair):
      values = getattr(pair, field.name)
      values = values if isinstance(values, tuple) else (values,)
      if any(isinstance(x, (int, float)) and not isinstance(x, bool) and not x > 0 for x in values):
        raise UserError(f'premise.{field.name} must be > 0, got {getattr(pair, field.name)}')
    if pair.target.vocab_size != self.draft.vocab_size:
      raise UserError(f'premise.target.vocab_size {pair.target.vocab_size} != the draft\'s '
                      f'{self.draft.vocab_size}: the pair speculates with the study\'s draft')
    if pair.task not in self.finetune_lengths:
      raise UserError(f'premise.task {pair.task!r} is not a fine-tuning task')
    if not pair.batches or any(pair.examples % b for b in pair.batches):
      raise UserError(f'premise.batches {pair.batches} must divide premise.examples '
                      f'{pair.examples}')

  def design(self) -> Dict[str, object]:
    """The study design, as stage records state it."""
    return {'pretrain_task': self.pretrain_task,
            'finetune': f'multi-task ({MULTITASK})' if self.finetune_multitask else 'per task',
            'finetune_lengths': ({MULTITASK: list(self.multitask_lengths())}
                                 if self.finetune_multitask else
                                 {t: list(l) for t, l in self.finetune_lengths.items()})}

  def multitask_lengths(self) -> Tuple[int, int]:
    """(inputs, targets) of multi-task fine-tuning: the longest of each over `finetune_lengths`."""
    lengths = self.finetune_lengths.values()
    return max(i for i, _ in lengths), max(t for _, t in lengths)

  def pretrain_schedule(self, role: str = 'target') -> Tuple[float, int]:
    """`(base, warmup_steps)` of `optimizer.rsqrt_decay` for the target's or the draft's pre-training."""
    peak = self.draft_pretrain_peak_lr if role == 'draft' else None
    peak = peak if peak is not None else self.pretrain_peak_lr
    if peak is None:
      return 1.0, self.warmup_steps
    return peak * math.sqrt(self.warmup_steps), self.warmup_steps

  def finetune_lr(self, role: str = 'target') -> float:
    """The constant fine-tuning lr of the target (every variant) or the draft."""
    if role == 'draft' and self.draft_finetune_learning_rate is not None:
      return self.draft_finetune_learning_rate
    return self.finetune_learning_rate

  def variants(self) -> Tuple[Variant, ...]:
    """MHA, then every (groups, alpha) with mean pooling, then the first/random ablations."""
    heads = self.target.num_heads
    out = [Variant(heads)]
    for g in self.kv_heads:
      for a in self.alphas:
        out.append(Variant(g, 'mean', a))
    for method in ('first', 'random') if self.method_ablation else ():
      out.append(Variant(self.method_ablation_kv_heads, method, self.method_ablation_alpha))
    return tuple(out)

  def speculative_targets(self) -> Tuple[str, ...]:
    """The fine-tuned MHA target and the GQA variant with the most uptraining (mean pooling);
    MHA alone without `speculative_gqa` or GQA variants."""
    gqa = [v for v in self.variants() if v.method == 'mean' and 1 < v.kv_heads]
    if not self.speculative_gqa or not gqa:
      return (self.variants()[0].name,)
    best = max(gqa, key=lambda v: (v.alpha, v.kv_heads))
    return (self.variants()[0].name, best.name)

  def speculative_task_lengths(self) -> Dict[str, Tuple[int, int]]:
    """task -> (inputs, targets) of the tasks the speculative stage decodes."""
    return {t: l for t, l in self.finetune_lengths.items()
            if not self.speculative_tasks or t in self.speculative_tasks}


def _smoke() -> Preset:
  """A pipeline check that learns: the tiny models fit the packaged excerpt well enough for
  non-zero test scores and a draft that agrees with its target (tests/reproduce/test_pipeline.py
  asserts both), sized for about 5 minutes of stages on 2 quiet cores (measured times and where
  they go: docs/reproduce.md, "The smoke preset").
  Rates and steps from short measured runs of the MHA target on translation (train loss after 150
  fine-tuning steps at batch 16: 1.69 at lr 0.05, 1.87 at 0.1, 2.04 at 0.03; after 100 steps at
  0.05: 2.25, test BLEU ~0; after 300: 1.31, test BLEU 2.1; pre-training loss 3.0 after 500 steps
  at rsqrt peak 0.1, 2.9 after 800, no better at twice the width). The 39 summaries overfit within
  50 steps (best validation ROUGE-1 at step 50 of 100): the best of the validation checkpoints
  every 60 steps is kept.
  """
  vocab = 512  # 300 pieces + 100 sentinels, padded to a multiple of 128
  target = T5Config(vocab_size=vocab, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                    num_encoder_layers=2, num_decoder_layers=2)
  draft = target.replace(num_encoder_layers=1, num_decoder_layers=1)
  return Preset(
      name='smoke', use_sample_corpus=True, vocab_pieces=300, target=target, draft=draft,
      pretrain_steps=500, pretrain_batch=16, pretrain_lengths=(64, 16), warmup_steps=100,
      # MQA and one GQA variant (every quality claim needs both) and one set of lengths for both
      # tasks: every training job then reuses a handful of compiled steps (the persistent XLA
      # cache), which is most of smoke's time. The conversion ablation on MQA, as the paper's.
      kv_heads=(1, 2), alphas=(0.0, 0.1), method_ablation_alpha=0.1, method_ablation_kv_heads=1,
      finetune_steps=300, finetune_batch=16, finetune_learning_rate=0.05,
      finetune_lengths={TRANSLATE: (64, 32), SUMMARIZE: (64, 32)}, eval_period=60,
      validation_examples=16, test_examples=32, eval_batch=16, timing_repeats=7, timing_batch=6,
      timing_groups=(1, 2, 4), long_timing=(256, 32),
      long_timing_config=target.replace(num_decoder_layers=1, num_encoder_layers=1),
      # Batch 1, the papers' setting: claims 5c-6b need batch-1 rows.
      speculative_examples=4, speculative_batch=1, gammas=(1, 3), temperatures=(0.0, 1.0),
      speculative_repeats=2,
      # A few steps: the stage's jobs, resume and the rows are checked, not the drafts' quality.
      # One gamma for the trained/staged chains: each (draft, gamma, temperature) is a compile.
      chimera_steps=3, chimera_batch=4, chimera_learning_rate=1e-3, distill_steps=3,
      distill_batch=4, distill_learning_rate=1e-3, draft_gammas=(3,),
      tree_shapes=('topk:2,2', 'best:4,depth:3'),
      chimera_tree='topk:2,1,1', stage2_gamma=2, fast_compile_decoding=True, workers=2)


def _cpu() -> Preset:
  """Sizing from `results/cpu/calibration.{json,md,png}` (`gqa-spec calibrate --preset cpu
  --work-dir /work/runs/cpu`; one seed, validation loss on 4 batches, BLEU / ROUGE-1 on 32
  validation examples; run on a 2-core machine shared with other jobs, so read CPU seconds).

  Design (the study's budget decides it): T5's multi-task pre-training (`ddtp_mixture`: span
  corruption + translate + summarize, example-proportional) for the target, the draft and every
  uptraining, then one short multi-task fine-tuning per model (`finetune_multitask`). The measured
  curves behind it:
    multi-task pre-training of `mini` (peak lr 0.015, warm-up 500, batch 16, 128/64): validation
      translate loss 5.99 / 5.54 / 5.20 / 4.98 at steps 250 / 500 / 750 / 1000, BLEU 1.4 -> 2.6,
      ROUGE-1 6-11; still falling ~0.2 per 250 steps, so pre-training steps buy the quality.
    the target's size at equal training time (the same schedule): `micro` (mini at half width, 8
      heads, 4 + 4 layers) takes 0.4-0.47x mini's step time, and at every CPU time measured its
      validation loss is lower: 5.29 vs 5.56 at ~1700 CPU s, 4.92 vs 5.14 at ~3500 (translate
      4.65 vs 4.98, BLEU 3.4 vs 2.6). With ~6M tokens mini is far too large for its data; the
      target is `micro`.
    multi-task fine-tuning from that point (mini; lr 0.01, batch 16): BLEU 3.9 / 3.7 / 3.4 / 3.0
      and ROUGE-1 11.4 / 11.3 / 11.8 / 10.6 at steps 50 / 100 / 150 / 200, translate loss 4.98 ->
      4.90: it adds a little early and then nothing -> 100 steps, best of the evaluations every 50.
    the per-task span-corruption sweeps chose the peak rates: target 0.015 (of 0.005-0.13 at 100
      steps, mini), draft 0.045 (of 0.015-0.4 at 200 steps); draft fine-tuning 0.03 (of 0.01-0.1).
      Not re-swept for micro.
  The quality bar of issue 17 (BLEU >= 15, ROUGE-1 >= 30) is out of reach within the budget: the
  curves above reach BLEU ~3 after an hour of training and gain ~0.2 nats per doubling of it.

  Budget (seconds per step on this 2-core AMD EPYC machine: micro ~1.0 s at 16 x 128/64, the size
  sweep's wall time from step 1000 to 2000 at load ~2 (0.99-1.08 s; 1.8-1.9 CPU s); nano ~0.2 s):
    corpus 50 + pretrain 4000 x (1.0 + 0.2) = 4800 + uptrain 0.4 x 4000 x 1.0 = 1600
    + finetune 9 targets x 100 x 1.0 + draft 20 + evaluations ~400 = 1320
    + drafts stage 4 jobs x 100 steps x ~1.2 s = 480 + evaluate / timing / speculative ~2400
    (an allowance, not a measurement) + report 70 = 10,720 s = 2 h 59.
  Measured in the committed run (`results/cpu/report.md`, jobs summed over resumes): 11,886 s =
  3 h 18: pretrain 5049 (the draft 0.59 s per step, not 0.2), uptrain 3251 (~1.8 s per step on
  shared cores), finetune 1306, drafts 413 (Chimera 104-213 s per task, distilled 41-50 s),
  evaluate 113, timing 237, speculative 1476.
  Speculative decoding is timed at batch 1 (the papers' setting), gamma 1-7 for the chains over the
  model, bigram and copy drafts.
  What the code of 2026-12-07 adds to that run, estimated from its job sizes: evaluate's
  teacher-forced likelihood (20 model-task test sets of 256 examples, one forward pass each and
  ~8 compiles, ~10 s a job) and unigram baselines (reading each task's training targets once)
  ~300 s; the speculative stage's `--gamma auto` rows and their cost calibration, which took the
  smoke's stage from 61 s to 101 s, i.e. ~+66% of the 4 chain jobs' 720 s, ~480 s. Total
  11,886 + 41 (corpus) + 300 + 480 + 70 (report) = ~12,800 s = ~3 h 33 of stages, under the
  4.5 h the study may take on 2 cores: nothing trimmed.

  The premise pair (`premise`, the `premise` stage; issue 59): the study's micro target is not
  weight-bound and its nano draft costs c = 0.22-0.37 of a step, so Theorem 8 predicts no speedup
  there. Sized from measurements on this 2-core machine (`benchmarks/decode.py --presets
  small,micro,nano --kv mha --batch 1 --input-length 64`, `benchmarks/train_step.py --preset
  small --settings finetune --batch 8`; 2026-12-07, another job beside them):
    bandwidth 11.2 GB/s; the T5.1.1-small shape (vocabulary 32128) decodes a greedy step in
      17.4 ms against its 15.2 ms weight-bytes bound (0.87 of the bandwidth: weight-bound);
      micro 1.17 ms, nano 0.215 ms a step.
    with this preset's vocabulary (8192) small's decoder holds ~112 MiB, so a step ~11-12 ms
      (estimated from the bound, not measured): nano's c ~0.02, micro's ~0.1. The draft is the
      study's nano, distilled against the pair's target.
    small's train step at batch 8, 64/64 tokens: 3.1 s (vocabulary 32128; less at 8192).
  Budget (estimated from those, not measured): pre-training 600 steps at batch 8 on the mixture
  + fine-tuning 100 steps on translate (~30-35 min), Chimera and distillation 100 steps each
  against it (~10 min); the speculative rows: per batch size ~28 loops (4 chains x 2 gammas, 4
  trees, greedy and `--gamma auto`, each at T = 0 and 1) and ~10 step-time compiles, each loop
  run 3 times (16 examples: ~10 s a greedy run at batch 1 at ~12 ms a step), ~15-30 min for
  both batch sizes: about 1-1.25 h on top of the study. `--set premise.examples=8`,
  `premise.repeats=1` or `premise=none` trim it. Its learning rates are not swept for this
  size: warm-up 100 and peak 0.01 (T5's 1 / sqrt(10^4)); fine-tuning and the drafts take the
  preset's rates.
  """
  micro, nano = model_preset('micro'), model_preset('nano')
  pair = PremisePair(target=model_preset('small', vocab_size=nano.vocab_size),
                     pretrain_steps=600, pretrain_batch=8, warmup_steps=100, pretrain_peak_lr=0.01,
                     finetune_steps=100, finetune_batch=8, draft_steps=100, draft_batch=8)
  return Preset(
      name='cpu', use_sample_corpus=False, vocab_pieces=8000, target=micro, draft=nano,
      pretrain_steps=4000, pretrain_batch=16, pretrain_lengths=(128, 64), warmup_steps=500,
      kv_heads=(1, 2), alphas=(0.0, 0.05, 0.1), method_ablation_alpha=0.05,
      method_ablation_kv_heads=1,
      finetune_steps=100, finetune_batch=16, finetune_learning_rate=0.01,
      finetune_lengths={TRANSLATE: (64, 64), SUMMARIZE: (128, 32)}, eval_period=50,
      validation_examples=64, test_examples=256, eval_batch=64, timing_repeats=3, timing_batch=16,
      timing_groups=(1, 2, 4, 8), long_timing=(2048, 512),
      long_timing_config=micro.replace(num_encoder_layers=2),
      speculative_examples=24, speculative_batch=1, gammas=(1, 3, 5, 7),
      temperatures=(0.0, 1.0), speculative_repeats=3,
      # A draft-training step is a small model's train step plus the frozen target's greedy
      # decoding of the batch and its teacher-forced pass: measured 1.0-2.1 s (Chimera,
      # compile included) and 0.4-0.5 s (distilled) per step. Batch 16 as fine-tuning; lr 1e-3,
      # `train-draft`'s Adam default (the benchmarks/trained_drafts.py setting).
      chimera_steps=100, chimera_batch=16, chimera_learning_rate=1e-3, distill_steps=100,
      distill_batch=16, distill_learning_rate=1e-3, draft_gammas=(3, 5),
      tree_shapes=('topk:4,2,2', 'best:16,depth:4'),
      chimera_tree='topk:4,2,2', stage2_gamma=3,
      pretrain_peak_lr=0.015, draft_pretrain_peak_lr=0.045, draft_finetune_learning_rate=0.03,
      pretrain_task=PRETRAIN_MIXTURE, finetune_multitask=True, chimera_label_source='target',
      premise=pair)


# Fields applied to both models of the gpu preset: bfloat16 activations (the measured H100 figures
# are bf16) and scanned layers (they cut the per-shape compile time that dominates the budget
# below: 10-30x for train steps in results/benchmarks/compile_time.md, on CPU).
GPU_MODEL_FIELDS: Dict[str, object] = {'dtype': 'bfloat16', 'scan_layers': True}


def _gpu() -> Preset:
  """The study as one device call of at most 6 minutes on one H100 from a bare machine
  (`benchmarks/device_check.sh study`, issue 35): MHA target and draft pre-training, MQA and GQA-4
  by mean pooling uptrained for 5% of it, multi-task fine-tuning, test-set BLEU / ROUGE-1, GQA
  Figure 6, batch-1 speculative decoding (greedy and T = 1; the draft-model chain and one tree)
  and the claims table. Left out for the budget (and in no other call): the alpha sweep (only
  alpha = 0.05), the first / random conversion ablation (`method_ablation`), Chimera and
  distilled drafts (`trained_drafts`), the bigram / copy / staged chains and the GQA target's
  chains (`chain_drafts`, `speculative_gqa`); the speculative stage decodes translation only.
  Those run in the `cpu` preset.

  Models. The target is T5.1.1-base-shaped (12 + 12 layers, width 768, MLP 2048, gated GELU)
  with 16 heads of 48 (T5.1.1 base has 12 of 64) so that G in {1, 4, 16} exist; trained scanned
  (`GPU_MODEL_FIELDS`: one compiled layer), decoded unrolled (`models.layout.for_decoding`). Its
  batch-1 step is launch-bound by depth (~80 us per decoder layer measured on an H200,
  results/benchmarks/decode_gpu.md: ~1 ms for 12 layers); the draft is nano with one
  decoder layer, c ~0.07-0.1 (a 2-layer draft of a 24-layer target measured c = 0.069,
  speculative_costs_large_2layer_gpu.md).

  Budget: stage seconds measured on one H200 (JAX 0.11.2, 2026-11-26, results/gpu/
  device_study_2026-11-26/: the study's third device call, at the sizes in brackets), then scaled.
  XLA's GPU autotuning is off and its Triton GEMM emitter too (`benchmarks/device_check.py`'s `AUTOTUNE_OFF`): with
  autotuning alone off, Triton's default tiles made the target's train step ~1 s instead of
  ~0.1 s (the first call: 235 of 500 pre-training steps in 4 minutes); with both off a base train
  step compiles in 17.5 s and runs in 0.068 s (0.065 s autotuned, call 2). `workers = 4` and
  `eval_workers = 4`: the jobs of a stage side by side, their compiles overlapping on the host's
  16 cores.
    set-up     wheels, unpacking, JAX start: 4-5 s measured
    pretrain   [500 steps: 93 s, the target's first step after ~22 s, then ~7.8 steps/s beside the
               draft] -> 400 steps: ~80
    uptrain    MQA and GQA-4, alpha 0.05 (20 steps each) [25 steps: 27 s, mostly compiles]: ~27
    finetune   4 models side by side [150 steps: 86 s; ~25 s to the first step; validation at the
               end] -> 100 steps: ~65
    evaluate   [16 s per job, one at a time: 4 jobs measured] -> 8 jobs 4 at a time: ~45
               (not measured side by side)
    timing     G in {1, 4, 16} x 2 settings: 6 decode compiles + 3 rounds: ~35 (not measured)
    speculative translate, MHA, 16 examples at batch 1, gamma 3 and 5 and one tree, T = 0 and 1,
               2 repeats: ~8 loop compiles + step-time probes: ~45 (not measured)
    report     ~5
  = ~307 s of the driver's 330 (`STAGE_ESTIMATE_S` in `benchmarks/device_check.py`, checked against these by
  tests/scripts/test_device_study.py). The driver stops the run cleanly at its limit
  (`reproduce --time-limit`) and returns what finished. Quality at call 3's sizes (validation,
  128 examples, after 500 + 150 steps): MHA BLEU 3.2 / ROUGE-1 12.3, GQA-4 3.9 / 12.5, MQA 2.9 /
  13.3, draft 2.1 / 9.2: far below the issue's BLEU >= 20 / ROUGE-1 >= 35, which ~3 minutes of
  training on DDTP does not reach. Rates are not calibrated on a GPU: T5's rsqrt schedule with
  peak 0.01 after 100 warm-up steps, the draft 3x the target's rates (as the cpu sweeps found);
  constant fine-tuning lr 3e-3 (the cpu calibration found the GQA paper's 1e-3 too low for a short
  fine-tuning).
  """
  target = T5Config(vocab_size=model_preset('nano').vocab_size, emb_dim=768, num_heads=16,
                    head_dim=48, mlp_dim=2048, num_encoder_layers=12, num_decoder_layers=12,
                    **GPU_MODEL_FIELDS)
  draft = model_preset('nano', num_decoder_layers=1, **GPU_MODEL_FIELDS)
  return Preset(
      name='gpu', use_sample_corpus=False, vocab_pieces=8000, target=target, draft=draft,
      pretrain_steps=400, pretrain_batch=128, pretrain_lengths=(128, 64), warmup_steps=100,
      kv_heads=(1, 4), alphas=(0.05,), method_ablation_alpha=0.05, method_ablation_kv_heads=1,
      # Fine-tuning lengths within the pre-training lengths: one export at (128, 64) serves both.
      finetune_steps=100, finetune_batch=128, finetune_learning_rate=3e-3,
      finetune_lengths={TRANSLATE: (64, 64), SUMMARIZE: (128, 32)}, eval_period=100,
      validation_examples=128, test_examples=256, eval_batch=128, timing_repeats=3,
      timing_batch=32, timing_groups=(1, 4, 16), long_timing=(2048, 256),
      long_timing_config=target.replace(num_encoder_layers=2),
      speculative_examples=16, speculative_batch=1, gammas=(3, 5), temperatures=(0.0, 1.0),
      speculative_repeats=2,
      # Unused without `trained_drafts` (kept valid: `--set trained_drafts=true` runs them).
      chimera_steps=300, chimera_batch=64, chimera_learning_rate=1e-3, distill_steps=300,
      distill_batch=64, distill_learning_rate=1e-3, draft_gammas=(3, 5),
      tree_shapes=('best:16,depth:4',), chimera_tree='topk:4,2,1', stage2_gamma=3,
      pretrain_peak_lr=0.01, draft_pretrain_peak_lr=0.03, draft_finetune_learning_rate=1e-2,
      pretrain_task=PRETRAIN_MIXTURE, finetune_multitask=True, chimera_label_source='data',
      workers=4, eval_workers=4, method_ablation=False, trained_drafts=False, speculative_gqa=False,
      chain_drafts=('draft model',), speculative_tasks=(TRANSLATE,))


PRESETS = {'smoke': _smoke, 'cpu': _cpu, 'gpu': _gpu}


def get(name: str) -> Preset:
  if name not in PRESETS:
    raise UserError(f'unknown reproduction preset {name!r}; known: {sorted(PRESETS)}')
  return PRESETS[name]()
