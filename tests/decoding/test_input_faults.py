"""`generate`'s faults on the way in and out (issue 34): non-UTF-8 input named by file and line, a
row longer than the device can take refused before compiling (or cut with --truncate-inputs, with a
warning), and an --out that meets a full disk leaves the earlier file intact; each one line, exit
status 2."""

import errno
import json
import os

import jax
import jax.numpy as jnp
import pytest

from gqa_spec import cli
from gqa_spec.checkpoints import native
from gqa_spec.decoding import memory
from tests.decoding.conftest import tiny_config


@pytest.fixture(scope='module')
def ckpt(tmp_path_factory):
  path = tmp_path_factory.mktemp('faults') / 'ckpt'
  config = tiny_config(2)
  params = jax.tree.map(lambda x: jnp.full(x.shape, 0.5, x.dtype),  # no init to compile
                        native.abstract_params(config))
  native.save_checkpoint(str(path), config, params)
  return str(path)


def _argv(ckpt, inputs, out, *extra):
  return ['generate', '--model', ckpt, '--inputs', str(inputs), '--out', str(out),
          '--max-decode-len', '4', '--batch-size', '2', *extra]


def test_non_utf8_input_names_file_and_line(ckpt, tmp_path, capsys):
  inputs = tmp_path / 'in.jsonl'
  inputs.write_bytes(b'{"input_ids": [5, 6, 1]}\n\n{"inputs": "caf\xe9"}\n')
  assert cli.main(_argv(ckpt, inputs, tmp_path / 'o.jsonl')) == 2
  assert capsys.readouterr().err.splitlines() == [
      f'gqa-spec: error: {inputs}:3: not UTF-8 text (byte 0xe9 at column 16)']


def test_a_row_too_long_is_refused_or_cut(ckpt, tmp_path, capsys, monkeypatch):
  config = native.load_config(ckpt)
  estimate = memory.estimator(config, batch=2, cache_length=5)
  monkeypatch.setattr(memory, 'device_bytes', lambda: estimate(16))  # 16 tokens fit
  inputs, out = tmp_path / 'in.jsonl', tmp_path / 'o.jsonl'
  inputs.write_text(json.dumps({'input_ids': [5, 6, 1]}) + '\n' +
                    json.dumps({'input_ids': [7] * 39 + [1]}) + '\n')
  assert cli.main(_argv(ckpt, inputs, out)) == 2
  assert capsys.readouterr().err.splitlines() == [
      f'gqa-spec: error: {inputs}: input row 2 has 40 tokens, more than the 16 one device can '
      f'take at --batch-size 2 (about {estimate(40) / 2**30:.3g} GiB of '
      f'{estimate(16) / 2**30:.3g} GiB); pass --truncate-inputs to cut such rows, or lower '
      '--batch-size']
  assert not out.exists()
  # Cut, decoded, and then the --out write meets a full disk: the earlier file stays as it was
  # (one compile for both cases).
  out.write_text('earlier\n')

  def full(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, 'fsync', full)
  assert cli.main(_argv(ckpt, inputs, out, '--truncate-inputs')) == 2
  assert capsys.readouterr().err.splitlines() == [
      f'gqa-spec: warning: {inputs}: cut 1 input row(s) to 16 tokens (the longest, row 2, had 40)',
      f'gqa-spec: error: {out}: cannot write: No space left on device (ENOSPC); nothing was '
      'written there']
  assert out.read_text() == 'earlier\n' and sorted(os.listdir(tmp_path)) == ['in.jsonl', 'o.jsonl']
