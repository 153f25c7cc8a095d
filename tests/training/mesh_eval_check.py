"""A sharded training run's in-loop evaluation vs its checkpoint evaluated on one device, and
`gqa-spec generate --model-parallel`, on 8 virtual CPU devices; run by `test_mesh_eval.py`.

argv: DATA_DIR (a prepared tiny DDTP corpus) WORK_DIR. Prints one `REPORT <json>` line.
"""

import json
import os
import sys

import jax

from gqa_spec import cli
from gqa_spec.data import tasks, vocabulary
from gqa_spec.models.config import T5Config
from gqa_spec.evaluation import evaluator as evaluation
from gqa_spec.training import data, optimizer, trainer

TASK = 'ddtp_translate_en_de'
LENGTHS = {'inputs': 32, 'targets': 10}


def main():
  data_dir, work = sys.argv[1], sys.argv[2]
  assert jax.device_count() == 8, jax.devices()
  tasks.register_ddtp_tasks(data_dir)
  vocab = tasks.get(TASK).output_features['targets'].vocabulary
  config = T5Config(vocab_size=vocabulary.padded_vocab_size(vocab), emb_dim=32, num_heads=4,
                    head_dim=8, mlp_dim=64, num_encoder_layers=1, num_decoder_layers=1,
                    num_kv_heads=2)
  evaluator = evaluation.InferenceEvaluator(TASK, config, task_feature_lengths=LENGTHS,
                                            batch_size=4, num_examples=6)
  seen = {}

  def recording(params, step):  # what the trainer hands the evaluator, and where it decodes
    leaf = params['decoder']['layers_0']['self_attention']['key']['kernel']
    seen['params_mesh'] = dict(leaf.sharding.mesh.shape)
    seen['params_kv_spec'] = [a for a in leaf.sharding.spec]
    metrics, predictions = evaluator.run(params, step)
    seen['in_loop_predictions'] = [p['prediction'] for p in predictions[TASK]]
    seen['decode_mesh'] = dict(evaluator._partitioner.mesh.shape)  # pylint: disable=protected-access
    return metrics

  model_dir = os.path.join(work, 'run')
  trainer.train(model_dir=model_dir, model_config=config,
                train_dataset_cfg=data.DatasetConfig('synthetic', {'inputs': 16, 'targets': 8},
                                                     batch_size=8),
                total_steps=1, optimizer=optimizer.adafactor(min_dim_size_to_factor=16),
                learning_rate_fn=optimizer.constant(0.01), random_seed=2,  # varied predictions
                partitioning=trainer.PartitioningConfig(model=2),
                checkpoint_cfg=trainer.CheckpointConfig(save_period=1, asynchronous=False),
                evaluator=recording, best_metric='bleu', progress_bar=False, log_period=100)
  records = [json.loads(line) for line in open(os.path.join(model_dir, 'train_log.jsonl'))]
  in_loop = [r for r in records if r['split'] == 'eval'][-1]
  single = evaluation.evaluate_checkpoint(model_dir, TASK, os.path.join(work, 'eval'),
                                          task_feature_lengths=LENGTHS, batch_size=4,
                                          num_examples=6)
  with open(os.path.join(work, 'eval', f'predictions-{TASK}.jsonl')) as f:
    predictions = [json.loads(line)['prediction'] for line in f]
  report = dict(seen, in_loop=in_loop, single=single, predictions=predictions)

  # `gqa-spec eval --model-parallel 2`: the run's checkpoint decoded on a 4x2 mesh.
  out = os.path.join(work, 'eval_mesh')
  assert cli.main(['eval', '--gin_file=runs/eval.gin', f"--gin.CHECKPOINT_PATH='{model_dir}'",
                   f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'", f"--gin.OUTPUT_DIR='{out}'",
                   f'--gin.TASK_FEATURE_LENGTHS={LENGTHS}', '--gin.EVAL_BATCH_SIZE=4',
                   '--gin.EVAL_EXAMPLES=6', '--model-parallel', '2']) == 0
  with open(os.path.join(out, 'metrics.json')) as f:
    report['eval_mesh'] = json.load(f)
  with open(os.path.join(out, f'predictions-{TASK}.jsonl')) as f:
    report['eval_mesh_predictions'] = [json.loads(line)['prediction'] for line in f]

  # `gqa-spec generate` on the exported best checkpoint: one device, a 4x2 mesh, and a 2x4 mesh
  # with the checkpoint as its own model draft (greedy: every proposal accepted).
  best = os.path.join(model_dir, 'best')
  inputs = os.path.join(work, 'in.jsonl')
  with open(inputs, 'w') as f:
    for ids in ([5, 9, 1], [17, 4, 8, 23, 1], [40, 41, 1], [7, 7, 7, 7, 7, 7, 1], [3, 1]):
      f.write(json.dumps({'input_ids': ids}) + '\n')  # 5 rows, batch 4: the last batch padded
  for name, extra in (('single', []), ('mesh', ['--model-parallel', '2']),
                      ('mesh_draft', ['--model-parallel', '4', '--draft', best, '--gamma', '2'])):
    out, stats = os.path.join(work, f'{name}.jsonl'), os.path.join(work, f'{name}.json')
    assert cli.main(['generate', '--model', best, '--inputs', inputs, '--out', out, '--stats',
                     stats, '--max-decode-len', '6', '--batch-size', '4', *extra]) == 0
    report[f'generate_{name}'] = {'outputs': open(out).read().splitlines(),
                                  'stats': json.load(open(stats))}
  print('REPORT ' + json.dumps(report))


if __name__ == '__main__':
  main()
