#!/usr/bin/env python
"""t5x-style inference entry point: swap `python -m t5x.infer` for `python scripts/infer.py`.

  python scripts/infer.py --gin_file=runs/infer.gin \
    --gin.CHECKPOINT_PATH="'/tmp/gqa_spec/nano_gqa2_translate/best'" \
    --gin.MIXTURE_OR_TASK_NAME="'ddtp_translate_en_de'" --gin.INFER_OUTPUT_DIR="'/tmp/gqa_spec/infer_gqa2'" \
    [--gin.MODE="'predict_with_aux'"] [--gin.DECODING="'beam'"]

t5x's flags (--gin_file, --gin_bindings, --gin_search_paths, --gin.MACRO=VALUE); runs
`gqa-spec infer`, which writes t5x-style INFER_OUTPUT_DIR/<task>-<mode>.jsonl-00000-of-00001
files (see `gqa_spec.evaluation.infer`).
"""

import os
import sys

try:
  import gqa_spec  # pylint: disable=unused-import
except ImportError:  # a source checkout without `pip install`: use the repository's package
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gqa_spec import cli  # pylint: disable=g-import-not-at-top


def main(argv=None) -> int:
  return cli.main(['infer'] + list(sys.argv[1:] if argv is None else argv))


if __name__ == '__main__':
  sys.exit(main())
