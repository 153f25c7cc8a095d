"""A pair where speculation can pay on a CPU: a trained target widened to cost what a wider model
costs, computing what the trained one computes, and drafts of chosen acceptance.

  python -m benchmarks.widened SOURCE OUT --mlp-dim 16384 [--draft-noise 0.1,0.2]

writes OUT/target (SOURCE widened) and, for each noise scale s, OUT/noise_<s>: SOURCE at its own
width with s x (each array's std) Gaussian noise (`workloads.perturbed`, seed 1).

Speculation pays when a target call is dear and a draft call cheap (Leviathan et al. 2023, Sec. 3:
c small, and verifying gamma + 1 tokens costs about one call, as where a call is bound by reading
the weights). The models this CPU trains in a session are too small for that: their calls are
bound by dispatch and the loop. Widening the trained target's gated MLPs with zero units gives a
model whose every call reads and multiplies wide MLP weights, and whose outputs are the trained
model's: a new unit `j` has zero input columns (`wi_0[:, j] = wi_1[:, j] = 0`) and a zero output
row (`wo[j, :] = 0`), so whatever its activation of 0 it adds exact zeros to the residual stream.
Drafts made from the trained target (noise 0: the trained model itself, acceptance 1) cost what a
small model costs beside it, c ~0.1-0.2, with an acceptance the noise sets (on the cpu study's
target and its DDTP tasks, the calibration's alpha 0.82-0.95 at 0.1 and 0.70-0.78 at 0.2). The
encoder is widened alike (the config's `mlp_dim` is shared); it runs once per batch, before any
method's timed loop.

What is not the same: sums over more (zero) terms may be blocked differently by XLA, so logits can
move by rounding (tested), and a wide MLP on a narrow model (d_model 128) is not a real T5's shape.
It is a cost model, not a model. On XLA:CPU a call of 2+ tokens per row leaves the one-row
matrix-vector dots for YNNPACK fusions, which read these weights at a half to a sixth of the
speed: a verification call costs 1.4-2.0 one-token calls at batch 1
(`results/benchmarks/verify_width_cpu_widened.md`, `benchmarks/verify_width.py`).
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any, Tuple

import jax
import numpy as np

from benchmarks import workloads
from gqa_spec.models import layout
from gqa_spec.models.config import T5Config

Params = Any

_MLP_IN = re.compile(r'(^|/)mlp/wi(_\d+)?/kernel$')
_MLP_OUT = re.compile(r'(^|/)mlp/wo/kernel$')


def widen_mlp(params: Params, config: T5Config, mlp_dim: int) -> Tuple[Params, T5Config]:
  """`(params, config)` with every gated MLP `mlp_dim` wide, the new units all zero.

  Args:
    params: the flax 'params' tree of a T5 model with `config` (unrolled or scanned layers; the
      result has the same layout).
    config: its config.
    mlp_dim: the new MLP width, at least `config.mlp_dim`.
  """
  f = config.mlp_dim
  if mlp_dim < f:
    raise SystemExit(f'--mlp-dim {mlp_dim} is narrower than the model\'s {f}')
  widened = []

  def pad(path, x):
    name = '/'.join(str(getattr(k, 'key', k)) for k in path)
    x = np.asarray(x)
    if _MLP_IN.search(name):  # [d, F]: new columns
      assert x.shape[1] == f, (name, x.shape)
      widened.append(name)
      return np.pad(x, [(0, 0), (0, mlp_dim - f)])
    if _MLP_OUT.search(name):  # [F, d]: new rows
      assert x.shape[0] == f, (name, x.shape)
      widened.append(name)
      return np.pad(x, [(0, mlp_dim - f), (0, 0)])
    return x

  scanned = layout.is_scanned(params)  # widened one layer at a time, then stacked back
  out = jax.tree_util.tree_map_with_path(pad, layout.to_layout(params, False))
  if not widened:
    raise SystemExit('no mlp/wi*/kernel or mlp/wo/kernel parameters found to widen')
  return layout.to_layout(out, scanned), config.replace(mlp_dim=mlp_dim)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('source', help='a native checkpoint directory (e.g. <run>/best)')
  parser.add_argument('out', help='where target/ and noise_<s>/ are written (must not exist)')
  parser.add_argument('--mlp-dim', type=int, required=True, help="the target's new MLP width")
  parser.add_argument('--draft-noise', default='',
                      help='comma-separated noise scales, one draft each (e.g. 0.1,0.2)')
  args = parser.parse_args(argv)
  from gqa_spec.checkpoints import native  # pylint: disable=g-import-not-at-top
  noise = [float(x) for x in args.draft_noise.split(',') if x]
  if os.path.exists(args.out):
    raise SystemExit(f'{args.out} already exists')
  config, params, vocab = native.load_checkpoint(args.source)
  wide, wide_config = widen_mlp(params, config, args.mlp_dim)
  native.save_checkpoint(os.path.join(args.out, 'target'), wide_config, wide, vocab_path=vocab)
  mib = workloads.tree_bytes(wide) / 2**20
  print(f'{args.out}/target: mlp_dim {args.mlp_dim}, {mib:.0f} MiB of parameters')
  for scale in noise:
    path = os.path.join(args.out, f'noise_{scale:g}')
    native.save_checkpoint(path, config, workloads.perturbed(params, scale), vocab_path=vocab)
    print(f'{path}: {args.source} + {scale:g} x std noise')


if __name__ == '__main__':
  main()
