"""`gqa-spec generate` (autoregressive or speculative decoding of a checkpoint) and `gqa-spec ngram fit`.

  gqa-spec generate --model CKPT --inputs IN.jsonl --out OUT.jsonl [--stats STATS.json]
      [--vocab SPM] [--task TASK]
      [--max-decode-len N] [--batch-size B] [--draft {none,CKPT_DIR,unigram:PATH,bigram:PATH,copy}]
      [--gamma {G,auto} [--gamma-max G] [--gamma-policy {optimal,heuristic}] [--cost-ratio C]
       [--draft-confidence T]] [--guard | --no-guard]
      [--tree {topk:K1,K2,...|best:N,depth:D[,width:W]|best:auto[:N],depth:D[,width:W]}[,replace]]
      [--stage2 bigram:PATH [--stage2-gamma G2]] [--temperature T]
      [--top-k K] [--top-p P] [--lenience L] [--seed S] [--model-parallel N]
      [--param-dtype {float32,bfloat16}] [--loop-chunk K]
  gqa-spec ngram fit --task TASK --order {1,2} --out PATH [--split train] [--max-examples N]

Input lines hold `input_ids` or `inputs` (text); output lines hold `output_ids` (cut before EOS)
and `output` text where a vocabulary is known. Inputs are padded to one length and the last batch
filled with dummy rows, so decoding compiles once. Each method is a plan (`decoding.plan`) that
checks its flags before anything loads. With the multi-process flags every process reads the same
inputs and process 0 writes `--out` and `--stats`. The flags and `--stats` fields:
docs/decoding.md, docs/adaptive.md, docs/trees.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

from gqa_spec import arguments, atomic, distributed
from gqa_spec.errors import UserError

EOS = 1


def register(subparsers) -> None:
  p = subparsers.add_parser('generate', help='decode a checkpoint on JSONL inputs (optionally '
                            'speculative, with a draft)')
  p.add_argument('--model', required=True,
                 help='native checkpoint directory (the target), or a training run directory (its '
                      'best/, else its latest checkpoint; RUN/checkpoints/N for step N)')
  p.add_argument('--inputs', required=True, help='JSONL: input_ids or inputs (text) per line')
  p.add_argument('--vocab', metavar='SPM', default=None,
                 help="SentencePiece model for text inputs and the `output` text, where the "
                      'checkpoint carries no vocabulary')
  p.add_argument('--task', metavar='NAME', default=None,
                 help="text inputs go through this seqio task's own preprocessing (e.g. "
                      "ddtp_translate_en_de's `translate English to German: ` prefix) and tokenizer")
  p.add_argument('--out', required=True, help='JSONL output path')
  p.add_argument('--stats', help='write timing and acceptance statistics JSON here')
  p.add_argument('--max-decode-len', type=int, default=64)
  p.add_argument('--batch-size', type=int, default=8)
  p.add_argument('--truncate-inputs', action='store_true',
                 help='cut rows longer than the device can take (estimated from the model, the '
                      'batch and its memory) to that length, with a warning, instead of refusing')
  p.add_argument('--draft', default='none',
                 help='none | CKPT_DIR (a smaller T5, same vocabulary; or its training run '
                      'directory) | unigram:PATH | bigram:PATH (from `gqa-spec ngram fit`) | '
                      'copy (prompt lookup) | chimera:DIR (a `train-draft --kind chimera` run)')
  p.add_argument('--gamma', type=_gamma, default=None,
                 help='a chain --draft: draft tokens per target call (default 4), or auto: chosen '
                      'in the loop at every iteration (--gamma-policy)')
  p.add_argument('--gamma-max', type=int, default=None,
                 help='--gamma auto: the longest proposal (default 8)')
  p.add_argument('--gamma-policy', choices=('optimal', 'heuristic'), default=None,
                 help="--gamma auto: optimal (default; one length for the batch, Leviathan's "
                      "Theorem 8 at its slowest row's running alpha and the measured costs, 0 = "
                      "plain target steps) or heuristic (HF's schedule per row: +2 after a "
                      'proposal accepted whole, else -1)')
  p.add_argument('--cost-ratio', type=float, default=None, metavar='C',
                 help='--gamma auto, optimal policy, or --tree best:auto: a draft call\'s time over '
                      'a target call\'s, with verification taken as one step as in Theorem 8 '
                      '(default: both measured once on the first batch)')
  p.add_argument('--guard', action=argparse.BooleanOptionalAction, default=None,
                 help='--gamma auto (optimal) or --tree best:auto with measured costs: time every '
                      'call and stop speculating for the rest of the run once the speculative calls '
                      'measure below 0.97x greedy decoding, a plain call confirming it '
                      '(gqa_spec.decoding.guard; default: on where the costs are measured)')
  p.add_argument('--draft-confidence', type=float, default=None, metavar='T',
                 help="--gamma auto, model drafts: end a row's proposal after a token whose draft "
                      'top probability is below T (HF\'s assistant_confidence_threshold)')
  p.add_argument('--tree', default=None,
                 help='verify a token tree instead of a chain (model, bigram or chimera drafts): '
                      'topk:K1,K2,... (K_d children per node at depth d) or best:N,depth:D[,width:W] '
                      '(best-first, N nodes) or best:auto[:N],depth:D[,width:W] (best-first, each '
                      'row choosing its node count <= N in the loop; N default: every candidate, '
                      'at most 64), any with ,replace for SpecInfer\'s sampling with '
                      'replacement; replaces --gamma')
  p.add_argument('--stage2', default=None,
                 help='staged speculation: bigram:PATH speculates the model draft\'s own tokens '
                      '(a chain, or with --tree the tree draft\'s levels)')
  p.add_argument('--stage2-gamma', type=int, default=None,
                 help='--stage2: bigram tokens the draft verifies per draft call (default 3; with '
                      '--tree: chain tokens fed after each expanded node)')
  p.add_argument('--temperature', type=float, default=0.0, help='0 = greedy')
  p.add_argument('--top-k', type=int, default=0, help='0 = off')
  p.add_argument('--top-p', type=float, default=1.0, help='1 = off')
  p.add_argument('--lenience', type=float, default=1.0, help='(0, 1]; 1 = exact')
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--model-parallel', type=int, default=None, metavar='N',
                 help='decode on a mesh of all devices with a model axis of N (default: one '
                      'device)')
  p.add_argument('--param-dtype', default=None, choices=('float32', 'bfloat16'),
                 help='cast the floating parameters (target and model draft) to this dtype once, '
                      'at load (default: as stored)')
  p.add_argument('--layout', choices=arguments.LAYOUTS, default=None,
                 help="the layer layout decoding runs in, converted at load (default: unrolled, "
                      'as MaxText decodes, whatever the checkpoint was trained in; scanned: one '
                      'nn.scan per stack, compile time independent of depth, slower steps)')
  distributed.add_flags(p)
  p.add_argument('--loop-chunk', type=int, default=1, metavar='K',
                 help='autoregressive decoding: K decode steps per while-loop iteration, a static '
                      'trip count (same tokens; fewer host synchronisations on a GPU)')
  p.set_defaults(func=generate)

  ngram = subparsers.add_parser('ngram', help='n-gram drafts for speculative decoding')
  ngram_sub = ngram.add_subparsers(dest='ngram_command', metavar='SUBCOMMAND')
  ngram_sub.required = True
  f = ngram_sub.add_parser('fit', help="fit a unigram/bigram draft on a task's training targets")
  f.add_argument('--task', required=True)
  f.add_argument('--order', type=int, choices=(1, 2), required=True)
  f.add_argument('--out', required=True, help='output .npz path')
  f.add_argument('--split', default='train')
  f.add_argument('--max-examples', type=arguments.positive_int, default=None)
  f.set_defaults(func=ngram_fit)


def _read_inputs(path: str, vocab, task: Optional[str]) -> List[List[int]]:
  """Each line's ids: `input_ids` as given, `inputs` text through `task`'s preprocessing and
  tokenizer (`data.text_inputs`) or, without a task, `vocab` + EOS."""
  if not os.path.isfile(path):
    raise UserError(f'inputs file not found: {path}')
  rows: List[Any] = []  # ids, or the text of an `inputs` line
  with open(path, 'rb') as f:
    for n, raw in enumerate(f, 1):
      try:
        line = raw.decode('utf-8')
      except UnicodeDecodeError as e:
        raise UserError(f'{path}:{n}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column '
                        f'{e.start + 1})') from None
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise UserError(f'{path}:{n}: not valid JSON ({e.msg})') from None
      if not isinstance(obj, dict):
        raise UserError(f'{path}:{n}: each line must be a JSON object')
      if 'input_ids' in obj:
        ids = obj['input_ids']
        if (not isinstance(ids, list) or not ids
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
          raise UserError(f'{path}:{n}: input_ids must be a non-empty list of integers')
      elif 'inputs' in obj:
        if vocab is None and task is None:
          raise UserError(f'{path}:{n}: text `inputs` need a vocabulary, and the checkpoint '
                          'carries none; pass --vocab or --task, or give `input_ids`')
        if not isinstance(obj['inputs'], str):
          raise UserError(f'{path}:{n}: inputs must be a string')
        ids = obj['inputs']
      else:
        raise UserError(f'{path}:{n}: needs `input_ids` or `inputs`')
      rows.append(ids)
  if not rows:
    raise UserError(f'{path}: no inputs')
  texts = [r for r in rows if isinstance(r, str)]
  if texts and task is not None:
    from gqa_spec.data import text_inputs  # pylint: disable=g-import-not-at-top  (TensorFlow)
    encoded = iter(text_inputs.task_inputs(task, texts))
  else:
    encoded = iter([list(vocab.encode(t)) + [EOS] for t in texts])
  return [next(encoded) if isinstance(r, str) else r for r in rows]


def _gamma(text: str):
  """An argparse `type`: an integer (checked >= 1 by the plan) or `auto`."""
  if text == 'auto':
    return text
  try:
    return int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'expected an integer or auto, got {text!r}') from None


def _vocabulary(args: argparse.Namespace, carried: Optional[str], model_vocab_size: int):
  """The vocabulary of the text inputs and outputs (None: ids only): `--vocab`, the checkpoint's
  own, or `--task`'s; one with more ids than the model embeds is refused (`data.vocab_fit`)."""
  path = arguments.vocab_file(carried, args.vocab, args.model)
  what, name = ('--vocab' if args.vocab else "the checkpoint's vocabulary"), path
  if path is None and args.task is not None:
    from gqa_spec.data import exported  # pylint: disable=g-import-not-at-top
    from gqa_spec.data.text_inputs import vocab_file  # pylint: disable=g-import-not-at-top
    if not exported.is_exported(args.task):
      from gqa_spec.data import tasks  # pylint: disable=g-import-not-at-top  (TensorFlow)
      tasks.use_data_of(args.model)  # the model knows its data (the smoke run's, say)
    path = vocab_file(args.task)  # the task's own: the output text as the task reads it
    what, name = 'task', args.task
  if not path:
    return None
  from gqa_spec.data import vocab_fit  # pylint: disable=g-import-not-at-top
  from gqa_spec.data.vocabulary import get_vocabulary  # pylint: disable=g-import-not-at-top
  vocab = get_vocabulary(path)
  try:
    size = vocab.vocab_size  # seqio reads the model file here
  except Exception as e:  # pylint: disable=broad-except; sentencepiece raises several types
    raise UserError(f'{path}: not a SentencePiece model ({type(e).__name__})') from None
  vocab_fit.check({name: size}, model_vocab_size, args.model, what=what)
  return vocab


def generate(args: argparse.Namespace) -> int:
  from gqa_spec.decoding import plan as plan_lib  # pylint: disable=g-import-not-at-top
  plan = plan_lib.plan_for(args)  # the method and its flags, checked before anything loads
  arguments.check_outputs({'--out': args.out, '--stats': args.stats},
                          inputs={'--inputs': args.inputs, '--model': args.model,
                                  '--draft': args.draft, '--vocab': args.vocab})
  if distributed.start_from_args(args) and args.model_parallel is None:
    args.model_parallel = 1  # several processes decode on one mesh of all their devices
  if not os.path.isdir(args.model):
    raise UserError(f'model checkpoint directory not found: {args.model}')
  from gqa_spec.checkpoints import load, param_dtype  # pylint: disable=g-import-not-at-top
  target_config, params, vocab_path = load.load_model(args.model)  # or a training run directory
  target_config, params = param_dtype.cast(target_config, params, args.param_dtype)
  from gqa_spec.models import layout  # pylint: disable=g-import-not-at-top
  target_config, params = layout.for_decoding(target_config, params, args.layout)
  vocab = _vocabulary(args, vocab_path, target_config.vocab_size)
  rows = _read_inputs(args.inputs, vocab, args.task)
  for ids in rows:
    bad = [t for t in ids if t < 0 or t >= target_config.vocab_size]
    if bad:
      raise UserError(f'input id {bad[0]} outside the model vocabulary [0, {target_config.vocab_size})')
  max_len, batch = args.max_decode_len, args.batch_size
  rows = _fit_inputs(rows, args, target_config, plan.cache_length(max_len))

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding import autoregressive, guard as guard_lib, memory, mesh, speculative, tree_speculative  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.targets import T5Decoder  # pylint: disable=g-import-not-at-top
  from gqa_spec.models.t5 import Transformer  # pylint: disable=g-import-not-at-top
  from gqa_spec.partitioning import to_host  # pylint: disable=g-import-not-at-top

  width = -(-max(len(r) for r in rows) // 8) * 8  # one input length for all batches
  partitioner, mesh_shape = None, (1, 1)
  loops = (autoregressive.decode, speculative.decode, tree_speculative.decode)
  target = T5Decoder(Transformer(target_config))
  if args.model_parallel is not None:
    from gqa_spec.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
    if jax.device_count() % args.model_parallel:
      raise UserError(f'--model-parallel {args.model_parallel} does not divide the '
                      f'{jax.device_count()} devices')
    partitioner = Partitioner.create(target_config, model=args.model_parallel)
    mesh_shape = (partitioner.data_size, args.model_parallel)
    target = mesh.MeshT5Decoder(target.model, partitioner)
    params = mesh.place_params(partitioner, params)
    loops = (mesh.autoregressive, mesh.speculative, mesh.tree_speculative)
  plan.make_draft(target_config, mesh=None if partitioner is None else partitioner.mesh,
                  param_dtype=args.param_dtype)
  decoding = plan_lib.Decoding(target, params, max_len, plan.sampling, batch, *loops)

  batches = []
  for start in range(0, len(rows), batch):
    chunk = rows[start:start + batch]
    enc = np.zeros((batch, width), np.int32)
    for i, ids in enumerate(chunk):
      enc[i, :len(ids)] = ids
    enc[len(chunk):, 0] = EOS  # dummy rows filling the last batch
    batches.append((enc, len(chunk)))

  plan.calibrate(decoding, batches)
  rng = jax.random.PRNGKey(args.seed)
  t0 = time.perf_counter()
  jax.block_until_ready(plan.run(decoding, *batches[0], rng))  # compile (and warm) once
  compile_seconds = time.perf_counter() - t0
  results, seconds, plain_compile = guard_lib.decode_batches(
      lambda enc, n, rng, plain: to_host(jax.block_until_ready(
          plan.run(decoding, enc, n, rng, plain))),
      batches, rng, plan.guard(decoding, batches))
  compile_seconds += plain_compile  # greedy decoding's program, where the guard turned to it
  outputs = [ids for result, n in results for ids in autoregressive.strip(
      np.asarray(result.sequences)[:n], np.asarray(result.lengths)[:n])]

  if not distributed.is_writer():  # every process decoded the same rows; process 0 writes
    return 0
  with atomic.open_for_write(args.out) as f:  # whole or not at all
    for ids in outputs:
      line: Dict[str, Any] = {'output_ids': ids}
      if vocab is not None:
        line['output'] = vocab.decode(ids)
      f.write(json.dumps(line) + '\n')
  if args.stats:
    stats = speculative.summarize(results)
    stats.update(seconds=seconds, compile_seconds=compile_seconds,
                 tokens_per_second=stats['tokens'] / seconds if seconds else None, **plan.stats(),
                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                 lenience=args.lenience, batch_size=batch, max_decode_len=max_len,
                 param_dtype=target_config.param_dtype, scan_layers=target_config.scan_layers,
                 examples=len(rows),
                 mesh={'data': mesh_shape[0], 'model': mesh_shape[1]},
                 memory_per_device=vars(memory.memory_per_device(
                     target_config, batch=batch, input_length=width,
                     cache_length=plan.cache_length(max_len), data=mesh_shape[0],
                     model=mesh_shape[1])))
    atomic.write_json(args.stats, stats, indent=2)
  return 0


def ngram_fit(args: argparse.Namespace) -> int:
  arguments.check_outputs({'--out': args.out})
  from gqa_spec.decoding.drafts import save_ngram  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding.drafts.ngram import fit_ngram_on_task  # pylint: disable=g-import-not-at-top
  model = fit_ngram_on_task(args.task, args.order, args.split, args.max_examples)
  save_ngram(model, args.out)
  print(f'{args.out}: order {args.order}, {int(model.unigram.sum())} target tokens, '
        f'{len(model.bigram)} bigram types')
  return 0


def _fit_inputs(rows: List[List[int]], args: argparse.Namespace, config,
                cache_length: int) -> List[List[int]]:
  """Rows longer than one device can take (`memory.longest_input`) refused in one line, before
  anything compiles, or with --truncate-inputs cut to that length (ending in EOS) with a warning."""
  import jax  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding import memory  # pylint: disable=g-import-not-at-top
  model = args.model_parallel or 1
  data = max(jax.device_count() // model, 1)
  if args.batch_size % data:
    data = 1  # the rows do not shard: every device holds the whole batch
  estimate = memory.estimator(config, batch=args.batch_size, cache_length=cache_length,
                                   data=data, model=model)
  available = memory.device_bytes()
  limit = memory.longest_input(estimate, available)
  longest = max(range(len(rows)), key=lambda i: len(rows[i]))
  if len(rows[longest]) <= limit:
    return rows
  if not args.truncate_inputs or limit < 1:
    raise UserError(
        f'{args.inputs}: input row {longest + 1} has {len(rows[longest])} tokens, more than the '
        f'{limit} one device can take at --batch-size {args.batch_size} (about '
        f'{estimate(-(-len(rows[longest]) // 8) * 8) / 2**30:.3g} GiB of {available / 2**30:.3g} '
        'GiB); pass --truncate-inputs to cut such rows, or lower --batch-size')
  cut = sum(len(r) > limit for r in rows)
  print(f'gqa-spec: warning: {args.inputs}: cut {cut} input row(s) to {limit} tokens (the longest, '
        f'row {longest + 1}, had {len(rows[longest])})', file=sys.stderr)
  return [r if len(r) <= limit else r[:limit - 1] + [EOS] for r in rows]
