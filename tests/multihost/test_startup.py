"""Start-up of the multi-process runtime (`gqa_spec.distributed`): bad settings, a missing peer, a
port in use and processes that disagree end in one line within the timeout, before JAX starts
(the rendezvous runs first, so these run in the test's own process, peers as threads)."""

import argparse
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
  return subprocess.run(
      [sys.executable, '-m', 'gqa_spec', 'generate', '--model', str(tmp_path), '--inputs',
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
