"""The decoding half of one process of `test_multihost.py` (`worker.py` calls `main` after its
training, in the same process): eval, infer and generate, as the commands run them.

N = 1: the reference (one process, 8 virtual devices); N = 2: process I of two (4 devices each).
In sequence, in one Python process: `gqa-spec eval` with beam search on a mesh of all processes'
devices (model axis 2), `gqa-spec infer` with beam search (one device per process), and
`gqa-spec generate --tree` (a model tree draft: CKPT itself) on the mesh. The DDTP tasks read
`GQA_SPEC_DATA_DIR`. Every process runs in its own OUT (the worker's pI/decode for process I) with
the same command lines, so the test sees that process 1 wrote nothing there; each command's stdout
goes to OUT/<name>.stdout.
"""

import contextlib
import os

from gqa_spec import cli

TASK = 'ddtp_translate_en_de'
INPUTS = [[5, 6, 7, 1], [9, 10, 11, 12, 13, 1], [20, 1], [30, 31, 32, 1], [40, 41, 1]]


def main(out: str, ckpt: str, n: int, i: int, port: int) -> None:
  flags = [] if n == 1 else ['--coordinator', f'localhost:{port}', '--num-processes', str(n),
                             '--process-id', str(i), '--distributed-timeout', '60']
  os.chdir(out)  # the same relative names on every process (`distributed.agree`)
  mine = lambda name: name

  def run(name, argv):
    with open(mine(f'{name}.stdout'), 'w') as f, contextlib.redirect_stdout(f):
      code = cli.main(argv + flags)
    if code:
      raise SystemExit(f'decode: gqa-spec {argv[0]} ({name}) exited {code}')

  task = [f"--gin.CHECKPOINT_PATH='{ckpt}'", f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 6}"]
  run('eval_beam', ['eval', '--gin_file=runs/eval.gin', *task,
                    f"--gin.OUTPUT_DIR='{mine('eval_beam')}'",
                    '--gin.EVAL_BATCH_SIZE=4', '--gin.EVAL_EXAMPLES=5', "--gin.DECODING='beam'",
                    '--gin.BEAM_SIZE=2', '--model-parallel', '2'])
  run('infer_beam', ['infer', '--gin_file=runs/infer.gin', *task,
                     f"--gin.INFER_OUTPUT_DIR='{mine('infer_beam')}'", '--gin.BATCH_SIZE=4',
                     '--gin.NUM_EXAMPLES=5', "--gin.DECODING='beam'", '--gin.BEAM_SIZE=2'])
  inputs = 'inputs.jsonl'
  with open(inputs, 'w') as f:
    f.writelines(f'{{"input_ids": {ids}}}\n' for ids in INPUTS)
  run('tree', ['generate', '--model', ckpt, '--inputs', inputs, '--max-decode-len', '8',
               '--batch-size', '4', '--draft', ckpt, '--tree', 'topk:2,2', '--out',
               mine('tree.jsonl'), '--stats', mine('tree_stats.json'), '--model-parallel', '2'])
