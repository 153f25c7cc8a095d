"""The scripts' own logic, without training: which command train.py runs, eval.py's t5x macro."""

import importlib.util
import os
from unittest import mock

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name):
  spec = importlib.util.spec_from_file_location(f'script_{name}',
                                                os.path.join(REPO, 'scripts', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize('argv,command', [
    (['--gin_file=experiments/nano_uptrain_gqa2_ddtp.gin',
      "--gin.INITIAL_CHECKPOINT_PATH='/tmp/x'", "--gin.MODEL_DIR='/tmp/y'"], 'uptrain'),
    (['--gin_file=experiments/nano_mha_pretrain_ddtp.gin', "--gin.MODEL_DIR='/tmp/y'"], 'train'),
    (['--gin_file=experiments/nano_finetune_translate_ddtp.gin'], 'train'),
    (['--gin_file=no_such_file.gin'], 'train'),  # `gqa-spec train` then reports it
    (['--help'], 'train'),
])
def test_train_script_picks_uptrain_for_the_uptraining_recipe(argv, command):
  train = load('train')
  with mock.patch.object(train.cli, 'main', return_value=0) as main:
    assert train.main(argv) == 0
  assert main.call_args[0][0] == [command] + argv


def test_eval_script_accepts_t5x_eval_output_dir():
  evaluate = load('eval')
  with mock.patch.object(evaluate.cli, 'main', return_value=0) as main:
    evaluate.main(['--gin_file=runs/eval.gin', "--gin.EVAL_OUTPUT_DIR='/tmp/e'",
                   '--gin.EVAL_OUTPUT_DIR', "'/tmp/f'", '--gin_bindings=A = 1'])
  assert main.call_args[0][0] == ['eval', '--gin_file=runs/eval.gin', "--gin.OUTPUT_DIR='/tmp/e'",
                                  '--gin.OUTPUT_DIR', "'/tmp/f'", '--gin_bindings=A = 1']


def test_infer_command_reports_bad_settings_in_one_line(capsys):
  infer = load('infer')
  code = infer.main(['--gin_file=runs/infer.gin', "--gin.CHECKPOINT_PATH='/tmp/x'",
                     "--gin.MIXTURE_OR_TASK_NAME='ddtp_translate_en_de'",
                     "--gin.INFER_OUTPUT_DIR='/tmp/y'", "--gin.DECODING='nucleus'"])
  assert code == 2
  assert "unknown decoding 'nucleus'" in capsys.readouterr().err
