#!/usr/bin/env python
"""t5x-style evaluation entry point: swap `python -m t5x.eval` for `python scripts/eval.py`.

  python scripts/eval.py --gin_file=experiments/nano_eval_translate_ddtp.gin \
    --gin.CHECKPOINT_PATH="'/tmp/gqa_spec/nano_mha_translate/best'" \
    --gin.EVAL_OUTPUT_DIR="'/tmp/gqa_spec/eval_mha'"

t5x's flags (--gin_file, --gin_bindings, --gin_search_paths, --gin.MACRO=VALUE); runs
`gqa-spec eval` (metrics.json and predictions-<task>.jsonl in the output directory). t5x's macro
name EVAL_OUTPUT_DIR is accepted for this project's OUTPUT_DIR.
"""

import os
import sys

try:
  import gqa_spec  # pylint: disable=unused-import
except ImportError:  # a source checkout without `pip install`: use the repository's package
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gqa_spec import cli  # pylint: disable=g-import-not-at-top

_T5X_MACROS = {'--gin.EVAL_OUTPUT_DIR': '--gin.OUTPUT_DIR'}


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  renamed = []
  for arg in argv:
    name, eq, value = arg.partition('=')
    renamed.append(_T5X_MACROS.get(name, name) + eq + value)
  return cli.main(['eval'] + renamed)


if __name__ == '__main__':
  sys.exit(main())
