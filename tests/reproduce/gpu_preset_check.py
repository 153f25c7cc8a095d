"""`gqa-spec reproduce ARGS...` with TensorFlow, seqio and gin unimportable (as on the GPU image);
run by `test_gpu_preset.py`. Prints `RC <exit status>`; first checks that without `--exported`
the command stops with a one-line error naming the flag.
"""

import contextlib
import io
import sys

from tests.training import tf_free_check  # pylint: disable=unused-import  (hides TF, seqio, gin)

# pylint: disable=g-import-not-at-top,wrong-import-position
from gqa_spec import cli


def main():
  argv = sys.argv[1:]
  i = argv.index('--exported')
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    rc = cli.main(argv[:i] + argv[i + 2:])
  assert rc == 2 and 'give the exported tasks with --exported DIR' in err.getvalue(), (rc, err)
  print(f'RC {cli.main(argv)}', flush=True)


if __name__ == '__main__':
  main()
