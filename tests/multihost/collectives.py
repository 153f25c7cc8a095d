"""A process of `test_faults.py`: starts the runtime (`gqa_spec.distributed`), prints `ready`, then
runs STEPS cross-process all-reduces PAUSE seconds apart and exits 0.

  python tests/multihost/collectives.py PORT N I STEPS PAUSE
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from gqa_spec import distributed  # pylint: disable=g-import-not-at-top


def main(port: int, n: int, i: int, steps: int, pause: float) -> None:
  distributed.initialize(f'localhost:{port}', n, i, timeout=60)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  mesh = Mesh(np.asarray(jax.devices()), ('data',))
  total = jax.jit(lambda x: x.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))
  rows = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec('data')),
                                                np.ones((jax.local_device_count(),), np.float32))
  assert float(total(rows)) == jax.device_count()
  print('ready', flush=True)
  for _ in range(steps):
    time.sleep(pause)
    total(rows).block_until_ready()


if __name__ == '__main__':
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
