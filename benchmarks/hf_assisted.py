"""Batch-1 speculative decoding: ours (`--gamma auto`, fixed gamma) vs HF transformers' assisted
generation, on the same exported weights, greedy.

  python -m benchmarks.hf_assisted --pair NAME TARGET DRAFT TASK [--pair ...] --data-dir DIR \
      [--examples 8] [--gammas 1,3,5] [--gamma-max 8] [--max-decode-len 32] [--input-length 64] \
      [--repeats 5] [--out results/benchmarks/hf_assisted]

A trained MHA pair (native checkpoints; HF's T5 has no K/V groups) is exported with our HF writer
(`checkpoints.hf.save_hf`) and loaded as two `T5ForConditionalGeneration`s in float32 on the CPU.
Each of the task's first `--examples` test inputs (`benchmarks.adaptive_gamma.task_inputs`) is
decoded alone (batch 1), greedily, up to `--max-decode-len` tokens or EOS, by:
  ours:  autoregressive decoding; `adaptive.decode` with policy optimal (c and v measured once on
         the first input, `calibration.measure_costs`, as `generate --gamma auto`) and heuristic;
         `speculative.decode` at each of `--gammas`;
  HF:    `generate` without an assistant; with `assistant_model=` the draft, HF's default schedule
         (`num_assistant_tokens_schedule="constant"`, 20 tokens, in transformers 5 with
         `assistant_confidence_threshold` 0.4), its "heuristic" schedule (+2 / -1, starting at
         `--gamma-max` // 2 as ours) and "constant" at each of `--gammas`.
Seconds: all inputs one after the other, the median of `--repeats` interleaved rounds (the methods
in turn, order rotated) after one untimed call each; our methods among themselves, then HF's.
Target calls: ours from the loop's counts; HF's by a forward hook on the target model's decoder
(the encoder runs once per input and is not counted).
Outputs are compared with our greedy decoding's, token for token (float32 on both sides; a
near-tie may still differ).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, workloads
from benchmarks.adaptive_gamma import interleaved, task_inputs
from gqa_spec.decoding import adaptive, autoregressive, calibration, speculative
from gqa_spec.decoding.adaptive import AdaptiveGamma
from gqa_spec.decoding.drafts import ModelDraft
from gqa_spec.decoding.targets import T5Decoder, cache_length


def _ints(text: str) -> List[int]:
  return [int(x) for x in text.split(',') if x]


def hf_models(target_model, params, draft_model, dparams):
  """(target, draft) as float32 `T5ForConditionalGeneration`s on the CPU, from our HF writer."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import hf  # pylint: disable=g-import-not-at-top
  out = []
  with tempfile.TemporaryDirectory() as d:
    for name, model, p in (('target', target_model, params), ('draft', draft_model, dparams)):
      hf.save_hf(os.path.join(d, name), model.config.replace(param_dtype='float32'),
                 jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), p))
      out.append(transformers.T5ForConditionalGeneration.from_pretrained(
          os.path.join(d, name), dtype=torch.float32).eval())
  return out


class CallCounter:
  """Counts forward calls of an HF model's decoder (one per target call; the encoder runs once)."""

  def __init__(self, model):
    self.calls = 0
    model.get_decoder().register_forward_hook(self._hook)

  def _hook(self, *_):
    self.calls += 1


def hf_runs(target, draft, inputs: np.ndarray, L: int, gammas: List[int], gmax: int):
  """method -> run() returning the generated ids of every input (EOS kept, start token dropped)."""
  import torch  # pylint: disable=g-import-not-at-top
  base = dict(max_new_tokens=L, do_sample=False, num_beams=1, eos_token_id=1, pad_token_id=0,
              decoder_start_token_id=0)
  settings = {'HF greedy': {}, 'HF assisted (defaults)': {'assistant_model': draft}}
  for schedule, tokens in [('heuristic', max(1, gmax // 2))] + [('constant', g) for g in gammas]:
    name = (f'HF assisted heuristic (from {tokens})' if schedule == 'heuristic'
            else f'HF assisted constant={tokens}')
    settings[name] = {'assistant_model': draft, 'schedule': (schedule, tokens)}

  def run(kw):
    kw = dict(kw)
    schedule = kw.pop('schedule', None)
    if schedule is not None:  # set on the assistant's generation config, as HF documents
      draft.generation_config.num_assistant_tokens_schedule = schedule[0]
      draft.generation_config.num_assistant_tokens = schedule[1]
      draft.generation_config.assistant_confidence_threshold = 0.0
    elif 'assistant_model' in kw:
      fresh = type(draft.generation_config)()
      for k in ('num_assistant_tokens_schedule', 'num_assistant_tokens',
                'assistant_confidence_threshold'):
        setattr(draft.generation_config, k, getattr(fresh, k))
    outs = []
    with torch.no_grad():
      for row in inputs:
        ids = torch.from_numpy(row[None].astype(np.int64))  # [1, S]
        mask = (ids != 0).long()
        out = target.generate(ids, attention_mask=mask, **base, **kw)
        outs.append([int(t) for t in out[0, 1:] if t != 0])
    return outs

  return {name: (lambda kw=kw: run(kw)) for name, kw in settings.items()}


def measure(args) -> List[Dict[str, Any]]:
  L, gmax, gammas = args.max_decode_len, args.gamma_max, _ints(args.gammas)
  rows = []
  for name, target_path, draft_path, task in args.pair:
    target_model, params = workloads.checkpoint_model(target_path)
    draft_model, dparams = workloads.checkpoint_model(draft_path)
    inputs = task_inputs(task, args.data_dir, args.examples, args.input_length, L)
    target, draft = T5Decoder(target_model), ModelDraft.t5(draft_model)
    encs = [jnp.asarray(inputs[i:i + 1]) for i in range(len(inputs))]
    slots = cache_length(L, max(gmax, max(gammas)) + 1)
    tstates = [target.init(params, e, slots) for e in encs]
    ar_states = [target.init(params, e, L + 1) for e in encs]
    dstates = [draft.init(dparams, e, L, max(gmax, max(gammas))) for e in encs]
    cal = calibration.measure_costs(target, tstates[0], draft, dstates[0], L, gmax)
    rng = jax.random.PRNGKey(0)
    ours = {'ours greedy': lambda: [autoregressive.decode(target, s, rng, max_decode_len=L)
                                    for s in ar_states]}
    for policy in ('optimal', 'heuristic'):
      auto = AdaptiveGamma(gamma_max=gmax, policy=policy)
      auto = auto.calibrated(cal) if policy == 'optimal' else auto
      ours[f'ours auto:{policy}'] = (lambda a=auto: [adaptive.decode(
          target, t, draft, d, rng, adaptive=a, max_decode_len=L)
          for t, d in zip(tstates, dstates)])
    for g in gammas:
      ours[f'ours gamma={g}'] = (lambda g=g: [speculative.decode(
          target, t, draft, d, rng, gamma=g, max_decode_len=L) for t, d in zip(tstates, dstates)])
    hf_target, hf_draft = hf_models(target_model, params, draft_model, dparams)
    counter = CallCounter(hf_target)
    hf = hf_runs(hf_target, hf_draft, inputs, L, gammas, gmax)
    # Ours among ours, then HF among HF: torch's worker threads spin for a while after each of its
    # calls and would slow a JAX call that follows (the two sides differ by far more than drift).
    times = {**interleaved(ours, args.repeats), **interleaved(hf, args.repeats)}
    reference = None
    for method, fn in {**ours, **hf}.items():
      counter.calls = 0
      results = fn()
      if method.startswith('ours'):
        ids = [autoregressive.strip(r.sequences, r.lengths, eos_id=-1)[0] for r in results]
        calls = sum(int(np.sum(np.asarray(getattr(r, 'target_calls')))) for r in results)
      else:
        ids, calls = results, counter.calls
      reference = ids if reference is None else reference
      tokens = sum(len(x) for x in ids)
      seconds = float(np.median(times[method]))
      row = {'pair': name, 'task': task, 'method': method, 'seconds': seconds,
             'seconds_rounds': times[method], 'tokens': tokens, 'target_calls': calls,
             'tokens_per_call': tokens / max(calls, 1), 'tokens_per_second': tokens / seconds,
             'outputs_equal_ours_greedy': ids == reference,
             'c': cal.cost_ratio if method == 'ours auto:optimal' else None,
             'verify_ratio': (list(cal.verify_ratio) if method == 'ours auto:optimal'
                              else None)}
      common.print_row({k: x for k, x in row.items() if not isinstance(x, list)})
      rows.append(row)
    greedy = {r['pair']: r['tokens_per_second'] for r in rows if r['method'] == 'ours greedy'}
    for r in rows:
      r['x_ours_greedy'] = r['tokens_per_second'] / greedy[r['pair']]
  return rows


def markdown(result: Dict[str, Any]) -> List[str]:
  cells = [(r['pair'], r['method'], f'{r["seconds"]:.3f}', r['tokens'], r['target_calls'],
            f'{r["tokens_per_call"]:.2f}', f'{r["x_ours_greedy"]:.2f}',
            'yes' if r['outputs_equal_ours_greedy'] else 'no',
            '' if r['c'] is None else
            f'{r["c"]:.3f} / {" ".join(f"{x:.2f}" for x in r["verify_ratio"])}')
           for r in result['rows']]
  lines = common.table_report(
      'Batch-1 speculative decoding: ours vs HF assisted generation, same weights', result,
      f'Trained pairs of the command line, exported to HF (float32, CPU); each of '
      f'{result["examples"]} test inputs decoded alone, greedy; seconds: all of them, median of '
      f'{result["repeats"]} interleaved rounds after an untimed call (ours among ours, then '
      'HF\'s); target calls: ours from the loop, HF by a forward hook on the target\'s decoder; '
      'x ours greedy: tokens/s over our autoregressive decoding; same output: token for token '
      'as our greedy decoding; c / v: `--gamma auto`\'s measured costs (module docstring: '
      '`benchmarks/hf_assisted.py`).',
      ['pair', 'method', 'seconds', 'tokens', 'target calls', 'tokens/call', 'x ours greedy',
       'same output', 'c / v'], cells)
  return lines + common.result_load_note(
      result, ': the machine was shared with other jobs; ratios were measured side by side '
              '(interleaved), absolute times are not representative.')


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--pair', nargs=4, action='append', required=True,
                 metavar=('NAME', 'TARGET', 'DRAFT', 'TASK'))
  p.add_argument('--data-dir', required=True)
  p.add_argument('--examples', type=int, default=8)
  p.add_argument('--gammas', default='1,3,5')
  p.add_argument('--gamma-max', type=int, default=8)
  p.add_argument('--max-decode-len', type=int, default=32)
  p.add_argument('--input-length', type=int, default=64)
  p.add_argument('--repeats', type=int, default=5)
  common.add_out_argument(p, __file__)
  args = p.parse_args(argv)
  before = os.getloadavg()
  rows = measure(args)
  result = common.results(__file__, argv, rows, before, repeats=args.repeats,
                          examples=args.examples)
  common.write_report(args.out, result, markdown(result))
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
