"""Outputs that are something else (issue 61): an output inside an input is refused; devices, FIFOs,
`-` and `/dev/stdout` are written in place; a symbolic link's target is written whole, the link
kept; an output folder that cannot be written is one line before any work; the temporaries of
killed writers are swept by the next write and listed by `status`; export-hf onto a full disk is
one line. Each refusal: exit status 2, one line on stderr, the earlier file or checkpoint intact."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import pytest

from gqa_spec import atomic, cli, rundir, rundir_lock, status
from gqa_spec.checkpoints import native
from gqa_spec.models.config import T5Config

CONFIG = T5Config(vocab_size=32, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                  num_encoder_layers=1, num_decoder_layers=1)
ENV = dict(os.environ, PYTHONPATH=os.getcwd())


@pytest.fixture(scope='module')
def work(tmp_path_factory):
  """A native checkpoint `ckpt` (no init to compile), a vocabulary file and an inputs file."""
  d = tmp_path_factory.mktemp('outputs')
  params = jax.tree.map(lambda x: jnp.full(x.shape, 0.5, x.dtype), native.abstract_params(CONFIG))
  native.save_checkpoint(str(d / 'ckpt'), CONFIG, params)
  (d / 'in.jsonl').write_text('{"input_ids": [5, 6, 1]}\n{"input_ids": [7, 1]}\n')
  (d / 'spm.model').write_bytes(b'spm')
  return d


def _fingerprint(directory):
  """Every file's bytes under `directory`, by relative path."""
  return {os.path.relpath(os.path.join(d, n), directory): open(os.path.join(d, n), 'rb').read()
          for d, _, names in os.walk(directory) for n in names}


def _one_line(capsys, code, expected):
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and err == [f'gqa-spec: error: {expected}'], (code, err)


def _generate(d, out, *extra):
  return cli.main(['generate', '--model', str(d / 'ckpt'), '--inputs', str(d / 'in.jsonl'),
                   '--out', str(out), '--max-decode-len', '4', '--batch-size', '2', *extra])


def test_an_output_inside_an_input_is_refused(work, tmp_path, capsys):
  ckpt = work / 'ckpt'
  before = _fingerprint(ckpt)
  run = tmp_path / 'run'  # a training run directory given as the model: checked before it loads
  (run / 'checkpoints').mkdir(parents=True)
  (run / 'best.json').write_text('{}')
  cases = [
      ([], ckpt / 'config.json', f'--out {ckpt}/config.json lies inside the input --model {ckpt}'),
      (['--draft', str(ckpt)], ckpt / 'params' / 'o.jsonl',
       f'--out {ckpt}/params/o.jsonl lies inside the input --model {ckpt}'),
      (['--vocab', str(work / 'spm.model')], work / 'spm.model',
       f'--out {work}/spm.model would replace the input --vocab; write elsewhere'),
  ]
  for extra, out, message in cases:
    _one_line(capsys, _generate(work, out, *extra),
              message + ('' if message.endswith('elsewhere') else '; write elsewhere'))
  _one_line(capsys, cli.main(['generate', '--model', str(run), '--inputs', str(work / 'in.jsonl'),
                              '--out', str(run / 'best.json')]),
            f'--out {run}/best.json lies inside the input --model {run}; write elsewhere')
  # A draft given as KIND:PATH names its file.
  bigram = tmp_path / 'bigram.npz'
  bigram.write_bytes(b'npz')
  _one_line(capsys, _generate(work, bigram, '--draft', f'bigram:{bigram}'),
            f'--out {bigram} would replace the input --draft; write elsewhere')
  # Directory outputs: inside the input checkpoint, or the input inside them.
  _one_line(capsys, cli.main(['convert', str(ckpt), str(ckpt / 'gqa'), '--kv-heads', '1',
                              '--method', 'mean', '--overwrite']),
            f'OUT_DIR {ckpt}/gqa lies inside the input CKPT_DIR {ckpt}; write elsewhere')
  _one_line(capsys, cli.main(['export-hf', str(ckpt), str(ckpt / 'params' / 'hf')]),
            f'HF_DIR {ckpt}/params/hf lies inside the input CKPT_DIR {ckpt}; write elsewhere')
  assert _fingerprint(ckpt) == before and (run / 'best.json').read_text() == '{}'
  native.load_checkpoint(str(ckpt))  # still loads


def test_streams_are_written_in_place_and_links_followed(work, tmp_path, capfd):
  # A character device (as /dev/null: root could replace it by a rename), a FIFO, `-` and a link
  # to /dev/stdout.
  null = tmp_path / 'null'
  try:
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
  except PermissionError:
    null = None  # no CAP_MKNOD: the FIFO and stdout cases still run
  if null is not None:
    assert _generate(work, null) == 0
    assert stat.S_ISCHR(os.stat(null).st_mode) and os.listdir(tmp_path) == ['null']
  fifo = tmp_path / 'fifo'
  os.mkfifo(fifo)
  read = []
  reader = threading.Thread(target=lambda: read.append(open(fifo).read()))
  reader.start()
  assert _generate(work, fifo) == 0
  reader.join(60)
  assert stat.S_ISFIFO(os.stat(fifo).st_mode)
  rows = [json.loads(line) for line in read[0].splitlines()]
  assert len(rows) == 2 and all('output_ids' in r for r in rows)
  capfd.readouterr()
  assert _generate(work, '-') == 0
  assert [json.loads(line) for line in capfd.readouterr().out.splitlines()] == rows
  link = tmp_path / 'stdout'
  os.symlink('/dev/stdout', link)
  assert _generate(work, link) == 0
  assert [json.loads(line) for line in capfd.readouterr().out.splitlines()] == rows
  assert os.readlink(link) == '/dev/stdout'
  # A link to a regular file: the target is written (whole), the link stays a link.
  target = tmp_path / 'real.jsonl'
  target.write_text('old\n')
  os.symlink(target.name, tmp_path / 'link.jsonl')
  assert _generate(work, tmp_path / 'link.jsonl') == 0
  assert os.path.islink(tmp_path / 'link.jsonl')
  assert [json.loads(line) for line in target.read_text().splitlines()] == rows
  assert not [n for n in os.listdir(tmp_path) if n.startswith('.')]


def test_convert_overwrite_onto_a_linked_out_dir_keeps_the_link(work, tmp_path, capsys):
  real, link = tmp_path / 'exports' / 'mqa', tmp_path / 'mqa'
  real.parent.mkdir()
  args = ['convert', str(work / 'ckpt'), str(link), '--kv-heads', '1', '--method', 'mean']
  real.mkdir()
  os.symlink(real, link)
  assert cli.main(args + ['--overwrite']) == 0
  assert os.path.islink(link) and os.readlink(link) == str(real)
  config, _, _ = native.load_checkpoint(str(link))
  assert config.num_kv_heads == 1 and os.listdir(real.parent) == ['mqa']
  # Replaced again, through the link, whole: still a link, still loadable, no temporary left.
  assert cli.main(args + ['--overwrite']) == 0
  assert os.path.islink(link) and native.load_checkpoint(str(link))[0].num_kv_heads == 1
  assert os.listdir(real.parent) == ['mqa'] and sorted(os.listdir(tmp_path)) == ['exports', 'mqa']
  capsys.readouterr()


def test_an_output_folder_that_cannot_be_written_is_one_line_before_any_work(
    tmp_path, monkeypatch, capsys):
  # The tests run as root, whom permission bits do not stop: os.access stands in for a read-only
  # folder here (a real read-only mount: the next test).
  readonly = tmp_path / 'ro'
  readonly.mkdir()
  real_access = os.access
  monkeypatch.setattr(os, 'access', lambda p, mode: str(p) != str(readonly)
                      and real_access(p, mode))
  missing = tmp_path / 'no_checkpoint'  # never read: the output is checked first
  code = cli.main(['eval', '--gin_file=runs/eval.gin', f"--gin.CHECKPOINT_PATH='{missing}'",
                   "--gin.MIXTURE_OR_TASK_NAME='synthetic'", f"--gin.OUTPUT_DIR='{readonly}'"])
  _one_line(capsys, code, f'OUTPUT_DIR {readonly}: not writable (permission denied)')
  code = cli.main(['eval', '--gin_file=runs/eval.gin', f"--gin.CHECKPOINT_PATH='{missing}'",
                   "--gin.MIXTURE_OR_TASK_NAME='synthetic'",
                   f"--gin.OUTPUT_DIR='{readonly}/new/deeper'"])
  _one_line(capsys, code, f'OUTPUT_DIR {readonly}/new/deeper: not writable (permission denied): '
                          f'{readonly}')
  run = readonly / 'run'
  run.mkdir()
  monkeypatch.setattr(os, 'access', lambda p, mode: str(p) != str(run) and real_access(p, mode))
  with pytest.raises(rundir_lock.UserError, match=(
      f'^{run}: cannot write the run directory \\(permission denied\\); give a writable '
      'directory$')):
    with rundir_lock.running(str(run)):
      pass
  assert os.listdir(run) == []


def _read_only_mount(tmp_path, command):
  """Runs `command` (a shell line; $RO is a read-only bind mount of a fresh folder) in a private
  mount namespace; skips where the machine allows none."""
  src, ro = tmp_path / 'src', tmp_path / 'ro'
  src.mkdir()
  ro.mkdir()
  script = (f'mount --bind {src} {ro} && mount -o remount,bind,ro {ro} || exit 99; '
            f'RO={ro}; {command}')
  if not shutil.which('unshare'):
    pytest.skip('no unshare(1)')
  proc = subprocess.run(['unshare', '-m', 'sh', '-c', script], capture_output=True, text=True,
                        env=ENV, timeout=300)
  if proc.returncode == 99 or 'unshare failed' in proc.stderr:
    pytest.skip(f'no private read-only mount here: {proc.stderr.strip()}')
  return proc, ro


def test_a_run_directory_on_a_read_only_mount_is_one_line(tmp_path):
  proc, ro = _read_only_mount(tmp_path, (
      f'{sys.executable} -m gqa_spec train --gin_file=runs/pretrain.gin '
      "--gin_file=models/t5_1_1/nano.gin --gin.MODEL_DIR=\"'$RO'\" "
      "--gin.MIXTURE_OR_TASK_NAME=\"'synthetic'\" --gin.TRAIN_STEPS=1 "
      "--gin.TASK_FEATURE_LENGTHS=\"{'inputs': 8, 'targets': 8}\""))
  err = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and err == [
      f'gqa-spec: error: {ro}: cannot write the run directory (read-only file system); give a '
      'writable directory'], proc.stderr


def _leftover(directory, name, pid, content='half', is_dir=False):
  path = os.path.join(directory, f'.{name}.tmp{pid}')
  if is_dir:
    os.makedirs(path)
    path_file = os.path.join(path, 'model.safetensors')
  else:
    path_file = path
  with open(path_file, 'w') as f:
    f.write(content)
  return path


def _dead_pid():
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


def test_a_writer_killed_mid_export_leaves_a_temporary_that_is_swept(work, tmp_path, capsys):
  # A real kill -9 while an export directory is being filled (`atomic.directory`, as export-hf,
  # convert and best/ are written).
  run = tmp_path / 'run'
  (run / 'checkpoints').mkdir(parents=True)
  shutil.copytree(work / 'ckpt', run / 'best')
  (run / 'best.json').write_text(json.dumps({'step': 1, 'metric': 'bleu', 'value': 1.0}))
  before = _fingerprint(run / 'best')
  writer = subprocess.Popen(
      [sys.executable, '-c', 'import sys, time; from gqa_spec import atomic\n'
       'with atomic.directory(sys.argv[1]) as tmp:\n'
       '  open(tmp + "/params.bin", "wb").write(bytes(3_000_000))\n'
       '  print("filling", flush=True); time.sleep(60)\n', str(run / 'best')],
      stdout=subprocess.PIPE, text=True, env=ENV)
  assert writer.stdout.readline() == 'filling\n'
  writer.send_signal(signal.SIGKILL)
  writer.wait()
  left = f'.best.tmp{writer.pid}'
  assert left in os.listdir(run) and _fingerprint(run / 'best') == before
  # A live writer's temporary (this process's own output, being written) is never swept, nor one
  # of another live process that started before it was written.
  alive = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
  try:
    time.sleep(0.1)
    live = _leftover(run, 'o.jsonl', alive.pid)
    os.utime(live, (time.time() + 5, time.time() + 5))
    reused = _leftover(run, 'best.json', alive.pid)  # pid reused: the process started after it
    os.utime(reused, (1.0e9, 1.0e9))
    lines = status.status(str(run))
    assert lines[-1] == (f'  left by killed writers (the next writer removes them): '
                         f'.best.json.tmp{alive.pid} (4e-06 MB), {left} (3 MB)')
    # The next write to the same target sweeps its own leftovers only.
    atomic.write_json(str(run / 'best.json'), {'step': 2, 'metric': 'bleu', 'value': 2.0})
    assert os.path.exists(live) and not os.path.exists(reused) and left in os.listdir(run)
    # A run's next writer (a resume takes the lock first) sweeps the whole run directory.
    with rundir_lock.running(str(run)):
      assert sorted(os.listdir(run)) == ['.o.jsonl.tmp%d' % alive.pid, rundir.RUNNING_FILE,
                                         'best', 'best.json', 'checkpoints']
    assert _fingerprint(run / 'best') == before
    assert not [ln for ln in status.status(str(run)) if 'left by killed writers' in ln]
  finally:
    alive.kill()
    alive.wait()


def test_a_replacement_cut_between_its_two_renames_is_put_back(tmp_path):
  # Where the kernel cannot swap two directories in one step, a directory is replaced in two
  # renames; a kill between them leaves the previous copy aside as .NAME.tmpPID.old.
  pid = _dead_pid()
  (tmp_path / 'best').mkdir()
  (tmp_path / 'best' / 'config.json').write_text('previous')
  os.rename(tmp_path / 'best', tmp_path / f'.best.tmp{pid}.old')
  _leftover(tmp_path, 'best', pid, 'new, maybe half', is_dir=True)
  assert atomic.sweep_all(str(tmp_path)) == [str(tmp_path / f'.best.tmp{pid}'),
                                             str(tmp_path / f'.best.tmp{pid}.old')]
  assert os.listdir(tmp_path) == ['best']
  assert (tmp_path / 'best' / 'config.json').read_text() == 'previous'


def test_export_hf_onto_a_full_disk_is_one_line(work, tmp_path, monkeypatch, capsys):
  from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  hf = tmp_path / 'hf'
  assert cli.main(['export-hf', str(work / 'ckpt'), str(hf)]) == 0
  before = _fingerprint(hf)

  def full_disk(tensors, filename, metadata=None):
    with open(filename, 'wb') as f:
      f.write(b'half a tensor')
    raise SafetensorError('Error while serializing: I/O error: No space left on device '
                          '(os error 28)')

  monkeypatch.setattr(safetensors.numpy, 'save_file', full_disk)
  capsys.readouterr()
  code = cli.main(['export-hf', str(work / 'ckpt'), str(hf), '--overwrite'])
  _one_line(capsys, code, f'{hf}: cannot write: No space left on device (ENOSPC); nothing was '
                          'written there')
  assert _fingerprint(hf) == before and sorted(os.listdir(tmp_path)) == ['hf']
  monkeypatch.undo()
  # The real writer against a real limit (a file-size limit: EFBIG), in a process of its own.
  limited = ('import resource, runpy, sys\n'
             'resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n'
             'sys.argv = ["gqa-spec"] + sys.argv[1:]\n'
             'runpy.run_module("gqa_spec", run_name="__main__")\n')
  proc = subprocess.run(
      [sys.executable, '-c', limited, 'export-hf', str(work / 'ckpt'), str(hf), '--overwrite'],
      capture_output=True, text=True, env=ENV, timeout=300)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1:] == [
      f'gqa-spec: error: {hf}: cannot write: File too large (EFBIG); nothing was written there'], \
      proc.stderr
  assert 'Traceback' not in proc.stderr
  assert _fingerprint(hf) == before and sorted(os.listdir(tmp_path)) == ['hf']


def test_atomic_errors_on_streams_name_the_stream(tmp_path):
  fifo = tmp_path / 'fifo'
  os.mkfifo(fifo)
  reader = threading.Thread(target=lambda: open(fifo).close())  # closes at once: EPIPE
  reader.start()
  with pytest.raises(atomic.WriteError, match=rf'^{fifo}: cannot write: Broken pipe \(EPIPE\)$'):
    with atomic.open_for_write(str(fifo)) as f:
      reader.join()
      f.write('x' * 1_000_000)
  assert stat.S_ISFIFO(os.stat(fifo).st_mode)
