#!/usr/bin/env python
"""t5x-style training entry point: swap `python -m t5x.train` for `python scripts/train.py`.

  python scripts/train.py --gin_file=experiments/nano_mha_pretrain_ddtp.gin \
    --gin.MODEL_DIR="'/tmp/gqa_spec/nano_mha'" [--gin.TRAIN_STEPS=500] [--gin_bindings=...]

t5x's flags: --gin_file (repeatable), --gin_bindings (repeatable), --gin_search_paths
(comma-separated), --gin.MACRO=VALUE (a gin literal: strings need their own quotes). Runs
`gqa-spec train`, or `gqa-spec uptrain` when the gin files configure the uptraining recipe
(`gqa_spec.training.uptrain.uptrain`, as experiments/nano_uptrain_*.gin do).
"""

import argparse
import os
import sys

try:
  import gqa_spec  # pylint: disable=unused-import
except ImportError:  # a source checkout without `pip install`: use the repository's package
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gqa_spec import cli  # pylint: disable=g-import-not-at-top

_UPTRAIN = 'gqa_spec.training.uptrain.uptrain.initial_checkpoint_path'


def _command(argv):
  """'uptrain' when the gin config binds the uptraining function, else 'train'."""
  import gin  # pylint: disable=g-import-not-at-top
  from gqa_spec.errors import UserError  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import gin_utils  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(add_help=False)
  gin_utils.add_gin_flags(parser)
  try:
    remaining, macros = gin_utils.split_macro_flags(argv)
    args, _ = parser.parse_known_args(remaining)
    gin_utils.parse(args.gin_file, list(args.gin_bindings) + macros,
                    gin_utils.maybe_search_paths(args.gin_search_paths), finalize=False)
  except UserError:
    return 'train'  # `gqa-spec train` reports the problem
  try:
    gin.query_parameter(_UPTRAIN)
    return 'uptrain'
  except ValueError:
    return 'train'
  finally:
    gin.clear_config(clear_constants=True)


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  return cli.main([_command(argv)] + argv)


if __name__ == '__main__':
  sys.exit(main())
