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

from gqa_spec import distributed
from gqa_spec.errors import UserError
from gqa_spec.training import commands, draft_training, gin_utils

RUN_GIN = 'runs/train_draft.gin'
DEFAULT_MODEL_GIN = 'models/t5_1_1/nano.gin'  # a model draft's architecture unless a models/ gin is given


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
  distributed.add_flags(p)
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
  result = gin_utils.call(draft_training.train_draft)
  commands._write_operative_config()  # pylint: disable=protected-access
  commands._print_result(result)  # pylint: disable=protected-access
  return 0
