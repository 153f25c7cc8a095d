"""One process of `test_multihost.py`'s runs: the documented commands, in one Python process.

  python tests/multihost/worker.py OUT N I PORT DECODE_CKPT

N = 1: the reference (one process, 8 virtual devices); N = 2: process I of two (4 devices each),
started with `--coordinator localhost:PORT --num-processes 2 --process-id I`. In sequence, sharing
the process (its start costs more than the work): `gqa-spec train` (2x4 mesh, synthetic data,
checkpoints), a restore of the last checkpoint onto that mesh and a native export of its
parameters (spread over the processes when N = 2), then `gqa-spec generate` greedy and speculative
with that export as model draft, at gamma 3 and `--gamma auto` (whose calibration reads each
process's clock: `distributed.from_process_zero`, also printed on a value of its own); then, in the same process, `decode.py`'s eval, infer and
generate --tree on DECODE_CKPT, into decode/ (the DDTP tasks read `GQA_SPEC_DATA_DIR`). Every
process runs the same command lines: process 0 in OUT, process I in OUT/pI, so that process 1's
outputs land apart and the test sees that it wrote none.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from gqa_spec import cli  # pylint: disable=g-import-not-at-top
from tests.multihost import decode  # pylint: disable=g-import-not-at-top

TRAIN_STEPS = 6
MODEL_PARALLEL = 4
GIN = """
include 'models/t5_1_1/nano.gin'
include 'runs/pretrain.gin'
from __gin__ import dynamic_registration
from gqa_spec.models import config
from gqa_spec.training import trainer
config.T5Config:
  vocab_size = 256
  emb_dim = 32
  num_heads = 4
  num_kv_heads = 2
  head_dim = 8
  mlp_dim = 64
  num_encoder_layers = 1
  num_decoder_layers = 1
MIXTURE_OR_TASK_NAME = 'synthetic'
TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 8}
BATCH_SIZE = 8
DROPOUT_RATE = 0.1
WARMUP_STEPS = 10
trainer.train.log_period = 1
trainer.CheckpointConfig.save_period = 3
"""
INPUTS = [[5, 6, 7, 1], [9, 10, 11, 12, 13, 1], [20, 1], [30, 31, 32, 1], [40, 41, 1]]


def _run(argv):
  code = cli.main(argv)
  if code:
    raise SystemExit(f'worker: gqa-spec {argv[0]} exited {code}')


def main(out: str, n: int, i: int, port: int, decode_ckpt: str) -> None:
  flags = [] if n == 1 else ['--coordinator', f'localhost:{port}', '--num-processes', str(n),
                             '--process-id', str(i), '--distributed-timeout', '60']
  run_dir = os.path.join(out, 'run')
  # Every process is given the same command line (`distributed.agree` compares them): its own
  # files under the same relative names, in a working directory of its own (process 0: OUT,
  # process I: OUT/pI, as on a host's own disk); shared paths absolute.
  here = out if i == 0 else os.path.join(out, f'p{i}')
  os.makedirs(here, exist_ok=True)
  os.chdir(here)
  mine = lambda name: name
  gin_file = mine('tiny.gin')
  with open(gin_file, 'w') as f:
    f.write(GIN)
  _run(['train', f'--gin_file={gin_file}', f"--gin.MODEL_DIR='{run_dir}'",
        f'--gin.TRAIN_STEPS={TRAIN_STEPS}', '--model-parallel', str(MODEL_PARALLEL)] + flags)

  import jax  # pylint: disable=g-import-not-at-top; after the runtime started
  from gqa_spec.checkpoints import manager, native  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.config import T5Config  # pylint: disable=g-import-not-at-top
  from gqa_spec.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import optimizer, train_step  # pylint: disable=g-import-not-at-top
  with open(os.path.join(run_dir, 'config.json')) as f:
    config = T5Config.from_json(f.read())
  step = train_step.TrainStep(config, optimizer.adafactor(), optimizer.rsqrt_decay(),
                              Partitioner.create(config, model=MODEL_PARALLEL))
  ckpt = manager.Checkpointer(run_dir)
  state, _ = ckpt.restore(ckpt.latest_step(), manager.abstract_with_shardings(
      step.abstract_state(), step.state_shardings()))
  ckpt.close()
  spread = not all(x.is_fully_addressable for x in jax.tree_util.tree_leaves(state.params))
  assert spread == (n > 1), spread
  if i == 1:  # late on purpose: the export's existence check is process 0's, made before it writes
    time.sleep(3)  # (a process checking for itself found process 0's export and raised, in CI)
  native.save_checkpoint(os.path.join(out, 'export'), config, state.params)  # process 0 writes

  export = os.path.join(out, 'export')  # process 0's, read by every process
  inputs = os.path.join(out, 'inputs.jsonl')
  if i == 0:
    with open(inputs, 'w') as f:
      f.writelines(f'{{"input_ids": {ids}}}\n' for ids in INPUTS)
  if n > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices('inputs written')
  common = ['--model', export, '--inputs', inputs, '--max-decode-len', '8', '--batch-size', '4']
  _run(['generate', *common, '--out', mine('greedy.jsonl'), '--stats', mine('greedy_stats.json')]
       + flags)
  _run(['generate', *common, '--draft', export, '--gamma', '3', '--out', mine('spec.jsonl'),
        '--model-parallel', '2'] + flags)
  # --gamma auto: its calibration's wall times, process 0's on every process
  from gqa_spec import distributed  # pylint: disable=g-import-not-at-top
  print(f'agreed: {distributed.from_process_zero([i + 0.5, 3.0])}', flush=True)  # every process
  # batch 8 on 8 devices: the rows are spread over both processes, and so are the arrays the
  # calibration reads back (`partitioning.to_host`)
  _run(['generate', *common, '--batch-size', '8', '--draft', export, '--gamma', 'auto',
        '--gamma-max', '2', '--out', mine('auto.jsonl'), '--stats', mine('auto_stats.json')]
       + flags)
  os.makedirs('decode', exist_ok=True)
  decode.main(os.path.abspath('decode'), decode_ckpt, n, i, port)


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
