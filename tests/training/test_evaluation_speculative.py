"""`gqa-spec eval` with decoding='speculative': greedy's predictions and metrics, plus acceptance.

A tiny random-init checkpoint (vocabulary of the tiny DDTP corpus) is evaluated on a few validation
examples of the translation task, greedily and speculatively with a copy draft and with itself as
the draft (every proposal accepted).
"""

import json
import re

import pytest

from gqa_spec import cli
from gqa_spec.checkpoints import native
from gqa_spec.data import tasks, vocabulary
from gqa_spec.errors import UserError
from gqa_spec.evaluation import evaluator as evaluation
from tests.decoding.conftest import model_and_params

TASK = 'ddtp_translate_en_de'
LENGTHS = {'inputs': 32, 'targets': 10}
GAMMA = 4  # targets = 2 * (GAMMA + 1): a self-draft fills the length in whole target calls
EXAMPLES, BATCH = 6, 4  # two batches, the last one padded


@pytest.fixture(scope='module')
def ckpt(tiny_data_dir, tmp_path_factory):
  tasks.register_ddtp_tasks(tiny_data_dir)
  vocab = tasks.get(TASK).output_features['targets'].vocabulary
  # GQA (2 K/V heads of 4), seed 1: varied predictions of full length (seed 0 says one token, EOS).
  model, params = model_and_params(2, 1, vocab_size=vocabulary.padded_vocab_size(vocab))
  path = str(tmp_path_factory.mktemp('eval_speculative') / 'ckpt')
  native.save_checkpoint(path, model.config, params)
  yield path
  tasks.register_ddtp_tasks()  # back to the default data dir for other modules


def _read(out):
  with open(out / 'metrics.json') as f:
    report = json.load(f)
  with open(out / f'predictions-{TASK}.jsonl') as f:
    return report, [json.loads(line) for line in f]


def _evaluate(ckpt, out, **kwargs):
  evaluation.evaluate_checkpoint(ckpt, TASK, str(out), task_feature_lengths=LENGTHS,
                                 batch_size=BATCH, num_examples=EXAMPLES, **kwargs)
  return _read(out)


@pytest.fixture(scope='module')
def greedy(ckpt, tmp_path_factory):
  return _evaluate(ckpt, tmp_path_factory.mktemp('greedy'))


def _quality(metrics):
  return {k: v for k, v in metrics.items() if not k.startswith(('timing/', 'speculative/'))}


def test_copy_draft_gives_greedy_predictions_and_metrics(ckpt, greedy, tmp_path):
  report, predictions = _evaluate(ckpt, tmp_path, decoding='speculative', draft='copy',
                                  gamma=GAMMA)
  assert predictions == greedy[1] and len(predictions) == EXAMPLES
  assert len({p['prediction'] for p in predictions}) > 1
  assert _quality(report['metrics']) == _quality(greedy[0]['metrics'])
  assert 'bleu' in report['metrics'] and report['metrics']['timing/seconds_per_sample_median'] > 0
  assert report['decoding'] == 'speculative' and report['draft'] == 'copy'
  stats = report['speculative']
  assert stats['proposed'] == GAMMA * stats['target_calls'] > 0
  assert report['metrics']['speculative/acceptance_rate'] == stats['acceptance_rate']
  assert report['metrics']['speculative/mean_tokens_per_call'] >= 1.0
  assert len(stats['accepted_per_position']) == GAMMA


def test_self_draft_through_eval_gin_accepts_everything(ckpt, greedy, tmp_path):
  argv = ['eval', '--gin_file=runs/eval.gin', f"--gin.CHECKPOINT_PATH='{ckpt}'",
          f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'", f"--gin.OUTPUT_DIR='{tmp_path}'",
          f'--gin.TASK_FEATURE_LENGTHS={LENGTHS}', f'--gin.EVAL_BATCH_SIZE={BATCH}',
          f'--gin.EVAL_EXAMPLES={EXAMPLES}', "--gin.DECODING='speculative'",
          f"--gin.DRAFT='{ckpt}'", f'--gin.GAMMA={GAMMA}']
  assert cli.main(argv) == 0
  report, predictions = _read(tmp_path)
  assert predictions == greedy[1]
  assert _quality(report['metrics']) == _quality(greedy[0]['metrics'])
  metrics, stats = report['metrics'], report['speculative']
  assert report['gamma'] == GAMMA and stats['tokens'] > 0
  assert metrics['speculative/acceptance_rate'] == 1.0 and metrics['speculative/alpha'] > 0.99
  assert metrics['speculative/mean_tokens_per_call'] > 1.0
  assert stats['tokens'] == EXAMPLES * LENGTHS['targets']  # no EOS: whole calls of GAMMA + 1
  assert metrics['speculative/mean_tokens_per_call'] == GAMMA + 1


@pytest.mark.parametrize('kwargs, message', [
    ({'decoding': 'speculative'}, "'speculative' needs a draft"),
    ({'decoding': 'speculative', 'draft': 'nonsense'}, 'draft must be copy'),
    ({'decoding': 'greedy', 'draft': 'copy'}, 'only used by decoding'),
    ({'decoding': 'speculative', 'draft': 'copy', 'gamma': 0}, 'gamma must be >= 1'),
])
def test_bad_speculative_settings_are_one_line_errors(ckpt, kwargs, message):
  config = native.load_config(ckpt)
  with pytest.raises(UserError, match=message) as info:
    evaluation.InferenceEvaluator(TASK, config, task_feature_lengths=LENGTHS, **kwargs)
  assert '\n' not in str(info.value)


def test_eval_command_without_draft_is_a_one_line_error(ckpt, tmp_path, capsys):
  argv = ['eval', '--gin_file=runs/eval.gin', f"--gin.CHECKPOINT_PATH='{ckpt}'",
          f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'", f"--gin.OUTPUT_DIR='{tmp_path}'",
          "--gin.DECODING='speculative'"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.startswith('gqa-spec: error:') and 'needs a draft' in err


def test_eval_logs_progress_lines_per_batch(ckpt, tmp_path, caplog):
  caplog.set_level('INFO', 'gqa_spec.progress')
  _evaluate(ckpt, tmp_path)
  lines = [r.getMessage() for r in caplog.records if r.name == 'gqa_spec.progress']
  # Two batches (6 examples by 4): the first line and the last one, at least.
  assert re.match(r'eval validation batch 1(/2 \(50%\))? .*elapsed', lines[0]), lines
  assert re.match(r'eval validation batch 2(/2 \(100%\))? tokens/s \S+ elapsed', lines[-1]), lines


def test_predictions_carry_their_references_in_example_order(greedy, tiny_data_dir):
  from gqa_spec.data import corpus, ddtp  # pylint: disable=g-import-not-at-top
  pairs = [p for r in corpus.load_split(tiny_data_dir, 'validation')
           for p in ddtp.translation_pairs(r)]
  assert [p['target'] for p in greedy[1]] == [de for _, de in pairs[:EXAMPLES]]


def test_evaluators_in_shared_eval_data_build_seqio_data_once_and_score_alike(ckpt, monkeypatch):
  """`gqa-spec reproduce` validates several models on one task inside `shared_eval_data`: seqio's
  evaluator (examples and targets) is built once per (task, split, lengths, examples), each
  evaluator scores with its own copy, and the metrics and predictions are an unshared one's."""
  import seqio  # pylint: disable=g-import-not-at-top
  built = []
  real = seqio.Evaluator
  monkeypatch.setattr(seqio, 'Evaluator', lambda *a, **k: built.append(k['num_examples']) or
                      real(*a, **k))
  config, params, _ = native.load_checkpoint(ckpt)

  def make(examples=EXAMPLES):
    return evaluation.InferenceEvaluator(TASK, config, task_feature_lengths=LENGTHS,
                                         batch_size=BATCH, num_examples=examples)

  alone = make().run(params)
  with evaluation.shared_eval_data():
    first, second, fewer = make(), make(), make(EXAMPLES - 2)
    runs = [first.run(params), second.run(params)]
    assert len(fewer.run(params)[1][TASK]) == EXAMPLES - 2
  assert built == [EXAMPLES, EXAMPLES, EXAMPLES - 2]  # alone, the shared one, other examples
  assert first._evaluator is not second._evaluator  # pylint: disable=protected-access
  assert (first._evaluator.cached_task_datasets  # pylint: disable=protected-access
          is second._evaluator.cached_task_datasets)  # pylint: disable=protected-access
  for metrics, predictions in runs:
    assert _quality(metrics) == _quality(alone[0]) and predictions == alone[1]
  make().run(params)  # outside the block nothing is shared again
  assert len(built) == 4
