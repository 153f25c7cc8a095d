"""Start-up of JAX's multi-controller runtime (`jax.distributed`): one process per host.

Every command that computes takes the same flags (`add_flags`); without them nothing changes (one
process, its local devices):

  --coordinator HOST:PORT --num-processes N --process-id I   every process, the same HOST:PORT
  --distributed auto                                         JAX detects the cluster (TPU pod,
                                                             SLURM, Open MPI); explicit flags win
  --distributed-timeout S                                    how long start-up waits for the peers

Gin users of `train` may set the same through `trainer.PartitioningConfig` (`multihost`,
`coordinator_address`, `num_processes`, `process_id`); both paths end in `initialize`.

Start-up never hangs: a coordinator host name that does not resolve ends at once; a missing peer,
a port in use or processes that disagree on N end in a `UserError` after at most `timeout` seconds
(`rendezvous`, a socket handshake before JAX starts); anything else answering on the coordinator's
port is "not a gqa-spec coordinator". Once JAX runs, the processes compare what each was given
(`expect`, `agree`: the command line, the files it names, a model's config.json), and a
difference ends every process with one line naming the process and what differs.
Once started, a process that dies is named in one line by every other one, which exits (`_watch`,
over the handshake's connections); JAX's heartbeat (`HEARTBEAT_SECONDS`) is the fallback, and
the only guard under `--distributed auto`. Only process 0 writes files (`is_writer`); every process
computes.

No JAX import at module level: the CLI registers its flags without starting JAX.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import hashlib
import json
import logging
import os
import re
import select
import socket
import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

from gqa_spec.errors import UserError

# Seconds start-up waits for every peer (a pod's hosts may start minutes apart) by default.
DEFAULT_TIMEOUT = 300
# Seconds without a heartbeat after which the coordinator declares a process dead (JAX: 100).
HEARTBEAT_SECONDS = 30
# Seconds a finishing process waits for the others at the exit barrier (JAX: 300).
SHUTDOWN_SECONDS = 60

# Seconds a connected peer waits for process 0's answer beyond the common deadline: a peer that came
# hears why start-up failed (a missing peer named by process 0), not only that it timed out.
_GRACE = 5
_ADDRESS = re.compile(r'^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$')
# The handshake's lines start with this word: a reply without it comes from another program.
_HELLO = 'gqa-spec'
# Files a fingerprint hashes whole up to this size; a larger one by its size and both ends.
_HASH_WHOLE = 256 << 20
_HASH_END = 16 << 20


def add_flags(parser: argparse.ArgumentParser) -> None:
  """Adds the start-up flags (module docstring) to a command's parser."""
  g = parser.add_argument_group('multi-process (jax.distributed; default: one process)')
  g.add_argument('--coordinator', metavar='HOST:PORT', default=None,
                 help='address of process 0, where the coordination service listens (same on '
                      'every process)')
  g.add_argument('--num-processes', type=int, metavar='N', default=None,
                 help='number of processes in the job')
  g.add_argument('--process-id', type=int, metavar='I', default=None,
                 help="this process's index, 0 .. N-1")
  g.add_argument('--distributed', choices=('auto',), default=None,
                 help="auto: JAX's cluster detection (TPU pod, SLURM, Open MPI) fills what the "
                      'three flags above leave out')
  g.add_argument('--distributed-timeout', type=int, metavar='S', default=None,
                 help=f'seconds start-up waits for every process (default {DEFAULT_TIMEOUT})')


def start_from_args(args: argparse.Namespace) -> bool:
  """Starts the runtime when the flags ask for it (before any JAX computation); whether it did."""
  given = {'--coordinator': args.coordinator, '--num-processes': args.num_processes,
           '--process-id': args.process_id}
  if args.distributed is None and all(v is None for v in given.values()):
    if args.distributed_timeout is not None:
      raise UserError('--distributed-timeout applies to a multi-process start: give --coordinator, '
                      '--num-processes and --process-id, or --distributed auto')
    return False
  if args.distributed is None:
    missing = [name for name, value in given.items() if value is None]
    if missing:
      raise UserError(f'{", ".join(missing)} missing: give --coordinator, --num-processes and '
                      '--process-id together, or --distributed auto')
  initialize(args.coordinator, args.num_processes, args.process_id,
             timeout=DEFAULT_TIMEOUT if args.distributed_timeout is None else args.distributed_timeout)
  if not is_writer():  # process 0 reports; the others only warn
    logging.getLogger('gqa_spec').setLevel(logging.WARNING)
  return True


def check(coordinator_address: Optional[str], num_processes: Optional[int],
          process_id: Optional[int], timeout: int = DEFAULT_TIMEOUT) -> None:
  """Raises `UserError` for settings that cannot work, before anything is started."""
  if coordinator_address is not None and not _ADDRESS.match(coordinator_address):
    raise UserError(f'coordinator {coordinator_address!r} is not HOST:PORT')
  if coordinator_address is not None and not 0 < int(coordinator_address.rsplit(':', 1)[1]) < 65536:
    raise UserError(f'coordinator {coordinator_address}: port out of range 1..65535')
  if num_processes is not None and num_processes < 1:
    raise UserError(f'number of processes must be >= 1, got {num_processes}')
  if process_id is not None and (process_id < 0 or (num_processes is not None and
                                                    process_id >= num_processes)):
    raise UserError(f'process id {process_id} outside 0..{(num_processes or 1) - 1}')
  if timeout < 1:
    raise UserError(f'distributed timeout must be >= 1 second, got {timeout}')


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, timeout: int = DEFAULT_TIMEOUT) -> None:
  """`jax.distributed.initialize` with bounded waits and one-line errors.

  Arguments left None are detected by JAX (TPU, SLURM, Open MPI). A second call (the CLI flags,
  then a gin `PartitioningConfig`) is a no-op when it asks for the same job, an error otherwise.

  Raises:
    UserError: bad settings, the coordinator's port in use, a peer missing after `timeout` s,
      processes that disagree, or a cluster JAX cannot detect.
  """
  check(coordinator_address, num_processes, process_id, timeout)
  if coordinator_address is not None:
    _resolve(coordinator_address)
  import jax  # pylint: disable=g-import-not-at-top; the CLI's flags come before JAX
  if jax.distributed.is_initialized():
    if ((num_processes is not None and num_processes != jax.process_count()) or
        (process_id is not None and process_id != jax.process_index())):
      raise UserError(f'jax.distributed already runs as process {jax.process_index()} of '
                      f'{jax.process_count()}; asked for process {process_id} of {num_processes}')
    agree(timeout)
    return
  links = {}
  if None not in (coordinator_address, num_processes, process_id) and num_processes > 1:
    links = rendezvous(coordinator_address, num_processes, process_id, timeout)
  where = f'coordinator {coordinator_address}' if coordinator_address else 'auto-detected cluster'
  try:
    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               initialization_timeout=timeout,
                               heartbeat_timeout_seconds=HEARTBEAT_SECONDS,
                               shutdown_timeout_seconds=SHUTDOWN_SECONDS)
  except Exception as e:  # pylint: disable=broad-except; XlaRuntimeError, ValueError, RuntimeError
    for conn in links.values():
      conn.close()
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if 'DEADLINE_EXCEEDED' in text or 'timed out' in text.lower():
      raise UserError(f'jax.distributed ({where}): not every process joined within {timeout} s '
                      f'(a peer missing, or given another --num-processes/--coordinator): '
                      f'{_short(text)}') from None
    if coordinator_address is None and 'should be defined' in text:
      raise UserError('jax.distributed: no cluster detected (TPU pod, SLURM, Open MPI) to fill in '
                      f'what the flags leave out ({_short(text)}); give --coordinator, '
                      '--num-processes and --process-id') from None
    raise UserError(f'jax.distributed ({where}): {_short(text)}') from None
  if links:
    _watch(links, process_id, num_processes)
  agree(timeout)


def _resolve(address: str) -> None:
  """Raises `UserError` at once when the coordinator's host name does not resolve (JAX's client
  would retry it until the start-up timeout, then blame a missing process)."""
  host, port = address.rsplit(':', 1)
  host = host.strip('[]')
  try:
    socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
  except (socket.gaierror, UnicodeError) as e:
    reason = getattr(e, 'strerror', None) or str(e)
    raise UserError(f'coordinator {address}: host name {host!r} does not resolve '
                    f'({reason})') from None


# What this process was given (`expect`), compared across processes once JAX runs (`agree`).
_given: Optional[Callable[[], List[Tuple[str, str]]]] = None
_agreed = None  # the `_given` last agreed on (a second `initialize` in one command checks nothing)
_checks = 0  # agreements so far: each has its own keys (a process may run several commands)


def expect(given: Optional[Callable[[], List[Tuple[str, str]]]]) -> None:
  """Registers what this process was given: a function returning `(what, value)` pairs (e.g.
  `fingerprint(argv)`), called when the runtime starts (`initialize`) and compared across the
  processes there (`agree`). The CLI registers each command's; None: nothing to compare."""
  global _given
  _given = given


def agree(timeout: float = DEFAULT_TIMEOUT) -> None:
  """Checks that every process was given the same (`expect`); a no-op on one process.

  Each process puts its pairs into JAX's key-value store and reads every other process's, so all
  of them reach the same verdict from the same data and all stop together.

  Raises:
    UserError: `process I differs from process 0 in WHAT (its value against process 0's)`, or a
      process that did not report within `timeout` s.
  """
  global _agreed, _checks
  if _given is None or _given is _agreed:
    return
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  client = jax_distributed.global_state.client
  count = jax_distributed.global_state.num_processes or 1
  if client is None or count == 1:
    return
  me = jax_distributed.global_state.process_id
  _agreed = _given
  _checks += 1
  key = f'gqa_spec/given/{_checks}/'
  client.key_value_set(key + str(me), json.dumps(_given()))
  given = []
  for process in range(count):
    try:
      given.append(json.loads(client.blocking_key_value_get(key + str(process),
                                                            int(timeout * 1000))))
    except Exception:  # pylint: disable=broad-except; XlaRuntimeError (DEADLINE_EXCEEDED)
      raise UserError(f'jax.distributed: process {process} did not say what it was given within '
                      f'{timeout:g} s (is it running the same command?)') from None
  difference = differs(given)
  if difference:
    raise UserError(difference)


def differs(given: Sequence[Sequence[Tuple[str, str]]]) -> Optional[str]:
  """The first difference between process 0's `(what, value)` pairs and another process's, as one
  line; None when all agree."""
  first = dict(map(tuple, given[0]))
  for process, pairs in enumerate(given[1:], 1):
    other = dict(map(tuple, pairs))
    for what in list(first) + [w for w in other if w not in first]:
      mine, theirs = first.get(what), other.get(what)
      if mine != theirs:
        show = lambda v: 'not given' if v is None else _short(v, 80)
        return (f'process {process} differs from process 0 in {what} ({show(theirs)} against '
                f'{show(mine)}): every process must be given the same command, files and config')
  return None


def fingerprint(argv: Sequence[str],
                files: Optional[Callable[[str, str], List[Tuple[str, str]]]] = None
                ) -> List[Tuple[str, str]]:
  """What a command line gives a process, as `(what, value)` pairs for `agree`.

  Every option with its values, as written (`--process-id` and gin bindings of a process id
  left out: they differ by design); the bytes of every file a value names (sha256), and the
  config.json of every directory a value names (a model's config) — except `--out` and
  `--stats`, which only process 0 writes. `files(option, value)` may name more files to hash for a
  value, as `(name, path)` (the gin file a `--gin_file` resolves to, and its includes: named as
  written, so that the difference found does not depend on where each process found them).
  """
  pairs, option, values = [], None, []

  def close():
    if option is not None or values:
      pairs.append((option or 'the command', list(values)))

  tokens = list(argv)
  i = 0
  while i < len(tokens):
    token = tokens[i]
    if token == '--process-id' or (token.startswith('--process-id=')):
      i += 1 if '=' in token else 2
      continue
    if token.startswith('-') and len(token) > 1 and not _number(token):
      close()
      option, eq, value = token.partition('=')
      values = [value] if eq else []
    else:
      values.append(token)
    i += 1
  close()
  pairs = [(o, v) for o, v in pairs
            if not (_process_id_binding(o) or any(map(_process_id_binding, v)))]
  seen = {}
  for o, v in pairs:  # a repeated option (--gin_file, --gin_bindings): its values in order
    seen[o] = ' '.join(v) if o not in seen else f'{seen[o]} | {" ".join(v)}'
  out = list(seen.items())
  for o, v in pairs:
    if o in ('--out', '--stats'):
      continue
    for value in v:
      bare = value.strip('\'"')
      named = [(bare, bare)] + (files(o, value) if files else [])
      if ':' in bare:  # a draft spec's path, `chimera:DIR`
        named.append((bare, bare.split(':', 1)[1]))
      for name, path in _unique(named):
        if os.path.isfile(path):
          out.append((f'the bytes of {o} {name}', _digest(path)))
        elif os.path.isdir(path) and os.path.isfile(os.path.join(path, 'config.json')):
          out.append((f'{o} {name}: its config.json', _digest(os.path.join(path, 'config.json'))))
  return out


def _unique(named):
  """`(name, path)` pairs, each path once (under the first name it came with)."""
  paths = {}
  for name, path in named:
    paths.setdefault(os.path.realpath(path), (name, path))
  return list(paths.values())


def _number(token: str) -> bool:
  try:
    float(token)
    return True
  except ValueError:
    return False


def _process_id_binding(text: str) -> bool:
  return 'process_id' in text.lower()


def _digest(path: str) -> str:
  """sha256 of a file's bytes (of its size and both ends beyond `_HASH_WHOLE`)."""
  h = hashlib.sha256()
  try:
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
      if size <= _HASH_WHOLE:
        for block in iter(lambda: f.read(1 << 20), b''):
          h.update(block)
      else:
        h.update(str(size).encode() + f.read(_HASH_END))
        f.seek(size - _HASH_END)
        h.update(f.read())
  except OSError as e:
    return f'unreadable ({e.strerror})'
  return f'sha256 {h.hexdigest()[:16]}'


def is_writer() -> bool:
  """Whether this process writes the files (process 0; always true on one process)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def from_process_zero(values: Sequence[float]) -> Tuple[float, ...]:
  """Process 0's `values` (numbers) on every process, as float32 (a collective: every process calls
  it); `values` itself on one process. For what is observed, not computed: wall times differ from
  process to process, and a decision taken from them (`--gamma auto`'s calibration, which
  programs to compile and run) must be the same on all, or one process waits on collectives the
  others never start. So must what a file check decides (`native.save_checkpoint`'s existing
  directory, `uptrain.convert_checkpoint`'s finished conversion): files process 0 writes appear
  while the others look."""
  import jax  # pylint: disable=g-import-not-at-top
  values = tuple(float(v) for v in values)
  if jax.process_count() == 1:
    return values
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  agreed = multihost_utils.broadcast_one_to_all(np.asarray(values, np.float32))
  return tuple(float(v) for v in np.asarray(agreed))


def _short(text: str, limit: int = 300) -> str:
  return text if len(text) <= limit else text[:limit] + '...'


def rendezvous(address: str, num_processes: int, process_id: int, timeout: float) -> dict:
  """Checks, before JAX starts, that all `num_processes` processes are there and agree.

  JAX's coordination client aborts the process (a C++ fatal error and a stack trace) when a peer
  is missing or late, so this plain-socket handshake runs first on the coordinator's port: process
  0 listens, every other process connects and sends its `(N, I)`, process 0 answers OK when all N-1
  distinct ids have come with its N, and then releases the port to JAX's coordination service
  (JAX's clients retry until it listens).

  Returns:
    The handshake's connections, kept open for `_watch`: process 0 holds one to every peer
    (process id -> socket), every peer one to process 0 ({0: socket}).

  Raises:
    UserError: the port is in use (process 0), a process missing after `timeout` s (naming the
      ids), or processes that disagree on N or share an id.
  """
  host, port = address.rsplit(':', 1)
  host = host.strip('[]')
  deadline = time.monotonic() + timeout
  if process_id == 0:
    return _host_rendezvous(address, int(port), num_processes, deadline, timeout)
  return _join_rendezvous(address, host, int(port), num_processes, process_id, deadline, timeout)


def _host_rendezvous(address, port, num_processes, deadline, timeout) -> dict:
  try:
    server = socket.create_server(('', port), family=socket.AF_INET6, dualstack_ipv6=True)
  except (OSError, ValueError):
    try:
      server = socket.create_server(('', port))
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        raise UserError(f'coordinator {address}: port {port} is in use on this host; pick a '
                        'free one') from None
      raise UserError(f'coordinator {address}: cannot listen on port {port} '
                      f'({e.strerror})') from None
  joined, conns, error = {}, [], None  # process id -> connection; every connection
  try:
    with server:
      while len(joined) < num_processes - 1 and error is None:
        left = deadline - time.monotonic()
        if left <= 0:
          missing = sorted(set(range(1, num_processes)) - set(joined))
          error = (f'process(es) {", ".join(map(str, missing))} of {num_processes} did not '
                   f'reach coordinator {address} within {timeout:g} s')
          break
        server.settimeout(left)
        try:
          conn, _ = server.accept()
        except socket.timeout:
          continue
        conn.settimeout(min(max(deadline - time.monotonic(), 1), 10))  # a peer says hello at once
        try:
          hello, n, i = _read_line(conn).split()
          if hello != _HELLO:
            raise ValueError(hello)
          n, i = int(n), int(i)
        except (OSError, ValueError):  # not one of ours (a port scanner, a stray client)
          conn.close()
          continue
        conns.append(conn)
        if n != num_processes:
          error = (f'process {i} was started with --num-processes {n}, process 0 with '
                   f'{num_processes}')
        elif i in joined:
          error = f'two processes were started with --process-id {i}'
        elif not 0 < i < num_processes:
          error = f'process id {i} outside 1..{num_processes - 1}'
        joined.setdefault(i, conn)
      for conn in conns:  # every process that came hears the outcome
        try:
          conn.sendall(f'{_HELLO} {"ERR " + error if error else "OK"}\n'.encode())
        except OSError:
          pass
  finally:
    if error or len(joined) < num_processes - 1:
      for conn in conns:
        conn.close()
  if error:
    raise UserError(f'jax.distributed: {error}')
  return joined


def _join_rendezvous(address, host, port, num_processes, process_id, deadline, timeout) -> dict:
  reply, conn = '', None
  while not reply:
    left = deadline - time.monotonic()
    if left <= 0:
      raise UserError(f'jax.distributed: process {process_id} got no answer from coordinator '
                      f'{address} within {timeout:g} s (is process 0 running, and every process '
                      'started?)')
    try:
      conn = socket.create_connection((host, port), timeout=min(left, 5))
      conn.sendall(f'{_HELLO} {num_processes} {process_id}\n'.encode())
      conn.settimeout(left + _GRACE)  # process 0's verdict (its deadline is ours) comes first
      reply = _read_line(conn, expect=_HELLO + ' ')
      if not reply:  # closed without a word: nobody is listening for good yet
        time.sleep(0.2)
    except socket.timeout:
      continue
    except OSError:
      time.sleep(0.2)  # not listening yet
    finally:
      if not reply and conn is not None:
        conn.close()
  if not reply.startswith(_HELLO + ' '):
    conn.close()
    said = (f'it answered {_short(reply, 60)!r}' if reply.isprintable() else
            'it answered in binary: another job\'s JAX coordinator, or another gRPC service')
    raise UserError(f'jax.distributed: coordinator {address} is not a gqa-spec coordinator '
                    f'({said}): another program listens on port {port}')
  reply = reply[len(_HELLO) + 1:]
  if reply != 'OK':
    conn.close()
    raise UserError(f'jax.distributed: {reply[4:] if reply.startswith("ERR ") else reply}')
  conn.settimeout(None)
  return {0: conn}


def _read_line(conn: socket.socket, expect: str = '') -> str:
  """One '\\n'-ended line, read byte by byte (no buffered reader that could swallow what follows).

  It stops early at the first byte that departs from `expect` (another program's reply: an HTTP/2
  server's binary preface holds no newline), and after 512 bytes.
  """
  data, want = b'', expect.encode()
  while not data.endswith(b'\n') and len(data) < 512:
    byte = conn.recv(1)
    if not byte:
      break
    data += byte
    n = min(len(data), len(want))
    if data[:n] != want[:n]:
      data += _drain(conn)  # for the message: the rest of what it sent at once
      break
  return data.decode(errors='replace').strip().splitlines()[0] if data.strip() else ''


def _drain(conn: socket.socket) -> bytes:
  conn.settimeout(0.2)
  try:
    return conn.recv(200)
  except OSError:
    return b''


_exiting = threading.Event()


def _watch(links: dict, process_id: int, num_processes: int) -> None:
  """Ends this process with one line when a peer dies (JAX's heartbeat would abort it only after
  `HEARTBEAT_SECONDS`, with pages of C++ log).

  The handshake's connections stay open: the kernel closes a killed process's sockets, so process
  0 sees a peer's connection close at once, tells the others which process was lost, and every
  process exits (code 1) naming it. A process that finishes says goodbye first (`atexit`), so an
  ordinary end is no loss. Checkpoints are renamed into place only when complete
  (`checkpoints/manager.py`), so an exit here never leaves one marked complete that is not.
  """
  # this process's stderr as it is now: fd 2 itself may be captured at the moment of the loss
  # (`console.filtered_stderr` around TensorFlow's import); no Python stream or lock either
  stderr = os.dup(2)

  def lost(message: str) -> None:
    if _exiting.is_set():
      return
    # JAX's own threads notice the loss too (its coordination agent logs "Polled an error from
    # coordination service" on fd 2): silence fd 2 first, so that our line stays the last one
    # (a test run saw that log line land between ours and the exit)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    os.write(stderr, f'gqa-spec: error: jax.distributed: {message}; stopping process '
                     f'{process_id}\n'.encode())
    os._exit(1)  # pylint: disable=protected-access; JAX's runtime cannot be shut down cleanly now

  def watch_peers() -> None:  # process 0
    live = dict(links)
    while live:
      ready, _, _ = select.select(list(live.values()), [], [])
      for conn in ready:
        peer = next(i for i, c in live.items() if c is conn)
        try:
          data = conn.recv(64)
        except OSError:
          data = b''
        if data.startswith(b'BYE'):
          del live[peer]
          continue
        for other in live.values():  # the others learn which process was lost
          if other is not conn:
            _send(other, f'LOST {peer}\n')
        lost(f'process {peer} of {num_processes} was lost (its connection to process 0 closed: '
             'killed, or its host down)')

  def watch_coordinator() -> None:  # every other process
    try:
      data = links[0].recv(64)
    except OSError:
      data = b''
    if data.startswith(b'BYE'):
      return
    if data.startswith(b'LOST '):
      lost(f'process {data.split()[1].decode()} of {num_processes} was lost (process 0 says)')
    lost(f'process 0 of {num_processes} was lost (its connection closed: killed, or its host '
         'down)')

  def goodbye() -> None:
    _exiting.set()
    for conn in links.values():
      _send(conn, 'BYE\n')

  atexit.register(goodbye)
  threading.Thread(target=watch_peers if process_id == 0 else watch_coordinator,
                   name='gqa-spec-peer-watch', daemon=True).start()


def _send(conn: socket.socket, text: str) -> None:
  try:
    conn.sendall(text.encode())
  except OSError:
    pass


