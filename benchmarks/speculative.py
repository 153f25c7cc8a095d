"""What does speculative decoding buy? Chain, tree, staged, Chimera and `--gamma auto` against
greedy decoding and, with `--hf`, HF transformers' greedy and assisted generation, side by side.

  python -m benchmarks.speculative [--target CKPT --draft CKPT [--task TASK --data-dir DIR]] \
      [--batch-sizes 1,8] [--temperatures 0,1] [--gammas 2,4] [--gamma-max 8] \
      [--trees 'topk:4,2,2;best:16,depth:4'] [--stage2-gamma 3] [--staged-trees 'topk:4,1,1'] \
      [--no-chimera] [--hf] [--num-examples 8] [--max-decode-len 32] [--repeats 3] \
      [--out PATH] [--force]

For every (temperature, batch size) the methods decode the same batches, timed side by side
(`common.interleaved`: one untimed compiling run each, then `--repeats` rounds, the order rotated;
medians over rounds):
  greedy          our jitted autoregressive decoding (one target call per token);
  chain gamma=G   `speculative.decode` with the model draft, for each of `--gammas`;
  auto            `adaptive.decode` with the optimal policy calibrated on the first batch
                  (`cost_calibration.measure_costs`, as `generate --gamma auto`; not in the timed runs);
  tree SHAPE      `tree_speculative.decode` with the model draft growing each of `--trees`;
  staged          the model draft speculated by a bigram fitted on the draft's own greedy outputs
                  for other inputs, `--stage2-gamma` bigram tokens per draft call (chain gamma
                  max(--gammas)), and each of `--staged-trees` grown that way;
  chimera         a Chimera draft (`models.chimera`) of max(--gammas) heads on the target's hidden
                  states: untrained (each head the target's logits layer, `chimera.init_params`)
                  on the demo pair; `--chimera DIR` takes a `train-draft --kind chimera` run.
Reported: tokens per target call, tokens/s, speedup over greedy, token identity with greedy at
temperature 0, acceptance (accepted / proposed draft tokens), parameter bytes read per generated
token (Spector & Re Table 1's form: one read of a model's parameters per batched call; K/V not
counted) and, for chain rows, Leviathan et al.'s Theorem 8 with the measured acceptance and the
auto calibration's c.

`--hf` adds, at batch 1 and temperature 0 only, HF transformers on the same weights (our HF export,
float32, CPU or GPU): greedy `generate` and assisted generation with the model draft as assistant
(HF's default schedule); their seconds, tokens per call (a forward hook on the target's decoder)
and whether their tokens equal our greedy decoding's. HF's T5 has no K/V groups: MHA pairs only.

Without `--target` the pair is the built-in UNTRAINED demo (`workloads.demo_pair`): a random mini
target and its weights + noise as the draft (same size: c ~ 1, so no wall-time speedup is possible;
tokens per call and bytes per token are the meaningful columns).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from gqa_spec.decoding import (adaptive, autoregressive, cost_calibration, speculative, theory,
                               tree_speculative)
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.drafts import (ChimeraDraft, ModelDraft, StagedDraft, TreeModelDraft)
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import T5Decoder, cache_length
from gqa_spec.decoding.tree import TreeShape


def _ints(text: str) -> List[int]:
  return [int(x) for x in text.split(',') if x]


def chimera_draft(args, cfg, params, heads: int):
  """`(ChimeraDraft, init(enc), param bytes)`: `--chimera DIR`'s, else an untrained one."""
  from gqa_spec.models import chimera  # pylint: disable=g-import-not-at-top
  if args.chimera:
    from gqa_spec.checkpoints import drafts as draft_records  # pylint: disable=g-import-not-at-top
    cconfig, cparams, _ = draft_records.load_chimera(args.chimera)
  else:
    cconfig = chimera.ChimeraConfig(vocab_size=cfg.vocab_size, emb_dim=cfg.emb_dim,
                                    num_draft_heads=heads)
    cparams = chimera.init_params(cconfig, cfg, params, jax.random.PRNGKey(2))
  emb = params['token_embedder']['embedding']  # [V, D] the target's, Chimera's input
  table = jax.jit(chimera.trigram_table)(cparams, emb)  # [3, V, F] once, outside the timing
  draft = ChimeraDraft(cconfig)
  L = args.max_decode_len
  return (draft, lambda enc: draft.init(cparams, emb, enc.shape[0], L, table),
          workloads.tree_bytes(cparams))


def methods(args, target, params, draft_model, dparams, successor, chimera, config, cal):
  """name -> (run(enc) -> result, draft parameter bytes per draft call, draft calls per loop
  iteration; None: the result counts them, `draft_calls`)."""
  L, gammas, g2 = args.max_decode_len, _ints(args.gammas), args.stage2_gamma
  gmax = max(max(gammas), args.gamma_max)
  rng = jax.random.PRNGKey(1)
  chain, staged = ModelDraft.t5(draft_model), StagedDraft.t5(draft_model, g2)
  tree_draft, staged_tree = TreeModelDraft.t5(draft_model), TreeModelDraft.t5(draft_model, g2)
  dbytes = workloads.tree_bytes(dparams)
  out: Dict[str, Any] = {'greedy': (lambda enc: autoregressive.decode(
      target, target.init(params, enc, L + 1), rng, max_decode_len=L, config=config), 0, 0)}
  for g in gammas:
    slots = cache_length(L, g + 1)
    out[f'chain gamma={g}'] = (lambda enc, g=g, slots=slots: speculative.decode(
        target, target.init(params, enc, slots), chain, chain.init(dparams, enc, L, g), rng,
        gamma=g, max_decode_len=L, config=config), dbytes, g)
  auto = AdaptiveGamma(gamma_max=args.gamma_max, policy='optimal').calibrated(cal)
  out['auto'] = (lambda enc: adaptive.decode(
      target, target.init(params, enc, cache_length(L, auto.call_tokens)), chain,
      chain.init(dparams, enc, L, gmax), rng, adaptive=auto, max_decode_len=L, config=config),
                 dbytes, None)
  for spec in args.trees.split(';') if args.trees else []:
    shape = TreeShape.parse(spec)
    out[f'tree {shape.describe()}'] = (lambda enc, shape=shape: tree_speculative.decode(
        target, target.init(params, enc, cache_length(L, shape.num_nodes + 1)),
        tree_draft, tree_draft.init(dparams, enc, L, shape), rng, shape=shape,
        max_decode_len=L, config=config), dbytes, shape.depth)
  g = max(gammas)
  slots = cache_length(L, g + 1)
  out[f'staged gamma={g}, bigram {g2}/call'] = (lambda enc: speculative.decode(
      target, target.init(params, enc, slots), staged, staged.init(dparams, enc, L, g, successor),
      rng, gamma=g, max_decode_len=L, config=config), dbytes, None)
  for spec in args.staged_trees.split(';') if args.staged_trees else []:
    shape = TreeShape.parse(spec)
    out[f'staged tree {shape.describe()}, bigram {g2}/node'] = (
        lambda enc, shape=shape: tree_speculative.decode(
            target, target.init(params, enc, cache_length(L, shape.num_nodes + 1)),
            staged_tree, staged_tree.init(dparams, enc, L, shape, successor), rng, shape=shape,
            max_decode_len=L, config=config), dbytes, None)
  if chimera is not None:
    cdraft, cinit, cbytes = chimera
    out[f'chimera gamma={g}'] = (lambda enc: speculative.decode(
        target, target.init(params, enc, slots), cdraft, cinit(enc), rng, gamma=g,
        max_decode_len=L, config=config), cbytes, g)
  return out


def measure_cell(args, runs: Dict[str, Any], batches, temp: float, batch: int,
                 tbytes: int, c: float) -> List[Dict[str, Any]]:
  """The rows of one (temperature, batch size): every method timed side by side."""
  calls = {name: (lambda fn=fn: [fn(enc) for enc in batches]) for name, (fn, _, _) in runs.items()}
  times = common.interleaved(calls, args.repeats)
  results = {name: run() for name, run in calls.items()}
  strip = lambda res: sum((autoregressive.strip(r.sequences, r.lengths) for r in res), [])
  greedy_tokens = strip(results['greedy'])
  rows = []
  for name, res in results.items():
    secs = float(np.median(times[name]))
    tokens = sum(int(np.sum(np.asarray(r.lengths))) for r in res)
    iters = sum(int(r.loop_iterations) for r in res)  # batched target calls
    target_calls = sum(int(np.sum(np.asarray(r.target_calls))) if hasattr(r, 'target_calls')
                       else int(np.sum(np.asarray(r.lengths))) for r in res)
    _, bytes_per_call, per_iter = runs[name]
    draft_calls = (per_iter * iters if per_iter is not None else
                   sum(int(r.draft_calls) for r in res)
                   if getattr(res[0], 'draft_calls', None) is not None else None)
    row = {'method': name, 'temperature': temp, 'batch_size': batch, 'tokens': tokens,
           'seconds': secs, 'tokens_per_second': tokens / secs,
           'tokens_per_target_call': tokens / max(target_calls, 1), 'loop_iterations': iters,
           'target_param_bytes_per_token': tbytes * iters / tokens,
           'draft_param_bytes_per_token': (None if draft_calls is None
                                           else bytes_per_call * draft_calls / tokens),
           'tokens_equal_greedy': strip(res) == greedy_tokens if temp == 0 else None}
    if name != 'greedy' and getattr(res[0], 'proposed', None) is not None:
      accepted = sum(int(np.sum(np.asarray(r.accepted))) for r in res)
      proposed = sum(int(np.sum(np.asarray(r.proposed))) for r in res)
      row['acceptance'] = accepted / max(proposed, 1)
    if name.startswith('chain gamma=') and 'acceptance' in row:
      gamma = int(name.split('=')[1])
      row['c'] = c
      row['speedup_thm8'] = theory.walltime_improvement(min(row['acceptance'], 0.999), gamma, c)
    rows.append(row)
  for row in rows:
    row['x_greedy'] = row['tokens_per_second'] / rows[0]['tokens_per_second']
    common.print_row(row)
  return rows


class _CallCounter:
  """Counts forward calls of an HF model's decoder (one per target call; the encoder runs once)."""

  def __init__(self, model):
    self.calls = 0
    model.get_decoder().register_forward_hook(self._hook)

  def _hook(self, *_):
    self.calls += 1


def measure_hf(args, target_model, params, draft_model, dparams, inputs: np.ndarray,
               greedy: List[List[int]], greedy_tokens_per_second: float) -> List[Dict[str, Any]]:
  """HF greedy and assisted generation at batch 1, greedy, beside our greedy decoding (its
  tokens per input, `greedy`, and its tokens/s)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import hf  # pylint: disable=g-import-not-at-top
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  models = []
  with tempfile.TemporaryDirectory() as d:
    for name, model, p in (('target', target_model, params), ('draft', draft_model, dparams)):
      hf.save_hf(os.path.join(d, name), model.config.replace(param_dtype='float32'),
                 jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), p))
      models.append(transformers.T5ForConditionalGeneration.from_pretrained(
          os.path.join(d, name)).to(device).eval())
  hf_target, hf_draft = models
  counter = _CallCounter(hf_target)
  kw = dict(max_new_tokens=args.max_decode_len, do_sample=False, num_beams=1, eos_token_id=1,
            pad_token_id=0, decoder_start_token_id=0)

  def generate(**extra) -> List[List[int]]:
    outs = []
    with torch.no_grad():
      for row in inputs:
        ids = torch.from_numpy(row[None].astype(np.int64)).to(device)  # [1, S]
        out = hf_target.generate(ids, attention_mask=(ids != 0).long(), **kw, **extra)
        outs.append([int(t) for t in out[0, 1:] if t not in (0, 1)])
    return outs

  runs: Dict[str, Callable[[], Any]] = {
      'HF greedy': generate, 'HF assisted': lambda: generate(assistant_model=hf_draft)}
  times = common.interleaved(runs, args.repeats)
  rows = []
  for name, run in runs.items():
    counter.calls = 0
    tokens = run()
    secs = float(np.median(times[name]))
    count = sum(len(t) for t in tokens)
    rows.append({'method': name, 'temperature': 0.0, 'batch_size': 1, 'tokens': count,
                 'seconds': secs, 'tokens_per_second': count / secs,
                 'tokens_per_target_call': count / max(counter.calls, 1),
                 'tokens_equal_greedy': tokens == greedy, 'hf_device': device,
                 'x_greedy': count / secs / greedy_tokens_per_second})
    common.print_row(rows[-1])
  return rows


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--target', help='target checkpoint (default: the built-in demo pair)')
  p.add_argument('--draft', help='draft checkpoint (with --target)')
  p.add_argument('--task', help='decode this task\'s test inputs (default: synthetic inputs)')
  p.add_argument('--data-dir', help='the prepared DDTP data directory (with --task)')
  p.add_argument('--chimera', help='a `train-draft --kind chimera` run directory (with --target)')
  p.add_argument('--no-chimera', action='store_true', help='leave the Chimera rows out')
  p.add_argument('--num-examples', type=int, default=8)
  p.add_argument('--input-length', type=int, default=32)
  p.add_argument('--batch-sizes', default='1,8')
  p.add_argument('--max-decode-len', type=int, default=32)
  p.add_argument('--temperatures', default='0,1')
  p.add_argument('--gammas', default='2,4')
  p.add_argument('--gamma-max', type=int, default=8, help="`auto`'s largest gamma")
  p.add_argument('--trees', default='topk:4,2,2;best:16,depth:4')
  p.add_argument('--stage2-gamma', type=int, default=3)
  p.add_argument('--staged-trees', default='topk:4,1,1')
  p.add_argument('--perturb', type=float, default=0.05)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--hf', action='store_true',
                 help='also HF greedy and assisted generation (batch 1, temperature 0)')
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  if bool(args.target) != bool(args.draft):
    p.error('--target and --draft go together')
  if args.chimera and not args.target:
    p.error('--chimera goes with --target')
  if args.num_examples % max(_ints(args.batch_sizes)):
    p.error('--num-examples must be a multiple of every batch size')
  before = os.getloadavg()

  if args.target:
    target_model, params = workloads.checkpoint_model(args.target)
    draft_model, dparams = workloads.checkpoint_model(args.draft)
    pair = f'target {args.target}, draft {args.draft}'
  else:
    target_model, params, drafts = workloads.demo_pair(args.perturb)
    draft_model, dparams = drafts['perturbed']
    pair = (f'BUILT-IN DEMO PAIR (untrained): random-init mini target, draft = its weights + '
            f'{args.perturb} x std noise (same size: c ~ 1)')
  cfg, L = target_model.config, args.max_decode_len
  if args.task:
    inputs = workloads.task_inputs(args.task, args.data_dir, args.num_examples,
                                   args.input_length, L)
  else:
    inputs = workloads.synthetic_inputs(args.num_examples, args.input_length, cfg.vocab_size, 0)
  target = T5Decoder(target_model)
  successor = workloads.output_bigram(draft_model, dparams, args.input_length, L).successor()
  gmax = max(max(_ints(args.gammas)), args.gamma_max)
  chimera = (None if args.no_chimera
             else chimera_draft(args, cfg, params, max(_ints(args.gammas))))
  tbytes = workloads.tree_bytes(params)
  chain = ModelDraft.t5(draft_model)

  rows: List[Dict[str, Any]] = []

  def write(complete: bool) -> None:
    result = common.results(__file__, argv, rows, before, pair=pair, num_examples=len(inputs),
                            max_decode_len=L, complete=complete)
    common.write_report(args.out, result, markdown(result), args.force, partial=not complete)

  for temp in [float(t) for t in args.temperatures.split(',')]:
    config = SamplingConfig(temperature=temp)
    for batch in _ints(args.batch_sizes):
      batches = [jnp.asarray(inputs[i:i + batch]) for i in range(0, len(inputs), batch)]
      slots = cache_length(L, gmax + 1)
      cal = cost_calibration.measure_costs(
          target, target.init(params, batches[0], slots), chain,
          chain.init(dparams, batches[0], L, gmax), L, args.gamma_max, config=config)
      runs = methods(args, target, params, draft_model, dparams, successor, chimera, config, cal)
      cell = measure_cell(args, runs, batches, temp, batch, tbytes, cal.cost_ratio)
      rows.extend(cell)
      if args.hf and batch == 1 and temp == 0:
        res = [runs['greedy'][0](enc) for enc in batches]
        tokens = sum((autoregressive.strip(r.sequences, r.lengths) for r in res), [])
        rows.extend(measure_hf(args, target_model, params, draft_model, dparams, inputs, tokens,
                               cell[0]['tokens_per_second']))
      write(False)  # a run cut short keeps what it measured
      jax.clear_caches()
  write(True)
  return 0


def markdown(result: Dict[str, Any]) -> List[str]:
  mb = lambda x: '-' if x is None else f'{x / 1e6:.2f}'
  cells = []
  for r in result['rows']:
    thm = (f'{r["speedup_thm8"]:.2f}x (c {r["c"]:.2f})' if 'speedup_thm8' in r else '')
    cells.append((r['method'], f'{r["temperature"]:g}', r['batch_size'],
                  f'{r["tokens_per_target_call"]:.2f}', f'{r["tokens_per_second"]:.1f}',
                  f'{r["x_greedy"]:.2f}x',
                  '' if r.get('acceptance') is None else f'{r["acceptance"]:.2f}',
                  mb(r.get('target_param_bytes_per_token')),
                  mb(r.get('draft_param_bytes_per_token')),
                  '' if r['tokens_equal_greedy'] is None else r['tokens_equal_greedy'], thm))
  lines = common.table_report(
      'Speculative decoding: chain, tree, staged, Chimera and auto against greedy decoding',
      result,
      f'Pair: {result["pair"]}. {result["num_examples"]} inputs, max decode length '
      f'{result["max_decode_len"]}; methods interleaved in one run, median of repeats. x greedy: '
      'tokens/s over greedy decoding in the same cell; acc.: accepted / proposed draft tokens; '
      'MB/tok: parameters read per generated token (K/V not counted); = greedy: the same tokens '
      "as greedy decoding (T = 0); Thm 8: Leviathan et al.'s prediction with the measured "
      "acceptance and the auto calibration's c. HF rows: transformers on the same weights, "
      'batch 1, greedy.',
      ['method', 'T', 'batch', 'tok/call', 'tok/s', 'x greedy', 'acc.', 'target MB/tok',
       'draft MB/tok', '= greedy', 'Thm 8'], cells)
  if not result.get('complete', True):
    lines += ['', '**Partial**: the run stopped after the rows above; the command asks for more.']
  return lines + common.result_load_note(
      result, ': the machine was shared with other jobs; ratios within a cell were measured '
              'side by side (interleaved), absolute times are not representative.')


if __name__ == '__main__':
  raise SystemExit(main())
