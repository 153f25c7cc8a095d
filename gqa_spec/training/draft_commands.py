"""`gqa-spec train-draft`: a Chimera or distilled model draft trained against a frozen target.

  gqa-spec train-draft --kind chimera --target CKPT --task ddtp_translate_en_de \
      --gin.MODEL_DIR="'/tmp/chimera'" [--gin.TRAIN_STEPS=300]
  gqa-spec train-draft --kind model --target CKPT --task ddtp_translate_en_de \
      --gin_file=models/t5_1_1/nano.gin --gin.MODEL_DIR="'/tmp/nano_kd'"

`runs/train_draft.gin` is always parsed first (then the --gin_file files, bindings and macros);
`--kind`, `--target` and `--task` set its KIND, TARGET_CHECKPOINT and MIXTURE_OR_TASK_NAME. A model
draft's architecture is the MODEL_CONFIG of a model gin (default: nano, used unless a --gin_file
names a models/ config). The run directory is a
trainer run (orbax checkpoints, resume, train_log.jsonl) plus `draft.json`; a model draft is also
exported as a native checkpoint to MODEL_DIR/draft, which `--draft` accepts as any model draft. A
Chimera run directory is used as `--draft chimera:MODEL_DIR`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional

from gqa_spec.errors import UserError
from gqa_spec.training import commands, gin_utils

RUN_GIN = 'runs/train_draft.gin'
EXPORT_DIR = 'draft'
DEFAULT_MODEL_GIN = 'models/t5_1_1/nano.gin'  # a model draft's architecture unless a models/ gin is given


def adam(b1: float = 0.9, b2: float = 0.999, clip_norm: Optional[float] = 1.0):
  """Adam without learning rate (the trainer multiplies by its schedule), gradient-norm clipped."""
  import optax  # pylint: disable=g-import-not-at-top
  parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
  return optax.chain(*parts, optax.scale_by_adam(b1=b1, b2=b2), optax.scale(-1.0))


def train_draft(*, kind: str, target_checkpoint: str, model_dir: str, train_dataset_cfg,
                total_steps: int, draft_model_config=None, num_draft_heads: int = 4,
                chimera_overrides: Optional[dict] = None, optimizer=None, learning_rate_fn=None,
                label_source: str = 'target', z_loss: float = 1e-4, mse_weight: float = 1.0,
                kl_weight: float = 0.0, checkpoint_cfg=None, log_period: int = 50,
                random_seed: int = 0, initial_checkpoint_path: Optional[str] = None) -> Any:
  """Trains (or resumes) a draft against the frozen target at `target_checkpoint`.

  Args:
    kind: 'chimera' or 'model'.
    target_checkpoint: native, trainer-run or HF checkpoint of the target (`initial.load`).
    model_dir: the run directory.
    train_dataset_cfg: unpacked training examples (`data.DatasetConfig`, pack=False).
    total_steps: absolute step to stop at.
    draft_model_config: kind 'model': the draft's `T5Config` (same vocabulary as the target).
    num_draft_heads: kind 'chimera': residual heads (the largest gamma it can serve).
    chimera_overrides: kind 'chimera': other `ChimeraConfig` fields (default: sized like the
      target's decoder layer, `ChimeraConfig.for_target`).
    optimizer, learning_rate_fn: default `adam()` and a constant 1e-3.
    label_source: 'target' (its greedy outputs, the default) or 'data'.
    z_loss, mse_weight, kl_weight: loss coefficients (see `draft_training`).
    checkpoint_cfg: `trainer.CheckpointConfig`.
    log_period: steps between logged metrics.
    random_seed: draft initialisation seed.
    initial_checkpoint_path: kind 'model': start from this checkpoint of the draft (e.g. the
      independently trained draft; fresh optimizer state, step 0) instead of a random draft; a
      run that has checkpoints of its own resumes from them instead.

  Returns:
    The trainer's `TrainResult`.
  """
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  from gqa_spec.models import chimera  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import draft_training, initial, optimizer as opt, trainer  # pylint: disable=g-import-not-at-top
  draft_training.check_choice('kind', kind, draft_training.KINDS)
  if train_dataset_cfg.pack:
    raise UserError('draft training needs unpacked examples: set DatasetConfig.pack = False')
  target_config, target_params, _ = initial.load(target_checkpoint)
  if kind == 'chimera':
    draft_config = chimera.ChimeraConfig.for_target(
        target_config, num_draft_heads=num_draft_heads, **(chimera_overrides or {}))
  elif draft_model_config is None:
    raise UserError('--kind model needs the draft architecture: a model gin (e.g. '
                    '--gin_file=models/t5_1_1/nano.gin) setting DRAFT_MODEL_CONFIG')
  else:
    draft_config = draft_model_config
  draft_training.write_draft_file(model_dir, kind, target_checkpoint, draft_config)
  step = draft_training.DraftTrainStep.create(
      kind, draft_config, target_config, target_params, optimizer or adam(),
      learning_rate_fn or opt.constant(1e-3), label_source=label_source, z_loss=z_loss,
      mse_weight=mse_weight, kl_weight=kl_weight)
  result = trainer.train(model_dir=model_dir, model_config=draft_config,
                         train_dataset_cfg=train_dataset_cfg, total_steps=total_steps,
                         checkpoint_cfg=checkpoint_cfg or trainer.CheckpointConfig(),
                         log_period=log_period, random_seed=random_seed, step_fn=step,
                         initial_checkpoint_path=initial_checkpoint_path,
                         initial_step=0 if initial_checkpoint_path else None)
  if kind == 'model':
    config, params, _ = initial.load(model_dir)
    native.save_checkpoint(os.path.join(model_dir, EXPORT_DIR), config, params, overwrite=True)
  return result


def register(subparsers) -> None:
  """Adds `train-draft` to the `gqa-spec` parser."""
  p = subparsers.add_parser(
      'train-draft', help='train a Chimera or distilled model draft against a frozen target',
      epilog=f'{RUN_GIN} is parsed first; --gin.MACRO=VALUE sets a gin macro, e.g. '
             '--gin.TRAIN_STEPS=500')
  p.add_argument('--kind', required=True, choices=('chimera', 'model'))
  p.add_argument('--target', required=True, metavar='CKPT', help='the frozen target checkpoint')
  p.add_argument('--task', metavar='TASK', help='seqio task or mixture (MIXTURE_OR_TASK_NAME)')
  gin_utils.add_gin_flags(p)
  p.set_defaults(func=run)
  commands._parse_known_with_macros(p)  # pylint: disable=protected-access  (the same --gin.X flags)


def run(args: argparse.Namespace) -> int:
  if not os.path.exists(args.target):
    raise UserError(f'--target {args.target}: checkpoint not found')
  macros = [f'KIND = {args.kind!r}', f'TARGET_CHECKPOINT = {os.path.abspath(args.target)!r}']
  if args.task:
    macros.append(f'MIXTURE_OR_TASK_NAME = {args.task!r}')
  files = [RUN_GIN]
  if args.kind == 'model':
    if not any('models/' in f for f in args.gin_file):
      files.append(DEFAULT_MODEL_GIN)
    macros.append('DRAFT_MODEL_CONFIG = %MODEL_CONFIG')
  args.gin_file = files + list(args.gin_file)
  args.gin_bindings = macros + list(args.gin_bindings)
  commands._parse(args)  # pylint: disable=protected-access
  result = gin_utils.call(train_draft)
  commands._write_operative_config()  # pylint: disable=protected-access
  commands._print_result(result)  # pylint: disable=protected-access
  return 0
