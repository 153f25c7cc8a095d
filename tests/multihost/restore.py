"""One process of `test_multihost.py`'s restores into another process count and mesh.

  python tests/multihost/restore.py SRC DST DATA MODEL N I PORT

Restores the latest train-state checkpoint of the run SRC onto a DATA x MODEL mesh of N processes
(this is process I; N = 1: no runtime), which checks every array against the checkpoint's integrity
record on every process (`Checkpointer.restore`), then saves that state at the same step into the
run DST (every process its shards). A failed restore prints its one-line error and exits 1.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from gqa_spec import atomic, distributed  # pylint: disable=g-import-not-at-top
from gqa_spec.errors import UserError  # pylint: disable=g-import-not-at-top


def main(src: str, dst: str, data: int, model: int, n: int, i: int, port: int) -> None:
  if n > 1:
    distributed.initialize(f'localhost:{port}', n, i, timeout=60)
  import jax  # pylint: disable=g-import-not-at-top; after the runtime started
  from gqa_spec.checkpoints import manager  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.config import T5Config  # pylint: disable=g-import-not-at-top
  from gqa_spec.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  from gqa_spec.training import optimizer, train_step  # pylint: disable=g-import-not-at-top
  with open(os.path.join(src, 'config.json')) as f:
    config = T5Config.from_json(f.read())
  step_fn = train_step.TrainStep(config, optimizer.adafactor(), optimizer.rsqrt_decay(),
                                 Partitioner.create(config, data=data, model=model))
  assert dict(step_fn.partitioner.mesh.shape) == {'data': data, 'model': model}
  source = manager.Checkpointer(src)
  step = source.latest_step()
  try:
    state, meta = source.restore(step, manager.abstract_with_shardings(
        step_fn.abstract_state(), step_fn.state_shardings()))
  except UserError as e:
    print(f'process {i}: {e}', flush=True)  # every process checks, so every process fails
    raise SystemExit(1) from None  # an ordinary exit (`distributed._watch`'s goodbye: no loss)
  source.close()
  spread = not all(x.is_fully_addressable for x in jax.tree_util.tree_leaves(state))
  assert spread == (n > 1), spread
  target = manager.Checkpointer(dst)
  assert target.save(step, state, meta, force=True)
  target.close()
  if distributed.is_writer():
    atomic.write_text(os.path.join(dst, 'config.json'), config.to_json() + '\n')
  print(f'process {i}: restored and saved step {step} on mesh {data}x{model}', flush=True)


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2], *(int(x) for x in sys.argv[3:]))
