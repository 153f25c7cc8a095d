"""Sharded training on 8 virtual CPU devices equals single-device training (MHA, GQA, MQA);
sharded checkpoints restore into another mesh, their integrity fingerprints verified.

XLA's device count is fixed when jax initialises, so the check runs in a subprocess with
`--xla_force_host_platform_device_count=8`.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.mesh_flags import eight_device_xla_flags

_SCRIPT = textwrap.dedent('''
    import json, sys
    import jax, numpy as np
    from gqa_spec.models.config import T5Config
    from gqa_spec import partitioning
    from gqa_spec.checkpoints import integrity, manager
    from gqa_spec.training import data, optimizer, train_step

    assert jax.device_count() == 8, jax.devices()
    base = T5Config(vocab_size=256, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.1)
    cfg_data = data.DatasetConfig('synthetic', {'inputs': 16, 'targets': 8}, batch_size=8)
    batches = [b for _, b in zip(range(2), data.synthetic_batches(cfg_data, 8))]
    report, initials = {}, {}
    for kv_heads in (4, 2, 1):
      config = base.replace(num_kv_heads=kv_heads)
      runs, initial = {}, None
      for mesh in ((1, 1), (2, 4), (8, 1)):
        part = partitioning.Partitioner.create(config, *mesh,
                                               devices=jax.devices()[:mesh[0] * mesh[1]])
        step = train_step.TrainStep(config, optimizer.adafactor(min_dim_size_to_factor=16),
                                    optimizer.rsqrt_decay(warmup_steps=10), part)
        if initial is None:
          initial = initials[kv_heads] = jax.device_get(step.init(jax.random.PRNGKey(0)))
        state = jax.device_put(initial, step.state_shardings())
        losses = []
        for batch in batches:
          state, metrics = step(state, part.shard_batch(batch))
          losses.append(float(metrics['loss_sum']))
        kv = state.params['decoder']['layers_0']['self_attention']['key']['kernel']
        mlp = state.opt_state[0].v_col['decoder']['layers_0']['mlp']['wi_0']['kernel']
        runs[mesh] = (losses, jax.device_get(state.params))
        report[f'{kv_heads}/{mesh[0]}x{mesh[1]}'] = {
            'kv_spec': list(kv.sharding.spec), 'opt_spec': list(mlp.sharding.spec),
            'batch_spec': list(part.batch_sharding().spec)}
        if mesh != (1, 1):
          # Sharded reductions sum in another order, and Adafactor divides each update by its
          # RMS, so float32 rounding reaches ~5e-5 relative after two steps on some CPUs (CI saw
          # 3.9e-5). A wrongly sharded update would be off by a fraction of the update itself (learning rate
          # 10**-0.5 x the parameter scale), orders of magnitude more.
          np.testing.assert_allclose(losses, runs[(1, 1)][0], rtol=1e-5)
          jax.tree_util.tree_map(
              lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5),
              runs[mesh][1], runs[(1, 1)][1])
    # Sharded save on the 2x4 mesh, restore straight into the 8x1 layout.
    config = base.replace(num_kv_heads=4)
    saved = {}
    for mesh in ((2, 4), (8, 1)):
      part = partitioning.Partitioner.create(config, *mesh)
      step = train_step.TrainStep(config, optimizer.adafactor(min_dim_size_to_factor=16),
                                  optimizer.rsqrt_decay(warmup_steps=10), part)
      ckpt = manager.Checkpointer(sys.argv[1], save_period=1, asynchronous=False)
      if not saved:
        saved['state'] = jax.device_put(initials[4], step.state_shardings())
        ckpt.save(1, saved['state'], {'data_start_step': 0})
        # Fingerprints summed by XLA over the shards (2x4 mesh; what a GPU or multi-host run does)
        # equal numpy's over the same bytes on the host (what CPU arrays get).
        leaves = jax.tree_util.tree_leaves(saved['state'])
        on_mesh = jax.device_get(integrity._device_fingerprints(leaves))
        report['fingerprints_equal'] = [int(v) for v in on_mesh] == [
            integrity._host_fingerprint(x) for x in jax.device_get(leaves)]
      else:
        target = manager.abstract_with_shardings(step.abstract_state(),
                                                       step.state_shardings())
        restored, _ = ckpt.restore(1, target)  # verifies every array's fingerprint, resharded
        with open(sys.argv[1] + '/checkpoints/1/meta/metadata') as f:
          report['verified_arrays'] = len(json.load(f)['integrity']['arrays'])
        jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(restored),
                               jax.device_get(saved['state']))
        kv = restored.params['decoder']['layers_0']['self_attention']['key']['kernel']
        report['restored_kv_spec'] = list(kv.sharding.spec)
        report['restored_mesh'] = dict(kv.sharding.mesh.shape)
      ckpt.close()
    print('REPORT ' + json.dumps(report))
''')


@pytest.mark.slow
def test_sharded_train_step_matches_single_device(tmp_path):
  # Cheap XLA optimisation (the suite's): the 9 compiles dominate the test's time, not the steps.
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=eight_device_xla_flags())
  result = subprocess.run([sys.executable, '-c', _SCRIPT, str(tmp_path / 'ckpt')], env=env,
                          capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  report = json.loads(result.stdout.split('REPORT ', 1)[1])
  # 2x4 mesh: MHA's 4 K/V heads shard over the model axis; GQA-2 and MQA cannot and replicate.
  assert report['4/2x4']['kv_spec'] == [None, 'model']
  assert report['2/2x4']['kv_spec'] == [None, None]
  assert report['1/2x4']['kv_spec'] == [None, None]
  # Optimizer state follows its parameter: Adafactor's column statistics of wi_0 [32, 64] are [64].
  assert report['4/2x4']['opt_spec'] == ['model']
  assert report['4/8x1']['batch_spec'] == ['data']
  # Checkpoints are written sharded and restored into another mesh's layout.
  assert report['restored_mesh'] == {'data': 8, 'model': 1}
  assert report['restored_kv_spec'] == [None, None]
  # Integrity fingerprints: the same on the sharded arrays as on the host; verified on restore.
  assert report['fingerprints_equal']
  assert report['verified_arrays'] > 10
