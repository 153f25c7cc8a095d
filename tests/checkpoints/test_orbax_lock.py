"""orbax operations started in threads side by side (`gqa-spec reproduce`'s `workers`): each
reads back the operation id it took, because `checkpoints.orbax_lock.LOCK` keeps orbax's
process-global id from changing under one operation while another starts. Without the lock the
widened window below lets a thread read the other's id (seen in the suite as a save waiting 300 s
for signals of another operation); the test then fails on `mixed`."""

import threading
import time

import jax
import numpy as np

from gqa_spec.checkpoints import manager, native
from tests.decoding.conftest import model_and_params

JOIN_SECONDS = 120


def test_saves_and_loads_in_threads_side_by_side_finish(tmp_path, monkeypatch):
  from orbax.checkpoint._src.futures import synchronization  # pylint: disable=g-import-not-at-top
  generator = synchronization.OperationIdGenerator
  real_next = generator.next_operation_id.__func__
  real_current = generator.get_current_operation_id.__func__
  taken, mixed = {}, []  # thread -> the id its operation took; ids read that are another's

  def slow_next(cls):  # another thread's operation may start between taking an id and reading it
    taken[threading.get_ident()] = value = real_next(cls)
    time.sleep(0.05)
    return value

  def checked_current(cls):
    current = real_current(cls)
    mine = taken.get(threading.get_ident())
    if mine is not None and int(current) != mine:
      mixed.append((mine, current))
    return current

  monkeypatch.setattr(generator, 'next_operation_id', classmethod(slow_next))
  monkeypatch.setattr(generator, 'get_current_operation_id', classmethod(checked_current))
  model, params = model_and_params(2)
  state = {'w': np.arange(6, dtype=np.float32)}
  errors, done = [], []

  def job(n):
    try:
      ckpt = manager.Checkpointer(str(tmp_path / f'run{n}'), save_period=1, keep=2,
                                  asynchronous=False)
      for step in range(1, 4):
        ckpt.save(step, jax.tree.map(lambda x: x + step, state), {'step': step})
      restored, _ = ckpt.restore(3, jax.tree.map(np.asarray, state))
      ckpt.close()
      native.save_checkpoint(str(tmp_path / f'native{n}'), model.config, params)
      _, loaded, _ = native.load_checkpoint(str(tmp_path / f'native{n}'))
      done.append((n, restored, loaded))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=job, args=(n,), daemon=True) for n in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(JOIN_SECONDS)
  assert not errors, errors
  assert not mixed, f'operations read another thread\'s operation id: {mixed}'
  assert len(taken) == 2  # both threads took ids: the check above saw both
  assert sorted(n for n, _, _ in done) == [0, 1], 'a thread never finished'
  for _, restored, loaded in done:
    np.testing.assert_array_equal(restored['w'], state['w'] + 3)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
