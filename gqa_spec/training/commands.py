"""`gqa-spec train | uptrain | eval | infer`: gin-configured runs, as t5x's `train.py` / `eval.py` /
`infer.py` (`scripts/` has those three, taking the same flags).

  gqa-spec train   --gin_file=experiments/nano_mha_pretrain_ddtp.gin [--gin.TRAIN_STEPS=500]
  gqa-spec uptrain --gin_file=experiments/nano_uptrain_gqa2_ddtp.gin \
                   --gin.INITIAL_CHECKPOINT_PATH="'/tmp/nano_mha'"
  gqa-spec eval    --gin_file=runs/eval.gin --gin.CHECKPOINT_PATH="'/tmp/ft/best'" \
                   --gin.MIXTURE_OR_TASK_NAME="'ddtp_translate_en_de'" --gin.OUTPUT_DIR="'/tmp/ev'" \
                   [--gin.DECODING="'speculative'" --gin.DRAFT="'/tmp/draft/best'" --gin.GAMMA=4]
  gqa-spec infer   --gin_file=runs/infer.gin --gin.CHECKPOINT_PATH="'/tmp/ft/best'" \
                   --gin.MIXTURE_OR_TASK_NAME="'ddtp_translate_en_de'" --gin.INFER_OUTPUT_DIR="'/tmp/inf'"

Flags: `--gin_file` (repeatable), `--gin_bindings` (repeatable), `--gin.MACRO=VALUE` (a gin
literal: strings need their own quotes), `--gin_search_paths`, the multi-process flags (`gqa_spec.distributed`: `--coordinator HOST:PORT
--num-processes N --process-id I`, or `--distributed auto`), `--model-parallel N` (sets
`MODEL_PARALLEL`: the training mesh's model axis; `eval` then decodes on a mesh of all devices);
eval and infer: `--param-dtype {float32,bfloat16}` (parameters cast once, at load) and `--layout
{unrolled,scanned}` (the layer layout, converted at load): passed to the function even where a
user's gin file does not bind `param_dtype = %PARAM_DTYPE` / `layout = %LAYOUT`. See `gin_utils` for the search path.
The operative gin config of a training run is written to `MODEL_DIR/config.gin`.
"""

from __future__ import annotations

import argparse
import logging
import os

from gqa_spec import arguments, atomic, distributed
from gqa_spec.errors import UserError
from gqa_spec.training import gin_utils

_MACROS = 'gin_macro_bindings'


def _parse_known_with_macros(parser: argparse.ArgumentParser):
  """`parse_known_args` that first takes the `--gin.MACRO=VALUE` flags out of the arguments.

  argparse cannot declare a family of options by prefix, so each training sub-parser's
  `parse_known_args` is wrapped: the macros land in the namespace, argparse sees the rest.
  """
  original = parser.parse_known_args

  def parse_known_args(args=None, namespace=None):
    remaining, bindings = gin_utils.split_macro_flags(args or [])
    namespace, extras = original(remaining, namespace)
    setattr(namespace, _MACROS, getattr(namespace, _MACROS, []) + bindings)
    return namespace, extras

  parser.parse_known_args = parse_known_args


def register(subparsers) -> None:
  """Adds `train`, `uptrain`, `eval` and `infer` to the `gqa-spec` parser."""
  for name, help_text, func in (
      ('train', 'train or fine-tune a model from gin configs (resumes from MODEL_DIR)', train),
      ('uptrain', 'convert an MHA checkpoint to GQA/MQA and continue pre-training for alpha x '
                  'the original steps (GQA recipe)', uptrain),
      ('eval', 'evaluate a checkpoint on a task split: metrics, predictions, time per sample',
       evaluate),
      ('infer', 'decode a task or mixture split and write t5x-style prediction files', infer)):
    p = subparsers.add_parser(name, help=help_text,
                              epilog='--gin.MACRO=VALUE sets a gin macro, e.g. --gin.TRAIN_STEPS=500')
    gin_utils.add_gin_flags(p)
    p.add_argument('--model-parallel', type=int, default=None, metavar='N',
                   help='model-parallel size of the device mesh: sets the gin macro MODEL_PARALLEL')
    if name in ('eval', 'infer'):
      p.add_argument('--param-dtype', choices=('float32', 'bfloat16'), default=None,
                     help='cast the floating parameters to this dtype once, at load (passed to '
                          'the function whatever the gin files bind; also sets the macro '
                          'PARAM_DTYPE)')
      p.add_argument('--layout', choices=arguments.LAYOUTS, default=None,
                     help='the layer layout decoding runs in, converted at load (default: '
                          'unrolled, as MaxText decodes; scanned: one nn.scan per stack, compile '
                          'time independent of depth, slower steps)')
    p.add_argument('--verbose', action='store_true', default=argparse.SUPPRESS,
                   help="show the libraries' logs (as `gqa-spec --verbose`)")
    distributed.add_flags(p)
    p.set_defaults(func=func)
    _parse_known_with_macros(p)


def _quiet_gin_search(record: logging.LogRecord) -> bool:
  """Drops gin's log lines for every search-path miss (it logs each one as an ERROR)."""
  return not str(record.msg).startswith(('Path not found', 'system_path_file_exists'))


def _parse(args: argparse.Namespace) -> None:
  from gqa_spec import console  # pylint: disable=g-import-not-at-top
  # orbax logs every step of a save, and warns of a read-only manager at every restore
  console.configure_logging(getattr(args, 'verbose', False), library_level=logging.ERROR)
  for handler in logging.getLogger().handlers:
    handler.addFilter(_quiet_gin_search)
  distributed.start_from_args(args)  # before JAX computes anything
  mesh = getattr(args, 'model_parallel', None)
  if mesh is not None and mesh < 1:
    raise UserError(f'--model-parallel must be >= 1, got {mesh}')
  mesh = [] if mesh is None else [f'MODEL_PARALLEL = {mesh}']
  dtype = getattr(args, 'param_dtype', None)
  mesh += [] if dtype is None else [f"PARAM_DTYPE = '{dtype}'"]
  gin_utils.parse(args.gin_file, list(args.gin_bindings) + getattr(args, _MACROS, []) + mesh,
                  gin_utils.maybe_search_paths(args.gin_search_paths))


def _write_operative_config() -> None:
  if not distributed.is_writer():
    return
  import gin  # pylint: disable=g-import-not-at-top
  model_dir = gin.query_parameter('%MODEL_DIR')
  atomic.write_text(os.path.join(model_dir, 'config.gin'), gin_utils.operative_config())


def _print_result(result) -> None:
  if not distributed.is_writer():
    return
  if not result.train_metrics and result.stop_signal is None:  # no step ran
    print(f'step {result.step}: the run is already at its last step; nothing to train (raise '
          'TRAIN_STEPS to train on)')
  else:
    metrics = ', '.join(f'{k}={v:.4g}' for k, v in result.train_metrics.items())
    print(f'step {result.step}: {metrics}')
  if result.best:
    print(f"best {result.best['metric']} = {result.best['value']:.4g} at step {result.best['step']}")


def train(args: argparse.Namespace) -> int:
  _parse(args)
  from gqa_spec.training import trainer  # pylint: disable=g-import-not-at-top  (jax, orbax)
  result = gin_utils.call(trainer.train)
  _write_operative_config()
  _print_result(result)
  return 0


def uptrain(args: argparse.Namespace) -> int:
  _parse(args)
  from gqa_spec.training import trainer  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import uptrain as uptrain_lib  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  result = gin_utils.call(uptrain_lib.uptrain, train_fn=gin.get_configurable(trainer.train))
  _write_operative_config()
  _print_result(result)
  return 0


def _flag_kwargs(args: argparse.Namespace) -> dict:
  """Arguments flags set whatever the gin files bind: `--param-dtype` also sets the macro
  PARAM_DTYPE, but a user's gin file that does not bind `param_dtype = %PARAM_DTYPE` would make
  the flag a silent no-op (likewise `--layout`)."""
  flags = {'param_dtype': getattr(args, 'param_dtype', None),
           'layout': getattr(args, 'layout', None)}
  return {name: value for name, value in flags.items() if value is not None}


def evaluate(args: argparse.Namespace) -> int:
  _parse(args)
  from gqa_spec.evaluation import evaluator as evaluation  # pylint: disable=g-import-not-at-top
  metrics = gin_utils.call(evaluation.evaluate_checkpoint, **_flag_kwargs(args))
  if distributed.is_writer():  # every process evaluated; process 0 reports
    for name, value in sorted(metrics.items()):
      print(f'{name}: {value:.4g}')
  return 0


def infer(args: argparse.Namespace) -> int:
  _parse(args)
  from gqa_spec.evaluation import infer as inference  # pylint: disable=g-import-not-at-top
  written = gin_utils.call(inference.infer, **_flag_kwargs(args))
  if distributed.is_writer():  # the paths process 0 wrote
    for task, path in sorted(written.items()):
      print(f'{task}: {path}')
  return 0
