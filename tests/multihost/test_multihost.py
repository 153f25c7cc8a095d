"""Two processes x 4 virtual CPU devices (JAX's multi-controller runtime, gloo collectives, on
localhost) against one process x 8 devices, on the same 2x4 mesh: `gqa-spec train`, a sharded
restore, a native export of parameters spread over the processes, and `gqa-spec generate` greedy
and speculative (model draft) give the one-process results; only process 0 writes and reports.
Then decoding: `gqa-spec eval` with beam search on a 4x2 mesh spanning both processes, `gqa-spec
infer` with beam search (each process on one device), `gqa-spec generate` with a token tree on a
4x2 mesh (`decode.py`) give the one-process outputs, and only process 0 writes and prints.

The three processes run `worker.py` side by side (starting one, with JAX's runtime and
TensorFlow, costs more than its work: so one process does all of the above in turn), each bounded
by a timeout and killed in a `finally`.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gqa_spec.checkpoints import native
from gqa_spec.checkpoints.load import load_any
from gqa_spec.models.config import T5Config
from gqa_spec.models.t5 import Transformer

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'worker.py')
TIMEOUT = 300
EVAL = 'predictions-ddtp_translate_en_de.jsonl'
INFER = 'ddtp_translate_en_de-predict.jsonl-00000-of-00001'


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def env(devices: int) -> dict:
  # the suite's cheap XLA flags (tests/conftest.py) first, the device count last so that it wins
  return dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=os.getcwd(), XLA_FLAGS=' '.join(
      filter(None, [os.environ.get('XLA_FLAGS'),
                    f'--xla_force_host_platform_device_count={devices}'])))


def run_all(commands, timeout=TIMEOUT):
  """Starts `(argv, env, log path)` processes side by side; their exit codes (None: timed out,
  killed). Every process still running at the end is killed."""
  procs = []
  try:
    for argv, environ, log in commands:
      with open(log, 'w') as f:
        procs.append(subprocess.Popen(argv, env=environ, stdout=f, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    codes = []
    for p in procs:
      try:
        codes.append(p.wait(timeout=timeout))
      except subprocess.TimeoutExpired:
        codes.append(None)
    return codes
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _decode_checkpoint(path: str) -> None:
  """tests/evaluation/test_infer.py's checkpoint: the tiny corpus's vocabulary, logits sharpened
  so that greedy and beam meet no near-tie."""
  config = T5Config(vocab_size=512, emb_dim=16, num_heads=2, num_kv_heads=2, head_dim=8,
                    mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1)
  tokens = jnp.ones((1, 3), jnp.int32)
  params = jax.tree.map(np.asarray, jax.jit(lambda: Transformer(config).init(
      jax.random.PRNGKey(0), tokens, tokens, tokens, enable_dropout=False)['params'])())
  params['decoder']['logits_dense']['kernel'] = params['decoder']['logits_dense']['kernel'] * 8
  native.save_checkpoint(path, config, params)


@pytest.fixture(scope='module')
def runs(tiny_data_dir, tmp_path_factory):
  one, two = tmp_path_factory.mktemp('one'), tmp_path_factory.mktemp('two')
  ckpt = str(tmp_path_factory.mktemp('decode') / 'ckpt')
  _decode_checkpoint(ckpt)
  data = {'GQA_SPEC_DATA_DIR': tiny_data_dir}
  port = free_port()
  codes = run_all(
      [([sys.executable, WORKER, str(one), '1', '0', '0', ckpt], dict(env(8), **data),
        one / 'log0')] +
      [([sys.executable, WORKER, str(two), '2', str(i), str(port), ckpt], dict(env(4), **data),
        two / f'log{i}') for i in (0, 1)])
  logs = [(one / 'log0').read_text()] + [(two / f'log{i}').read_text() for i in (0, 1)]
  assert codes == [0, 0, 0], '\n'.join(log[-3000:] for log in logs)
  return one, two, logs


def _losses(run_dir):
  with open(run_dir / 'run' / 'train_log.jsonl') as f:
    return [json.loads(line)['loss'] for line in f if '"train"' in line]


def test_training_equals_one_process(runs):
  one, two, _ = runs
  # Not bitwise: gloo's cross-process all-reduce sums in another order than XLA:CPU's in-process
  # one (~1e-6 relative on the losses here); a wrong global batch or a missed shard moves the
  # loss by whole percent.
  assert len(_losses(two)) == 6
  np.testing.assert_allclose(_losses(two), _losses(one), rtol=1e-5)
  # The 2-process checkpoint restored by one process on one device (another process count and
  # mesh) against the reference's. Adafactor divides each update by the root of its second-moment
  # estimate, which amplifies that rounding where a row's or column's gradients are all near 0 (the
  # update tends to the gradient's sign): single elements differed by up to 3e-2 in one of three
  # runs (gloo's order varies), the size of one step's update (learning rate 0.32 x the parameter's
  # RMS). So each tensor is compared as a whole: its difference's norm below 0.5% of its own norm
  # (that run: 0.03% at most), where steps 4-6 moved every tensor by 14% or more of its norm, so a
  # lost or doubled batch shard in any step would show.
  _, params_two, step_two = load_any(str(two / 'run'))
  _, params_one, step_one = load_any(str(one / 'run'))
  assert step_two == step_one == 6
  flat_two, flat_one = native._flat(params_two), native._flat(params_one)  # pylint: disable=protected-access
  assert sorted(flat_two) == sorted(flat_one)
  for name in flat_one:
    a, b = np.asarray(flat_two[name], np.float64), np.asarray(flat_one[name], np.float64)
    assert np.linalg.norm(a - b) <= 5e-3 * np.linalg.norm(b), (name, np.linalg.norm(a - b),
                                                               np.linalg.norm(b))


def test_native_export_of_spread_params(runs):
  one, two, _ = runs
  # Each run's export is bitwise its own last checkpoint (the worker asserted the parameters were
  # spread over the two processes before the export gathered them).
  for run in (one, two):
    _, exported, _ = native.load_checkpoint(str(run / 'export'))
    _, restored, _ = load_any(str(run / 'run'))
    for name, value in native._flat(restored).items():  # pylint: disable=protected-access
      np.testing.assert_array_equal(np.asarray(native._flat(exported)[name]), np.asarray(value),  # pylint: disable=protected-access
                                    err_msg=name)


def test_generate_equals_one_process(runs):
  one, two, _ = runs
  for name in ('greedy.jsonl', 'spec.jsonl', 'auto.jsonl'):
    got = (two / name).read_text().splitlines()
    assert len(got) == 5 and got == (one / name).read_text().splitlines(), name
  assert _lines(two / 'auto.jsonl') == _lines(two / 'greedy.jsonl')  # exact at temperature 0
  stats = json.loads((two / 'greedy_stats.json').read_text())
  assert stats['mesh'] == {'data': 8, 'model': 1}


def test_measured_numbers_are_process_zeros_everywhere(runs):
  """`--gamma auto`'s calibration (above) decides from wall times, which each process reads from
  its own clock: every process takes process 0's (`distributed.from_process_zero`), here on
  values that differ by process. Its batch of 8 rows is spread over both processes' devices: the
  calibration reads its arrays back with `partitioning.to_host` (a plain fetch failed there)."""
  _, _, logs = runs
  assert [re.findall(r'agreed: (.*)', log) for log in logs] == [['(0.5, 3.0)']] * 3
  stats = json.loads((runs[1] / 'auto_stats.json').read_text())
  assert stats['cost_ratio_measured'] and len(stats['verify_ratio']) == 2
  assert stats['batch_size'] == 8 and stats['mesh'] == {'data': 8, 'model': 1}


def _lines(path):
  return path.read_text().splitlines()


def test_eval_beam_equals_one_process(runs):
  one, two, _ = runs
  one, two = one / 'decode', two / 'decode'
  got = _lines(two / 'eval_beam' / EVAL)
  assert len(got) == 5 and got == _lines(one / 'eval_beam' / EVAL)
  report_two, report_one = (json.loads((run / 'eval_beam' / 'metrics.json').read_text())
                            for run in (two, one))
  quality = lambda r: {k: v for k, v in r['metrics'].items() if not k.startswith('timing/')}
  assert quality(report_two) == quality(report_one) and 'bleu' in report_two['metrics']
  assert report_two['mesh'] == report_one['mesh'] == {'data': 4, 'model': 2}


def test_infer_beam_and_generate_tree_equal_one_process(runs):
  one, two, _ = runs
  one, two = one / 'decode', two / 'decode'
  got = _lines(two / 'infer_beam' / INFER)
  assert len(got) == 5 and got == _lines(one / 'infer_beam' / INFER)
  got = _lines(two / 'tree.jsonl')
  assert len(got) == 5 and got == _lines(one / 'tree.jsonl')
  stats = [json.loads((run / 'tree_stats.json').read_text()) for run in (two, one)]
  assert stats[0]['mesh'] == stats[1]['mesh'] == {'data': 4, 'model': 2}
  for key in ('tokens', 'target_calls', 'accept_histogram', 'accepted_per_position', 'proposed',
              'accepted', 'draft_calls'):
    assert stats[0][key] == stats[1][key], key
  assert stats[0]['tree'] == 'topk:2,2' and stats[0]['accepted'] > 0


def test_only_process_zero_writes_and_reports(runs):
  _, two, logs = runs
  # process 1 ran the same command lines in two/p1 (`worker.py`): it wrote only its own inputs
  assert sorted(p.name for p in (two / 'p1').iterdir()) == ['decode', 'tiny.gin']
  assert 'step 6: loss=' in logs[1] and 'train step' in logs[1]
  assert 'step 6: loss=' not in logs[2] and 'train step' not in logs[2]
  decoded = two / 'p1' / 'decode'
  written = sorted(p.name for p in decoded.iterdir())
  assert written == ['eval_beam.stdout', 'infer_beam.stdout', 'inputs.jsonl', 'tree.stdout']
  for name in written[:2] + written[3:]:
    assert (decoded / name).read_text() == '', name
  for name in ('eval_beam', 'infer_beam'):
    assert (two / 'decode' / f'{name}.stdout').read_text() != ''


RESTORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'restore.py')


def _record(run, step=6):
  """The integrity record (every array's fingerprint) stored with the checkpoint at `step`."""
  return json.loads((run / 'checkpoints' / str(step) / 'meta' / 'metadata').read_text())['integrity']


@pytest.fixture(scope='module')
def restores(runs, tmp_path_factory):
  """The two-process run's checkpoint (2x4 mesh) restored by one process on a 1x8 mesh and saved;
  that restored by two processes on a 4x2 mesh and saved; and, beside it, a copy of the first whose
  integrity record names a wrong fingerprint for one array, restored by two processes."""
  _, two, _ = runs
  out = tmp_path_factory.mktemp('restores')
  codes = run_all([([sys.executable, RESTORE, str(two / 'run'), str(out / 'one'), '1', '8', '1',
                     '0', '0'], env(8), out / 'log_one')])
  assert codes == [0], (out / 'log_one').read_text()[-3000:]
  damaged = out / 'damaged'
  shutil.copytree(two / 'run', damaged)
  meta_file = damaged / 'checkpoints' / '6' / 'meta' / 'metadata'
  meta = json.loads(meta_file.read_text())
  name = 'params/decoder/layers_0/self_attention/key/kernel'
  fingerprint = meta['integrity']['arrays'][name]['fingerprint']
  meta['integrity']['arrays'][name]['fingerprint'] = f'{int(fingerprint, 16) ^ 1:08x}'
  meta_file.write_text(json.dumps(meta))
  port, port_damaged = free_port(), free_port()
  commands = [([sys.executable, RESTORE, str(out / 'one'), str(out / 'two'), '4', '2', '2', str(i),
                str(port)], env(4), out / f'log_two{i}') for i in (0, 1)]
  commands += [([sys.executable, RESTORE, str(damaged), str(out / 'unused'), '4', '2', '2', str(i),
                 str(port_damaged)], env(4), out / f'log_damaged{i}') for i in (0, 1)]
  codes = run_all(commands)
  logs = [path.read_text() for *_, path in commands]
  return out, name, codes, logs


def test_restores_into_other_process_counts_and_meshes(runs, restores):
  _, two, _ = runs
  out, _, codes, logs = restores
  assert codes[:2] == [0, 0], [log[-3000:] for log in logs[:2]]
  assert 'process 1: restored and saved step 6 on mesh 4x2' in logs[1]
  # 2 processes on 2x4 -> 1 process on 1x8 -> 2 processes on 4x2: the parameters bitwise, and the
  # whole state (optimizer statistics too) by the fingerprints each save recorded of what it held
  _, first, _ = load_any(str(two / 'run'))
  for run in (out / 'one', out / 'two'):
    _, params, step = load_any(str(run))
    assert step == 6
    for key, value in native._flat(first).items():  # pylint: disable=protected-access
      np.testing.assert_array_equal(np.asarray(native._flat(params)[key]), np.asarray(value),  # pylint: disable=protected-access
                                    err_msg=f'{run}: {key}')
    assert _record(run) == _record(two / 'run')


def test_integrity_is_checked_on_every_process(restores):
  out, name, codes, logs = restores
  assert codes[2:] == [1, 1], [log[-3000:] for log in logs[2:]]
  for i, log in enumerate(logs[2:]):
    assert re.search(rf'^process {i}: \S+/damaged/checkpoints/6: array {name} is corrupt '
                     r'\(fingerprint [0-9a-f]{8}, saved [0-9a-f]{8}\)', log, re.M), log[-3000:]
