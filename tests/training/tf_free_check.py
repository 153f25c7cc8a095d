"""Train -> eval -> infer from an exported task with TensorFlow, seqio and gin unimportable, as on
a GPU image that has none of them; run by `test_tf_free.py`.

argv: NAME (`exported:DIR/TASK`) WORK_DIR. Prints one `REPORT <json>` line.
"""

import importlib.abc
import json
import sys

BLOCKED = ('tensorflow', 'tensorflow_datasets', 'tensorflow_text', 'seqio', 'gin')


class _Hide(importlib.abc.MetaPathFinder):
  """The interpreter's finders, blind to the blocked packages: they look not installed, both to
  `import` and to `importlib.util.find_spec` (which etils and orbax ask about TensorFlow)."""

  def __init__(self, finders):
    self._finders = finders

  def find_spec(self, fullname, path, target=None):
    if fullname.split('.')[0] in BLOCKED:
      return None
    for finder in self._finders:
      spec = finder.find_spec(fullname, path, target) if hasattr(finder, 'find_spec') else None
      if spec is not None:
        return spec
    return None


sys.meta_path[:] = [_Hide(list(sys.meta_path))]

# pylint: disable=g-import-not-at-top,wrong-import-position
from gqa_spec import cli
from gqa_spec.errors import UserError
from gqa_spec.evaluation import evaluator, infer
from gqa_spec.models.config import T5Config
from gqa_spec.reproduce import pipeline
from gqa_spec.training import data, gin_utils, optimizer, trainer

LENGTHS = {'inputs': 32, 'targets': 16}
CONFIG = T5Config(vocab_size=512, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                  num_encoder_layers=1, num_decoder_layers=1)


def main():
  name, work = sys.argv[1], sys.argv[2]
  model_dir = f'{work}/model'
  result = trainer.train(
      model_dir=model_dir, model_config=CONFIG,
      train_dataset_cfg=data.DatasetConfig(name, LENGTHS, batch_size=4),
      total_steps=100, optimizer=optimizer.adafactor(min_dim_size_to_factor=16),
      learning_rate_fn=optimizer.constant(0.02),
      checkpoint_cfg=trainer.CheckpointConfig(save_period=100, keep=1, asynchronous=False),
      progress_bar=False)
  metrics = evaluator.evaluate_checkpoint(model_dir, name, f'{work}/eval', split='validation',
                                          task_feature_lengths=LENGTHS, batch_size=4,
                                          num_examples=6)
  files = infer.infer(model_dir, name, f'{work}/infer', split='validation',
                      task_feature_lengths=LENGTHS, batch_size=4, num_examples=6)
  cli.build_parser()  # every command module, `reproduce` included, imports without them
  assert pipeline.STAGES
  try:
    gin_utils.parse(['runs/pretrain.gin'])
    gin_error = None
  except UserError as e:
    gin_error = str(e)
  loaded = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)
  print('REPORT ' + json.dumps({'step': result.step, 'train_loss': result.train_metrics['loss'],
                                'metrics': metrics, 'files': files, 'model_dir': model_dir,
                                'blocked_loaded': loaded, 'gin_error': gin_error}))


if __name__ == '__main__':
  main()
