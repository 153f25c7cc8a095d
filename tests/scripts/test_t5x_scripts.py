"""The nano DDTP recipe end to end through the t5x-style scripts, as a t5x user would run them:
pre-train (MHA) -> uptrain to GQA-2 -> fine-tune on translation -> eval -> infer, each a
`python scripts/<name>.py --gin_file=... --gin.MACRO=...` subprocess on the recipe's own gin files,
with tiny step counts and lengths (the recipe's model, nano, is unchanged)."""

import json
import os
import subprocess
import sys

import pytest

from gqa_spec.checkpoints import native
from gqa_spec.checkpoints.load import load_any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHRINK = ['--gin.BATCH_SIZE=2', '--gin.WARMUP_STEPS=1',
          '--gin_bindings=trainer.train.log_period = 1',
          '--gin_bindings=trainer.CheckpointConfig.save_period = 2']
SPAN = "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}"
TRANSLATE = "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}"


def run(script, *args, env):
  result = subprocess.run([sys.executable, os.path.join(REPO, 'scripts', script), *args],
                          env=env, capture_output=True, text=True, cwd=REPO)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.mark.slow
def test_nano_ddtp_recipe_through_the_scripts(tmp_path, tiny_data_dir):
  env = dict(os.environ, GQA_SPEC_DATA_DIR=tiny_data_dir, JAX_PLATFORMS='cpu',
             PYTHONPATH=REPO,
             XLA_FLAGS='--xla_backend_optimization_level=0 '
                       '--xla_llvm_disable_expensive_passes=true')
  mha, gqa, ft = (str(tmp_path / d) for d in ('mha', 'gqa', 'ft'))
  run('train.py', '--gin_file=experiments/nano_mha_pretrain_ddtp.gin', f"--gin.MODEL_DIR='{mha}'",
      '--gin.TRAIN_STEPS=2', SPAN, *SHRINK, env=env)
  assert load_any(mha)[2] == 2
  # The uptraining experiment through train.py (it configures uptrain.uptrain): alpha x 2 steps.
  out = run('train.py', '--gin_file=experiments/nano_uptrain_gqa2_ddtp.gin',
            f"--gin.MODEL_DIR='{gqa}'", f"--gin.INITIAL_CHECKPOINT_PATH='{mha}'", '--gin.ALPHA=1.0',
            SPAN, *SHRINK, env=env)
  config, _, step = load_any(gqa)
  assert config.num_kv_heads == 2 and step == 4, out.stdout
  run('train.py', '--gin_file=experiments/nano_finetune_translate_ddtp.gin',
      '--gin_file=models/attention/gqa.gin', f"--gin.INITIAL_CHECKPOINT_PATH='{gqa}'",
      f"--gin.MODEL_DIR='{ft}'", '--gin.TRAIN_STEPS=6', '--gin.EVAL_PERIOD=2',
      '--gin.EVAL_EXAMPLES=2', '--gin.EVAL_BATCH_SIZE=2', TRANSLATE, *SHRINK, env=env)
  assert load_any(ft)[2] == 6
  # The task's vocabulary travels: into each run dir, uptraining's converted/ and best/.
  for path in (mha, gqa, os.path.join(gqa, 'converted'), os.path.join(ft, 'best')):
    assert native.vocab_path(path), path
  # Text in, text out from the fine-tuned best/: the task's prefix applied to raw text.
  text_in, text_out = str(tmp_path / 'text.jsonl'), str(tmp_path / 'text_out.jsonl')
  with open(text_in, 'w') as f:
    f.write(json.dumps({'inputs': 'Real-time strategy game of ancient warfare'}) + '\n')
  result = subprocess.run([sys.executable, '-m', 'gqa_spec', 'generate', '--model',
                           os.path.join(ft, 'best'), '--task', 'ddtp_translate_en_de', '--inputs',
                           text_in, '--out', text_out, '--max-decode-len', '8'],
                          env=env, capture_output=True, text=True, cwd=REPO)
  assert result.returncode == 0, result.stderr[-3000:]
  line = json.loads(open(text_out).read())
  assert isinstance(line['output'], str) and isinstance(line['output_ids'], list)
  ev = str(tmp_path / 'eval')
  ev_run = run('eval.py', '--gin_file=experiments/nano_eval_translate_ddtp.gin',
               f"--gin.CHECKPOINT_PATH='{ft}'", f"--gin.EVAL_OUTPUT_DIR='{ev}'",  # t5x's macro name
               '--gin.EVAL_EXAMPLES=2', '--gin.EVAL_BATCH_SIZE=2', TRANSLATE, env=env)
  report = json.load(open(os.path.join(ev, 'metrics.json')))
  best_step = json.load(open(os.path.join(ft, 'best.json')))['step']  # a run dir evaluates best/
  assert report['step'] == best_step and 'bleu' in report['metrics']
  assert 'read only' not in ev_run.stderr  # orbax's absl warning, shown only with --verbose
  inf = str(tmp_path / 'infer')
  run('infer.py', '--gin_file=runs/infer.gin', f"--gin.CHECKPOINT_PATH='{ft}'",
      "--gin.MIXTURE_OR_TASK_NAME='ddtp_translate_en_de'", f"--gin.INFER_OUTPUT_DIR='{inf}'",
      "--gin.MODE='predict_with_aux'", '--gin.NUM_EXAMPLES=3', '--gin.BATCH_SIZE=2', TRANSLATE,
      env=env)
  name = 'ddtp_translate_en_de-predict_with_aux.jsonl-00000-of-00001'  # t5x's file name
  lines = [json.loads(l) for l in open(os.path.join(inf, name))]
  assert len(lines) == 3
  for line in lines:
    assert set(line) == {'inputs', 'prediction', 'aux'}
    assert line['inputs']['inputs_pretokenized'] and isinstance(line['prediction'], str)
    assert line['aux']['scores'] < 0  # a log-probability
  # infer's greedy (t5x_compat.temperature_sample, temperature 0) = eval's (gqa-spec's own loop)
  evaluated = [json.loads(l)
               for l in open(os.path.join(ev, 'predictions-ddtp_translate_en_de.jsonl'))]
  assert [l['prediction'] for l in evaluated] == [l['prediction'] for l in lines[:2]]
  # Speculative decoding through the DecodeFnCallable wrapper: greedy output, null scores.
  spec = str(tmp_path / 'infer_spec')
  run('infer.py', '--gin_file=runs/infer.gin', f"--gin.CHECKPOINT_PATH='{ft}'",
      "--gin.MIXTURE_OR_TASK_NAME='ddtp_translate_en_de'", f"--gin.INFER_OUTPUT_DIR='{spec}'",
      "--gin.MODE='predict_with_aux'", '--gin.NUM_EXAMPLES=3', '--gin.BATCH_SIZE=2', TRANSLATE,
      "--gin.DECODING='speculative'", "--gin.DRAFT='copy'", '--gin.GAMMA=2', env=env)
  speculative = [json.loads(l) for l in open(os.path.join(spec, name))]
  assert [l['prediction'] for l in speculative] == [l['prediction'] for l in lines]
  assert all(l['aux']['scores'] is None for l in speculative)
