"""The reproduction's stages, in order (`gqa-spec reproduce`; driven by `pipeline.run`).

Stages (in order; each writes `results/<preset>/<stage>.json` and is skipped when that exists):
  corpus       DDTP splits + SentencePiece vocabulary (the packaged excerpt for `smoke`)
  pretrain     MHA target and MHA draft on the preset's `pretrain_task` (ddtp_span_corruption, or
               the ddtp_mixture of T5's multi-task pre-training; rsqrt schedule, T5 Adafactor)
  uptrain      convert the target (mean / first / random, G groups) and continue pre-training for
               alpha x the pre-training steps on `pretrain_task`, continuing the original schedule
  finetune     every variant and the draft on each task, or once on translate + summarize
               (`finetune_multitask`); constant lr, dropout 0.1, best validation checkpoint kept
               (`finetune.py`); one row per (model, task) either way
  drafts       per task, a Chimera and a distilled draft trained against the frozen fine-tuned MHA
               target; per-head top-k accuracy (`drafts.py`)
  evaluate     test-set quality (greedy) and time per sample of every fine-tuned variant, with
               per-example scores (`bootstrap.encode`) for the claims' paired bootstrap
  timing       time per sample vs number of K/V groups at a short and a long input setting
  speculative  fine-tuned MHA and GQA targets with the draft model, bigram and copy drafts; for MHA
               also token trees, staged, Chimera (chain and tree) and distilled (`speculation.py`)
  premise      the preset's premise pair (`Preset.premise`, cpu only): a weight-bound target
               pre-trained and fine-tuned on translate, a Chimera and a distilled draft against
               it, and the speculative rows at batch 1 and 8 where Theorem 8 can pay
               (`premise.py`); a preset without one records so
  report       markdown tables, the claims table (`claims.py`), PNG figures (`figures.py`),
               commands and wall times
Models live under the work dir (default `runs/<preset>/`, not committed); everything a table needs
is in the stage JSON. Inside a stage, finished jobs are skipped and a killed training job resumes
from its last checkpoint (the trainer's own resume).
"""

STAGES = ('corpus', 'pretrain', 'uptrain', 'finetune', 'drafts', 'evaluate', 'timing',
          'speculative', 'premise', 'report')
