"""Batch drift: how far a row's decoder logits move with the rows that share its batch (issue 37).

A 3+3-layer T5.1.1 (d_model 64, 4 heads of 16, d_ff 128, vocabulary 96) is built as an HF
`T5ForConditionalGeneration` whose weights are all drawn N(0, scale^2) (`scale` 1 gives logits of
magnitude ~30), then imported (`checkpoints.hf`). Four inputs of different lengths are decoded
greedily as one batch (padded to the longest row) and each alone (unpadded). Measured per seed:

* teacher-forced drift: max |logits(batch 4) - logits(batch 1)| over rows, positions and
  vocabulary, with each row's own batch-1 greedy tokens as decoder inputs: ours (jitted
  `Transformer`, each layer layout asked for) and HF's (torch, same weights and inputs,
  `attention_mask` given);
* cached greedy drift: the same for our decode-cache loop (`decode_cache.decode_tokens`, what
  decoding runs), along the batch-1 greedy path;
* rows whose greedy tokens differ between batch 4 and batch 1 (ours, and HF's `generate`).

Each figure is measured with the sums of RMSNorm's mean square and of the attention softmax as
they are now (`layers.mean_of_squares`, `layers.softmax`: on CPU an order-fixed halving sum),
as they were before (`plain`: `jnp.mean`, `jax.nn.softmax`, XLA's row reduction) and with the
halving sum in RMSNorm only (`norm`), swapped in for the measurement with compiled caches cleared
(`--reductions`), so one run shows all three.

  python -m benchmarks.batch_drift --seeds 0-15 --steps 24
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from typing import Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from gqa_spec.checkpoints import hf
from gqa_spec.models import attention
from gqa_spec.models import decode_cache as dc
from gqa_spec.models import layers
from gqa_spec.models import layout
from gqa_spec.models.t5 import Transformer

VOCAB = 96
LENGTHS = (40, 29, 17, 6)  # encoder lengths of the four rows; the batch is padded to 40
STEPS = 12


def hf_model(seed: int, scale: float = 1.0, d_model: int = 64):
  """An HF T5.1.1 (3+3 layers) whose weights (norm scales too) are all N(0, scale^2), eval mode."""
  import torch  # pylint: disable=g-import-not-at-top; torch is only needed here
  import transformers  # pylint: disable=g-import-not-at-top
  config = transformers.T5Config(
      vocab_size=VOCAB, d_model=d_model, d_kv=16, d_ff=2 * d_model, num_layers=3,
      num_decoder_layers=3, num_heads=4, feed_forward_proj='gated-gelu',
      tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
      eos_token_id=1)
  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(config)
  model.lm_head.weight = torch.nn.Parameter(torch.zeros(VOCAB, d_model))  # untied (T5.1.1)
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for _, p in sorted(model.named_parameters()):
      p.copy_(torch.randn(p.shape, generator=gen) * scale)
  return model.eval()


def import_model(model):
  """`(config, params)` of the HF `model`, imported as `checkpoints.hf.load_hf` would."""
  state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  config = hf.config_from_hf(model.config.to_dict())
  return config, hf.params_from_hf(state, config)


def inputs(seed: int, lengths: Sequence[int] = LENGTHS) -> np.ndarray:
  """`[len(lengths), max(lengths)]` int32 encoder tokens in 2..VOCAB-1, 0-padded on the right."""
  rng = np.random.default_rng(seed)
  enc = np.zeros((len(lengths), max(lengths)), np.int32)
  for i, n in enumerate(lengths):
    enc[i, :n] = rng.integers(2, VOCAB, n)
  return enc


# Jitted with the config static, so that every seed after the first reuses the compilations.
@functools.partial(jax.jit, static_argnums=0)
def _teacher_forced(config, params, enc, dec):
  return Transformer(config).apply({'params': params}, enc, dec, jnp.ones_like(dec),
                                   enable_dropout=False)  # [b, k, V]


@functools.partial(jax.jit, static_argnums=(0, 3))
def _start(config, params, enc, steps):
  model = Transformer(config)
  encoded = model.apply({'params': params}, enc, method=Transformer.encode)  # [b, S, emb]
  return dc.init_decode_cache(model, params, encoded, enc, steps)


@functools.partial(jax.jit, static_argnums=0)
def _step(config, params, cache, tokens):
  return dc.decode_tokens(Transformer(config), params, cache, tokens)  # [b, 1, V], cache


def teacher_forced(config, params, enc: np.ndarray, dec: np.ndarray) -> np.ndarray:
  """Our teacher-forced logits `[b, k, V]`."""
  return np.asarray(_teacher_forced(config, params, enc, dec))


def greedy(config, params, enc: np.ndarray, steps: int = STEPS, forced=None):
  """Our cached greedy decoding: `(tokens [b, steps], logits [b, steps, V])`. With `forced
  [b, steps]` those tokens are fed instead of the argmax (logits along a given path)."""
  cache = _start(config, params, enc, steps)
  token = jnp.zeros((enc.shape[0], 1), jnp.int32)  # [b, 1], the start token
  tokens, logits = [], []
  for t in range(steps):
    step_logits, cache = _step(config, params, cache, token)  # [b, 1, V]
    best = np.asarray(jnp.argmax(step_logits[:, 0], axis=-1))  # [b]
    tokens.append(best)
    logits.append(np.asarray(step_logits[:, 0]))
    token = jnp.asarray((best if forced is None else forced[:, t])[:, None], jnp.int32)
  return np.stack(tokens, 1), np.stack(logits, 1)


def hf_teacher_forced(model, enc: np.ndarray, dec: np.ndarray) -> np.ndarray:
  """HF's teacher-forced logits `[b, k, V]` (with `attention_mask`)."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    return model(input_ids=torch.as_tensor(enc, dtype=torch.long),
                 attention_mask=torch.as_tensor(enc > 0, dtype=torch.long),
                 decoder_input_ids=torch.as_tensor(dec, dtype=torch.long)).logits.numpy()


def hf_greedy(model, enc: np.ndarray, steps: int = STEPS) -> np.ndarray:
  """HF's greedy tokens `[b, steps]` (`generate`, no EOS stop)."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    out = model.generate(input_ids=torch.as_tensor(enc, dtype=torch.long),
                         attention_mask=torch.as_tensor(enc > 0, dtype=torch.long),
                         max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1,
                         decoder_start_token_id=0, eos_token_id=None, pad_token_id=0)
  return out.numpy()[:, 1:]


def rows_alone(enc: np.ndarray):
  """Each row of the padded batch alone and unpadded: `[1, length]` arrays."""
  return [enc[i:i + 1, :int((enc[i] > 0).sum())] for i in range(enc.shape[0])]


def drift(model, config, params, enc: np.ndarray, steps: int = STEPS,
          layouts: Sequence[str] = ('unrolled',), hf_too: bool = True) -> Dict[str, float]:
  """Batch-4-vs-batch-1 figures of one model and batch (see the module docstring)."""
  alone = rows_alone(enc)
  singles = [greedy(config, params, e, steps) for e in alone]
  tokens1 = np.concatenate([t for t, _ in singles])  # [b, steps]
  logits1 = np.concatenate([l for _, l in singles])  # [b, steps, V]
  dec = np.concatenate([np.zeros((enc.shape[0], 1), np.int32), tokens1[:, :-1]], 1)  # [b, steps]
  tokens4, _ = greedy(config, params, enc, steps)
  _, forced4 = greedy(config, params, enc, steps, forced=tokens1)  # along the batch-1 paths
  out = {'logit_max_abs': float(np.abs(logits1).max()),
         'ours_greedy_cached': float(np.abs(forced4 - logits1).max()),
         'ours_rows_changed': int((tokens4 != tokens1).any(1).sum())}
  for name in layouts:
    cfg, p = layout.for_decoding(config, params, name)
    batched = teacher_forced(cfg, p, enc, dec)  # [b, steps, V]
    out[f'ours_teacher_forced_{name}'] = max(
        float(np.abs(teacher_forced(cfg, p, e, dec[i:i + 1])[0] - batched[i]).max())
        for i, e in enumerate(alone))
  if hf_too:
    batched = hf_teacher_forced(model, enc, dec)
    out['hf_teacher_forced'] = max(
        float(np.abs(hf_teacher_forced(model, e, dec[i:i + 1])[0] - batched[i]).max())
        for i, e in enumerate(alone))
    hf1 = np.concatenate([hf_greedy(model, e, steps) for e in alone])
    out['hf_rows_changed'] = int((hf_greedy(model, enc, steps) != hf1).any(1).sum())
  return out


def _plain_mean_of_squares(x):
  return jnp.mean(jnp.square(x), axis=-1, keepdims=True)  # [..., 1], XLA's row reduction


def _plain_softmax(x):
  return jax.nn.softmax(x, axis=-1)  # XLA's row reduction for the sum


REDUCTIONS = {  # name -> (RMSNorm's mean square, attention's softmax)
    'plain': (_plain_mean_of_squares, _plain_softmax),  # both XLA's row reduction (before)
    'norm': (layers.mean_of_squares, _plain_softmax),  # the order-fixed sum in RMSNorm only
    'now': (layers.mean_of_squares, layers.softmax),  # and in the attention softmax (as now)
}


@contextlib.contextmanager
def reduction(name: str):
  """The sums of RMSNorm's mean square and of the attention softmax as `REDUCTIONS[name]`;
  compiled caches are cleared on the way in and out, as the jitted functions above bake them in."""
  if name not in REDUCTIONS:
    raise ValueError(f'unknown reduction {name!r}')
  saved = layers.mean_of_squares, attention.softmax
  layers.mean_of_squares, attention.softmax = REDUCTIONS[name]
  jax.clear_caches()
  try:
    yield
  finally:
    layers.mean_of_squares, attention.softmax = saved
    jax.clear_caches()


def _seeds(text: str) -> List[int]:
  first, _, last = text.partition('-')
  return list(range(int(first), int(last or first) + 1))


def measure(args: argparse.Namespace) -> List[Dict]:
  rows = []
  models = {seed: hf_model(seed, args.scale) for seed in _seeds(args.seeds)}
  for name in args.reductions:
    with reduction(name):
      for seed, model in models.items():
        config, params = import_model(model)
        row = {'reduction': name, 'seed': seed, 'scale': args.scale, 'steps': args.steps,
               **drift(model, config, params, inputs(seed), args.steps, args.layouts,
                       hf_too=name == args.reductions[0])}
        rows.append(row)
        common.print_row(row)
  hf_rows = {r['seed']: r for r in rows if 'hf_teacher_forced' in r}
  for r in rows:  # HF's figures do not depend on our reduction: measured once, copied
    r.update({k: v for k, v in hf_rows[r['seed']].items() if k.startswith('hf_')})
  return rows


def markdown(result: Dict) -> List[str]:
  lines = common.heading('Batch drift: batch 4 (padded) against batch 1', result['command'])
  layouts = [k[len('ours_teacher_forced_'):] for k in result['rows'][0]
             if k.startswith('ours_teacher_forced_')]
  lines += [
      'Max |logit difference| of a row decoded in a padded batch of 4 (encoder lengths '
      f'{", ".join(map(str, LENGTHS))}) and alone, over rows, {result["rows"][0]["steps"]} greedy '
      'steps and the vocabulary; a 3+3-layer T5.1.1 (d_model 64) with all weights N(0, '
      f'{result["rows"][0]["scale"]:g}^2), imported from HF. Teacher-forced: along each row\'s '
      'batch-1 greedy tokens; cached: our decode-cache loop along the same tokens. Rows changed: '
      'rows whose greedy tokens differ between batch 4 and batch 1. Reduction: the sums of '
      'RMSNorm\'s mean square and of the attention softmax: `plain` = XLA\'s row reduction in both '
      '(`jnp.mean`, `jax.nn.softmax`: before), `norm` = the order-fixed halving sum in RMSNorm '
      'only (`layers.mean_of_squares`), `now` = in both (`layers.softmax` too; on CPU).', '']
  lines += common.table_head(('reduction', 'seed', '|logit| max',
                              *[f'ours, teacher-forced ({n})' for n in layouts],
                              'ours, cached greedy', 'HF, teacher-forced', 'ours / HF',
                              'rows changed (ours / HF)'))
  for r in result['rows']:
    ours = max(r[f'ours_teacher_forced_{n}'] for n in layouts)
    lines.append(
        f"| {r['reduction']} | {r['seed']} | {r['logit_max_abs']:.1f} | "
        + ''.join(f"{r[f'ours_teacher_forced_{n}']:.2g} | " for n in layouts)
        + f"{r['ours_greedy_cached']:.2g} | {r['hf_teacher_forced']:.2g} | "
        f"{ours / max(r['hf_teacher_forced'], 1e-30):.2f} | "
        f"{r['ours_rows_changed']} / {r['hf_rows_changed']} |")
  for name in dict.fromkeys(r['reduction'] for r in result['rows']):
    sel = [r for r in result['rows'] if r['reduction'] == name]
    ours = [max(r[f'ours_teacher_forced_{n}'] for n in layouts) for r in sel]
    above = sum(o > r['hf_teacher_forced'] for o, r in zip(ours, sel))
    lines += ['', f"`{name}`: ours at most {max(ours):.2g} (median {np.median(ours):.2g}), HF at "
                  f"most {max(r['hf_teacher_forced'] for r in sel):.2g} (median "
                  f"{np.median([r['hf_teacher_forced'] for r in sel]):.2g}); ours above HF in "
                  f"{above} of {len(sel)} seeds."]
  lines += ['', '`norm` against `plain` is RMSNorm\'s sum, `now` against `norm` the attention '
                'softmax\'s: the halving sum is also padding-invariant there (masked keys weigh '
                'exactly 0 and sit past a row\'s real keys). What is left with `now` was not '
                'isolated: the remaining reductions on the path are the matmuls\' contractions '
                '(XLA:CPU\'s dot, over the features and, against the values, over the padded '
                'keys), left as they are.']
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--seeds', default='0-5', help='a seed or an inclusive range FIRST-LAST')
  parser.add_argument('--scale', type=float, default=1.0, help='std of every weight')
  parser.add_argument('--steps', type=int, default=STEPS, help='greedy steps per row')
  parser.add_argument('--reductions', nargs='+', default=['plain', 'norm', 'now'],
                      choices=list(REDUCTIONS))
  parser.add_argument('--layouts', nargs='+', default=['unrolled', 'scanned'],
                      choices=['unrolled', 'scanned'])
  return common.measure_and_write(__file__, parser, argv, measure, markdown)


if __name__ == '__main__':
  main()
