"""A draft training run's record (`draft.json`) and loading a trained Chimera draft from its run.

`write_draft_file` records what a draft run trains (kind, target checkpoint, draft config), with
the target's path relative to the run directory, so a copied work dir resumes; a resume against a
different draft is refused. `load_chimera` restores the latest checkpoint of a Chimera run and
returns its config, parameters and the target checkpoint's path.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Tuple

import jax
import jax.numpy as jnp

from gqa_spec import atomic, distributed, rundir
from gqa_spec.checkpoints import manager
from gqa_spec.errors import UserError
from gqa_spec.models import chimera
from gqa_spec.rundir import DRAFT_FILE

PyTree = Any

# draft.json's fields and their types (`rundir.read_record`).
DRAFT_FIELDS = {'kind': str, 'target': str, 'draft_config': dict}


def write_draft_file(model_dir: str, kind: str, target_path: str, draft_config: Any) -> None:
  """Records what the run trains, so `load_chimera` and resumes can check it."""
  # The target is recorded relative to the run directory, so a copied work dir resumes.
  record = {'kind': kind, 'target': rundir.relative_to(target_path, model_dir),
            'draft_config': draft_config.to_dict()}
  path = os.path.join(model_dir, DRAFT_FILE)
  if os.path.isfile(path):
    old = rundir.read_record(path, DRAFT_FIELDS, 'draft run record')
    try:  # Config fields added since the record was written count at their defaults.
      old['draft_config'] = type(draft_config).from_dict(old['draft_config']).to_dict()
    except (KeyError, TypeError, ValueError):
      pass  # a record of another kind of draft, or of a newer version: it differs below
    # Older runs recorded an absolute target path: compare the paths they name.
    same_target = (rundir.resolve(old.get('target', ''), model_dir)
                   == rundir.resolve(record['target'], model_dir))
    if dict(old, target=record['target']) != record or not same_target:
      raise UserError(f'{path}: this MODEL_DIR trains a different draft ({old["kind"]} against '
                      f'{old["target"]}); use a new MODEL_DIR')
    return
  if distributed.is_writer():  # process 0 writes; another may find it written (the same record)
    os.makedirs(model_dir, exist_ok=True)
    atomic.write_json(path, record, indent=2)


@functools.lru_cache(maxsize=8)
def load_chimera(run_dir: str) -> Tuple[chimera.ChimeraConfig, PyTree, str]:
  """`(config, params, target checkpoint path)` of the latest checkpoint of a Chimera run."""
  path = os.path.join(run_dir, DRAFT_FILE)
  if not os.path.isfile(path):
    raise UserError(f'{run_dir}: not a draft training run (no {DRAFT_FILE})')
  record = rundir.read_record(path, DRAFT_FIELDS, 'draft run record')
  if record['kind'] != 'chimera':
    raise UserError(f'{run_dir}: trains a {record["kind"]} draft, not a Chimera draft')
  config = chimera.ChimeraConfig.from_dict(record['draft_config'])
  ckpt = manager.Checkpointer(run_dir)
  step = ckpt.latest_step()
  if step is None:
    raise UserError(f'{ckpt.directory}: holds no complete checkpoint')
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  d = config.emb_dim
  abstract = jax.eval_shape(lambda: chimera.Chimera(config).init(
      jax.random.PRNGKey(0), jnp.zeros((config.vocab_size, d)), jnp.zeros((1, 4), jnp.int32),
      jnp.zeros((1, 4, d)), jnp.zeros((1, 1), jnp.int32))['params'])
  target = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)
  params = ckpt.restore_params(step, target)
  ckpt.close()
  return config, params, rundir.resolve(record['target'], run_dir)
