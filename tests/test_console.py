"""Quiet start-up: TensorFlow's accelerator probing is hidden on CPU, real warnings are kept."""

import os
import subprocess
import sys

import pytest

from gqa_spec import cli, console


def test_filtered_stderr_drops_probing_noise_and_keeps_real_lines(capfd):
  with console.filtered_stderr():
    os.write(2, b'I0000 00:00:1.2 7531 cudart_stub.cc:31] Could not find cuda drivers on your '
                b'machine, GPU will not be used.\n')
    os.write(2, b'W0000 real_warning.cc:1] the disk is almost full\n')
    os.write(2, b'E0000 00:00:1.3 7531 cuda_platform.cc:52] failed call to cuInit: INTERNAL: '
                b'CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n')
  err = capfd.readouterr().err
  assert err == 'W0000 real_warning.cc:1] the disk is almost full\n'


def test_verbose_restores_tensorflow_logs(monkeypatch):
  monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '2')
  monkeypatch.setattr(sys, 'meta_path', list(sys.meta_path))
  sys.meta_path.insert(0, console._QuietTensorFlowFinder())  # as the package's import installs it
  console.setup(verbose=True, user_tf_level=False)
  assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '0'
  assert not any(isinstance(f, console._QuietTensorFlowFinder) for f in sys.meta_path)
  monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '3')
  console.setup(verbose=True, user_tf_level=True)  # the user's own setting wins
  assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '3'


def test_cli_start_up_on_cpu_is_quiet(tmp_path):
  # `data list` imports seqio, hence TensorFlow, whose import probes for CUDA on this machine.
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  result = subprocess.run([sys.executable, '-m', 'gqa_spec', 'data', 'list'], env=env,
                          capture_output=True, text=True, cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'ddtp_translate_en_de' in result.stdout
  assert 'tensorflow' not in result.stderr.lower() and not console.NOISE.search(result.stderr), \
      result.stderr
  assert result.stderr == '', result.stderr


def test_library_use_on_cpu_is_quiet(tmp_path):
  # The library, not the command: importing the DDTP tasks imports seqio, hence TensorFlow.
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  code = ('from gqa_spec.data import tasks; import tensorflow as tf; '
          'print(len(tf.config.list_physical_devices()))')
  result = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                          cwd=tmp_path)
  assert result.returncode == 0 and result.stdout.strip() == '1', result.stderr[-3000:]
  assert not console.NOISE.search(result.stderr), result.stderr


@pytest.mark.parametrize('argv, verbose', [
    (['train', '--gin_file=x.gin'], False), (['train', '--verbose', '--gin.A=1'], True),
    (['--verbose', 'reproduce'], True), (['reproduce', '--verbose'], True),
    (['status', '.'], False)])
def test_verbose_flag_before_or_after_the_command(argv, verbose):
  assert cli.build_parser().parse_args(argv).verbose is verbose
