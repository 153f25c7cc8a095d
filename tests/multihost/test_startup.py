"""Start-up of the multi-process runtime (`gqa_spec.distributed`): bad settings, a missing peer, a
port in use and processes that disagree end in one line within the timeout, before JAX starts
(the rendezvous runs first, so these run in the test's own process, peers as threads)."""

import argparse
import http.server
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from gqa_spec import distributed
from gqa_spec.errors import UserError


def _port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _together(*calls):
  """Runs `rendezvous(*args)` for each args tuple in threads; each one's error message or 'ok'."""
  results = [None] * len(calls)

  def run(k, args):
    try:
      for conn in distributed.rendezvous(*args).values():  # the links `_watch` would keep
        conn.close()
      results[k] = 'ok'
    except UserError as e:
      results[k] = str(e)

  threads = [threading.Thread(target=run, args=(k, args)) for k, args in enumerate(calls)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  return results


def test_all_processes_agree():
  address = f'localhost:{_port()}'
  assert _together((address, 3, 0, 10), (address, 3, 2, 10), (address, 3, 1, 10)) == ['ok'] * 3


def test_missing_peer_names_it_within_the_timeout():
  address = f'localhost:{_port()}'
  start = time.monotonic()
  errors = _together((address, 3, 0, 2), (address, 3, 1, 2))
  assert time.monotonic() - start < 10
  # process 0 names the missing one; the peer that came hears the same
  assert errors == [f'jax.distributed: process(es) 2 of 3 did not reach coordinator {address} '
                    'within 2 s'] * 2


def test_no_coordinator():
  with pytest.raises(UserError, match=r'process 1 got no answer from coordinator localhost:\d+ '
                                      r'within 1 s'):
    distributed.rendezvous(f'localhost:{_port()}', 2, 1, 1)


def test_mismatched_process_counts_and_ids():
  address = f'localhost:{_port()}'
  errors = _together((address, 2, 0, 10), (address, 3, 1, 10))
  assert errors == ['jax.distributed: process 1 was started with --num-processes 3, process 0 '
                    'with 2'] * 2
  address = f'localhost:{_port()}'
  errors = _together((address, 3, 0, 10), (address, 3, 1, 10), (address, 3, 1, 10))
  assert errors == ['jax.distributed: two processes were started with --process-id 1'] * 3


def test_port_in_use():
  with socket.create_server(('', 0)) as busy:
    port = busy.getsockname()[1]
    with pytest.raises(UserError, match=f'port {port} is in use on this host'):
      distributed.rendezvous(f'localhost:{port}', 2, 0, 5)


@pytest.mark.parametrize('argv, message', [
    (['--coordinator', 'h:1', '--num-processes', '2'], '--process-id missing'),
    (['--coordinator', 'nohost', '--num-processes', '2', '--process-id', '0'], 'is not HOST:PORT'),
    (['--coordinator', 'h:1', '--num-processes', '2', '--process-id', '2'], 'process id 2 outside'),
    (['--coordinator', 'h:1', '--num-processes', '0', '--process-id', '0'], 'must be >= 1'),
    (['--coordinator', 'h:99999', '--num-processes', '2', '--process-id', '0'], 'out of range'),
    (['--distributed-timeout', '5'], '--distributed-timeout applies to a multi-process start'),
])
def test_bad_flags(argv, message):
  parser = argparse.ArgumentParser()
  distributed.add_flags(parser)
  with pytest.raises(UserError, match=message):
    distributed.start_from_args(parser.parse_args(argv))


def test_no_flags_start_nothing():
  parser = argparse.ArgumentParser()
  distributed.add_flags(parser)
  assert distributed.start_from_args(parser.parse_args([])) is False


def _generate(tmp_path, *flags):
  (tmp_path / 'in.jsonl').write_text('{"input_ids": [5, 1]}\n')
  (tmp_path / 'model').mkdir(exist_ok=True)  # never read: start-up ends first
  return subprocess.run(
      [sys.executable, '-m', 'gqa_spec', 'generate', '--model', str(tmp_path / 'model'), '--inputs',
       str(tmp_path / 'in.jsonl'), '--out', str(tmp_path / 'out.jsonl'), *flags],
      capture_output=True, text=True, timeout=120)


def test_cli_missing_peer_is_one_line(tmp_path):
  address = f'localhost:{_port()}'
  result = _generate(tmp_path, '--coordinator', address, '--num-processes', '2', '--process-id',
                     '0', '--distributed-timeout', '1')
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      f'gqa-spec: error: jax.distributed: process(es) 1 of 2 did not reach coordinator {address} '
      'within 1 s']


def test_cli_auto_without_a_cluster_is_one_line(tmp_path, monkeypatch):
  for name in list(os.environ):  # no cluster for JAX to detect
    if name.startswith(('SLURM_', 'OMPI_', 'PMI_', 'TPU_')):
      monkeypatch.delenv(name)
  result = _generate(tmp_path, '--distributed', 'auto')
  assert result.returncode == 2, result.stderr
  [line] = result.stderr.strip().splitlines()
  assert line.startswith('gqa-spec: error: jax.distributed: no cluster detected'), line


def test_unresolvable_coordinator_host_ends_at_once(tmp_path):
  """Issue 61, case 7: a coordinator host name that does not resolve (both processes waited out
  the whole 300 s timeout, then blamed a missing process): one line, at once, on any process."""
  for i in (0, 1):
    start = time.monotonic()
    result = _generate(tmp_path, '--coordinator', 'no-such-host.invalid:1234', '--num-processes',
                       '2', '--process-id', str(i))
    assert result.returncode == 2 and time.monotonic() - start < 60, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("gqa-spec: error: coordinator no-such-host.invalid:1234: host name "
                           "'no-such-host.invalid' does not resolve ("), line
  assert not (tmp_path / 'out.jsonl').exists()


@pytest.fixture
def http_server():
  """Another program on the coordinator's port: an HTTP server."""
  server = http.server.HTTPServer(('localhost', 0), _Quiet)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield server.server_port
  server.shutdown()
  server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):  # pylint: disable=arguments-differ
    pass


def test_another_program_on_the_port_is_not_a_coordinator(http_server):
  """Issue 61, case 6: an HTTP server holds the coordinator's port (process 1 printed
  `jax.distributed: <!DOCTYPE HTML>`): the peer says at once that it is not ours."""
  start = time.monotonic()
  with pytest.raises(UserError) as e:
    distributed.rendezvous(f'localhost:{http_server}', 2, 1, 30)
  assert time.monotonic() - start < 5
  assert str(e.value) == (
      f'jax.distributed: coordinator localhost:{http_server} is not a gqa-spec coordinator (it '
      f"answered '<!DOCTYPE HTML>'): another program listens on port {http_server}")


def test_another_jax_coordinator_on_the_port_is_not_ours():
  """A gRPC server on the port (another job's JAX coordination service) answers in binary."""
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
  port = _port()
  service = _jax.get_distributed_runtime_service(f'[::]:{port}', 1)
  try:
    with pytest.raises(UserError, match=rf'^jax.distributed: coordinator localhost:{port} is not a '
                                        r'gqa-spec coordinator \(it answered in binary: another '
                                        r"job's JAX coordinator"):
      distributed.rendezvous(f'localhost:{port}', 2, 1, 30)
  finally:
    service.shutdown()


def test_cli_process_1_meeting_an_http_server_is_one_line(tmp_path, http_server):
  result = _generate(tmp_path, '--coordinator', f'localhost:{http_server}', '--num-processes',
                     '2', '--process-id', '1')
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      f'gqa-spec: error: jax.distributed: coordinator localhost:{http_server} is not a gqa-spec '
      f"coordinator (it answered '<!DOCTYPE HTML>'): another program listens on port "
      f'{http_server}']


def test_fingerprints_compare_contents_and_leave_out_the_process_id(tmp_path, monkeypatch):
  """What `distributed.agree` compares: options as written, a named file's bytes, a named model
  directory's config.json; not --process-id (nor a gin binding of it), nor --out's file."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'in.jsonl').write_text('{"input_ids": [5, 1]}\n')
  (tmp_path / 'o.jsonl').write_text('an earlier output\n')
  (tmp_path / 'model').mkdir()
  (tmp_path / 'model' / 'config.json').write_text('{"vocab_size": 384}')
  argv = lambda i: ['generate', '--model', 'model', '--inputs', 'in.jsonl', '--out', 'o.jsonl',
                    '--process-id', str(i), f'--gin_bindings=PartitioningConfig.process_id = {i}']
  zero = distributed.fingerprint(argv(0))
  assert [what for what, _ in zero] == [
      'the command', '--model', '--inputs', '--out', '--model model: its config.json',
      'the bytes of --inputs in.jsonl']
  assert distributed.differs([zero, distributed.fingerprint(argv(1))]) is None
  (tmp_path / 'model' / 'config.json').write_text('{"vocab_size": 512}')
  assert distributed.differs([zero, distributed.fingerprint(argv(1))]).startswith(
      'process 1 differs from process 0 in --model model: its config.json (sha256 ')
  zero = distributed.fingerprint(argv(0))
  assert distributed.differs([zero, zero, distributed.fingerprint(argv(1) + ['--seed', '3'])]) == (
      'process 2 differs from process 0 in --seed (3 against not given): every process must be '
      'given the same command, files and config')
