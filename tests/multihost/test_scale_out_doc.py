"""docs/scale-out.md's walk-through, run as written: two processes x 4 virtual CPU devices train,
one is killed (SIGKILL) after the first complete checkpoint, the other names it in one line and
exits; both resume from the last complete checkpoint to the end; `generate` over both processes
gives the one-process outputs; the resumed run's parameters are bitwise those of the same two
processes run without a loss (the test runs that beside the page), and within tolerance those of
an uninterrupted one-process run.

The page's `bash` blocks run in one `bash -e` process (the manual's mechanism,
`tests/test_manual.py`), shrunk only by the variables the page names (`MODEL_GIN`, `RUNS`, `PORT`). The test hook
`manager.STALL_ENV` makes every save wait 2 s before its commit, so the kill lands while the run
is still between checkpoint 2 and its end (a save cut off, or the steps before it), never after.
The script and every process it starts are one process group, killed when the test ends.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gqa_spec.checkpoints import manager, native
from gqa_spec.checkpoints.load import load_any
from tests.multihost.test_multihost import free_port
from tests.test_manual import REPO, blocks, refusal, script

PAGE = 'docs/scale-out.md'
TIMEOUT = 480
# The page's model, shrunk: nano's layout with one layer per stack and 256 tokens (its ids fit).
TINY_GIN = """
include 'models/t5_1_1/nano.gin'
from __gin__ import dynamic_registration
from gqa_spec.models import config
config.T5Config:
  vocab_size = 256
  emb_dim = 32
  num_heads = 4
  num_kv_heads = 2
  head_dim = 8
  mlp_dim = 64
  num_encoder_layers = 1
  num_decoder_layers = 1
"""
LOST = ('gqa-spec: error: jax.distributed: process 1 of 2 was lost (its connection to process 0 '
        'closed: killed, or its host down); stopping process 0')


def _page_blocks():
  with open(os.path.join(REPO, PAGE), encoding='utf-8') as f:
    return blocks(PAGE, f.read())


def test_page_blocks_run_or_say_why():
  found = _page_blocks()
  assert [r for b in found if (r := refusal(b)) is not None] == []
  assert sum(b.lang == 'bash' and not b.not_run for b in found) >= 5


# Beside the page, the test's own reference: the page's setup block, then its two training
# processes run to the end without a loss (another port, another run directory).
UNINTERRUPTED = """
"${train[@]}" --gin.MODEL_DIR="'$RUNS/uninterrupted'" $(process 0) > uninterrupted0.log 2>&1 & p0=$!
"${train[@]}" --gin.MODEL_DIR="'$RUNS/uninterrupted'" $(process 1) > uninterrupted1.log 2>&1
wait "$p0"
"""


@pytest.mark.slow  # ~110 s: ten processes, up to five at a time
def test_walk_through_as_written(tmp_path):
  runs, work, other = tmp_path / 'runs', tmp_path / 'work', tmp_path / 'uninterrupted'
  work.mkdir()
  other.mkdir()
  (tmp_path / 'tiny.gin').write_text(TINY_GIN)
  env = dict(os.environ, RUNS=str(runs), MODEL_GIN=str(tmp_path / 'tiny.gin'), JAX_PLATFORMS='cpu',
             **{manager.STALL_ENV: '2'})
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')]))
  env['PATH'] = os.pathsep.join([os.path.dirname(sys.executable), env.get('PATH', '')])
  page = _page_blocks()
  setup = next(b for b in page if b.lang == 'bash' and not b.not_run)
  start = time.monotonic()
  procs = [subprocess.Popen(['bash', '-c', code], cwd=cwd, env=dict(env, PORT=str(free_port())),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
           for code, cwd in ((script(page), work),
                             ('set -e\n' + setup.text + UNINTERRUPTED, other))]
  try:
    stdout, stderr = procs[0].communicate(timeout=TIMEOUT)
    reference = procs[1].communicate(timeout=max(TIMEOUT - (time.monotonic() - start), 1))
  finally:
    for proc in procs:
      try:  # the script, if it ran over, and any process it left behind
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      proc.wait()
  print(f'the walk-through ran in {time.monotonic() - start:.0f} s; its commands started at:')
  print('\n'.join(line[:160] for line in stderr.splitlines() if line.startswith('+ [')))
  logs = {p.name: p.read_text() for p in [*work.glob('*.log'), *other.glob('*.log')]}
  assert procs[0].returncode == 0, stdout[-2000:] + stderr[-4000:] + ''.join(
      f'\n--- {name}\n{text[-2000:]}' for name, text in logs.items())
  assert procs[1].returncode == 0, reference[1][-3000:] + ''.join(
      f'\n--- {name}\n{text[-2000:]}' for name, text in logs.items() if 'uninterrupted' in name)

  # The loss: process 0 exits 1 within seconds, its last line naming process 1.
  waited = re.search(r'^process 0 exited (\d+) after (\d+) s$', stdout, re.M)
  assert waited and waited.group(1) == '1' and int(waited.group(2)) < 60, stdout
  assert logs['train0.log'].strip().splitlines()[-1] == LOST
  # What the loss left: checkpoint 2 complete, nothing else under a step's name (a save cut off
  # stays a temporary directory, which the resume removes).
  # The listing is read between `tail -n 1 train0.log` and the resume's `tail`: the `generate`
  # processes print to the same stdout later, and their gloo lines interleave (a bare '7' seen).
  listing = stdout[stdout.index(LOST) + len(LOST):stdout.index('\nstep 6: loss=')]
  listed = re.findall(r'^(\d+)(\.orbax-checkpoint-tmp\S*)?$', listing, re.M)
  assert [step for step, tmp in listed if not tmp] == ['2'], stdout

  # The resume: both processes to step 6; process 0 alone reports.
  assert logs['resume0.log'].strip().splitlines()[-1].startswith('step 6: loss=')
  assert 'step 6' not in logs['resume1.log'] and 'train step' not in logs['resume1.log']
  steps = sorted(n for n in os.listdir(runs / 'two' / 'checkpoints') if n.isdigit())
  assert steps == ['2', '4', '6']

  # The resume is exact: the interrupted two-process run's parameters equal bitwise those of the
  # same two processes run without a loss, and so does every array of the whole train state
  # (optimizer statistics too: the fingerprints each save recorded). Two-process runs were bitwise
  # equal in every pair compared (tests/multihost/worker.py's, two hours apart, under other
  # loads): a cross-process sum of two addends does not depend on their order.
  _, uninterrupted, step = load_any(str(runs / 'uninterrupted'))
  assert step == 6
  interrupted = native._flat(load_any(str(runs / 'two'))[1])  # pylint: disable=protected-access
  for name, value in native._flat(uninterrupted).items():  # pylint: disable=protected-access
    np.testing.assert_array_equal(np.asarray(interrupted[name]), np.asarray(value), err_msg=name)
  for step in (2, 4, 6):
    records = [json.loads((runs / run / 'checkpoints' / str(step) / 'meta' / 'metadata').read_text(
        ))['integrity'] for run in ('two', 'uninterrupted')]
    assert records[0] == records[1], step

  # The parameters: the interrupted two-process run against the uninterrupted one-process run,
  # within test_multihost.py's tolerance (gloo sums in another order than XLA:CPU in-process; not
  # bitwise), where steps 3-6 moved every tensor by far more: a resume from the wrong step, data
  # position or optimizer state would show.
  _, two, step_two = load_any(str(runs / 'two'))
  _, one, step_one = load_any(str(runs / 'one'))
  _, one_at_2, _ = load_any(str(runs / 'one' / 'checkpoints' / '2'), model=True)
  assert step_two == step_one == 6
  flat = native._flat  # pylint: disable=protected-access
  two, one, one_at_2 = flat(two), flat(one), flat(one_at_2)
  assert sorted(two) == sorted(one)
  for name in one:
    a, b, c = (np.asarray(x[name], np.float64) for x in (two, one, one_at_2))
    assert np.linalg.norm(a - b) <= 5e-3 * np.linalg.norm(b), (name, np.linalg.norm(a - b))
    assert np.linalg.norm(b - c) >= 5e-2 * np.linalg.norm(b), (name, np.linalg.norm(b - c))

  # generate: two processes give the one-process outputs, and write one file.
  got = (work / 'two.jsonl').read_text().splitlines()
  assert len(got) == 3 and got == (work / 'one.jsonl').read_text().splitlines()
  assert 'generate: the same outputs on one and on two processes' in stdout
