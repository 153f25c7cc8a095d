"""`gqa-spec eval` with decoding='speculative' and a token tree (gin `TREE`): greedy's predictions."""

import pytest

from gqa_spec import cli
from gqa_spec.checkpoints import native
from gqa_spec.errors import UserError
from gqa_spec.evaluation import evaluator as evaluation
from tests.training.test_evaluation_speculative import (BATCH, EXAMPLES, LENGTHS, TASK, _quality,
                                                        _read, ckpt, greedy)  # pylint: disable=unused-import


def test_self_draft_tree_through_eval_gin_gives_greedy_predictions(ckpt, greedy, tmp_path):  # pylint: disable=redefined-outer-name
  argv = ['eval', '--gin_file=runs/eval.gin', f"--gin.CHECKPOINT_PATH='{ckpt}'",
          f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'", f"--gin.OUTPUT_DIR='{tmp_path}'",
          f'--gin.TASK_FEATURE_LENGTHS={LENGTHS}', f'--gin.EVAL_BATCH_SIZE={BATCH}',
          f'--gin.EVAL_EXAMPLES={EXAMPLES}', "--gin.DECODING='speculative'",
          f"--gin.DRAFT='{ckpt}'", "--gin.TREE='topk:2,2'"]
  assert cli.main(argv) == 0
  report, predictions = _read(tmp_path)
  assert predictions == greedy[1]
  assert _quality(report['metrics']) == _quality(greedy[0]['metrics'])
  stats = report['speculative']
  assert report['tree'] == stats['tree'] == 'topk:2,2' and report['gamma'] is None
  # The greedy path is always in the tree: every call accepts both levels.
  assert stats['accept_histogram'][:2] == [0, 0] and stats['accept_histogram'][2] > 0
  assert stats['accepted_per_position'] == [stats['target_calls']] * 2


@pytest.mark.parametrize('kwargs, message', [
    ({'decoding': 'greedy', 'tree': 'topk:2'}, "only used by decoding 'speculative'"),
    ({'decoding': 'speculative', 'draft': 'copy', 'tree': 'topk:2'}, 'model draft'),
    ({'decoding': 'speculative', 'draft': 'copy', 'tree': 'best:2'}, 'tree must be'),
])
def test_bad_tree_settings_are_one_line_errors(ckpt, kwargs, message):  # pylint: disable=redefined-outer-name
  config = native.load_config(ckpt)
  with pytest.raises(UserError, match=message) as info:
    evaluation.InferenceEvaluator(TASK, config, task_feature_lengths=LENGTHS, **kwargs)
  assert '\n' not in str(info.value)
