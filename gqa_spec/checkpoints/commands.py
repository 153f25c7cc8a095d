"""`gqa-spec import-hf | export-hf | import-t5x | convert`: checkpoint formats and MHA -> GQA.

Library modules are imported inside the commands so that `gqa-spec --help` stays fast.
"""

from __future__ import annotations

import argparse
import os

from gqa_spec import arguments
from gqa_spec.errors import UserError


def _layout_flag(p, default) -> None:
  p.add_argument('--layout', choices=arguments.LAYOUTS, default=default,
                 help='layer layout of the result: T5X\'s layers_0.. (unrolled) or one scanned '
                 'stack per encoder/decoder (T5Config.scan_layers)' +
                 ('' if default else '; default: the input\'s'))


def _vocab_flag(p) -> None:
  p.add_argument('--vocab', metavar='SPM', default=None,
                 help='SentencePiece model to store with the result, where the input checkpoint '
                      'carries none (its own travels with it)')


def register(subparsers) -> None:
  """Adds the checkpoint commands to the `gqa-spec` parser."""
  p = subparsers.add_parser('import-hf', help='HF T5 checkpoint dir -> native checkpoint')
  p.add_argument('hf_dir', metavar='HF_DIR',
                 help='config.json + model.safetensors or pytorch_model.bin')
  p.add_argument('out_dir', metavar='OUT_DIR')
  p.add_argument('--param-dtype', default='float32', choices=('float32', 'bfloat16'))
  _layout_flag(p, 'unrolled')
  _vocab_flag(p)
  p.add_argument('--overwrite', action='store_true', help='replace OUT_DIR if it exists')
  p.set_defaults(func=import_hf)

  p = subparsers.add_parser('export-hf', help='native checkpoint -> HF T5 (safetensors); GQA/MQA '
                            'K/V heads are repeated so HF computes the same function')
  p.add_argument('ckpt_dir', metavar='CKPT_DIR')
  p.add_argument('hf_dir', metavar='HF_DIR')
  p.add_argument('--overwrite', action='store_true', help='replace HF_DIR if it exists')
  p.set_defaults(func=export_hf)

  p = subparsers.add_parser('import-t5x', help='T5X legacy checkpoint (msgpack + TensorStore) -> '
                            'native checkpoint')
  p.add_argument('t5x_ckpt', metavar='T5X_CKPT',
                 help='model dir (latest checkpoint_N), checkpoint_N dir or its checkpoint file')
  p.add_argument('out_dir', metavar='OUT_DIR')
  source = p.add_mutually_exclusive_group(required=True)
  source.add_argument('--preset', help='model config preset (T5X checkpoints carry no config): '
                      'small, base, large, xl, xxl, ...')
  source.add_argument('--config', metavar='JSON', help='T5Config JSON file')
  p.add_argument('--vocab', metavar='SPM', help='SentencePiece model to store with the checkpoint')
  _layout_flag(p, 'unrolled')
  p.add_argument('--overwrite', action='store_true', help='replace OUT_DIR if it exists')
  p.set_defaults(func=import_t5x)

  p = subparsers.add_parser('convert', help='MHA -> GQA-G / MQA checkpoint (decoder self- and '
                            'cross-attention K/V only)')
  p.add_argument('ckpt_dir', metavar='CKPT_DIR')
  p.add_argument('out_dir', metavar='OUT_DIR')
  p.add_argument('--kv-heads', type=int, required=True, metavar='G',
                 help='K/V heads of the result: H (MHA), 1 (MQA) or a divisor of H (GQA-G)')
  p.add_argument('--method', required=True, choices=('mean', 'first', 'random'))
  p.add_argument('--seed', type=int, default=0, help='PRNG seed of --method random')
  _layout_flag(p, None)
  _vocab_flag(p)
  p.add_argument('--overwrite', action='store_true', help='replace OUT_DIR if it exists')
  p.set_defaults(func=convert)


def _check_out(name: str, path: str, overwrite: bool, inputs) -> None:
  """The output directory, checked before anything is read: not an input, an existing one only
  with --overwrite."""
  arguments.check_outputs({name: path}, inputs=inputs, directories=True)
  if os.path.exists(path) and not overwrite:
    raise UserError(f'{path}: output directory already exists (pass --overwrite to replace it)')


def import_hf(args: argparse.Namespace) -> int:
  from gqa_spec.checkpoints import hf, native  # pylint: disable=g-import-not-at-top
  _check_out('OUT_DIR', args.out_dir, args.overwrite, {'HF_DIR': args.hf_dir})
  config, params, vocab = hf.load_hf(args.hf_dir, args.param_dtype, args.layout == 'scanned')
  vocab = arguments.vocab_file(vocab, args.vocab, args.hf_dir)
  native.save_checkpoint(args.out_dir, config, params, vocab, overwrite=args.overwrite)
  print(f'imported {args.hf_dir} -> {args.out_dir}')
  return 0


def export_hf(args: argparse.Namespace) -> int:
  from gqa_spec.checkpoints import hf, load  # pylint: disable=g-import-not-at-top
  _check_out('HF_DIR', args.hf_dir, args.overwrite, {'CKPT_DIR': args.ckpt_dir})
  config, params, vocab = load.load_model(args.ckpt_dir)  # or a run directory
  hf.save_hf(args.hf_dir, config, params, vocab, overwrite=args.overwrite)
  print(f'exported {args.ckpt_dir} -> {args.hf_dir}')
  return 0


def _t5x_config(args: argparse.Namespace):
  from gqa_spec.models.config import T5Config, preset  # pylint: disable=g-import-not-at-top
  if args.preset is not None:
    try:
      return preset(args.preset)
    except ValueError as e:
      raise UserError(str(e)) from None
  if not os.path.isfile(args.config):
    raise UserError(f'{args.config}: config file not found')
  try:
    with open(args.config) as f:
      return T5Config.from_json(f.read())
  except (ValueError, TypeError, UnicodeDecodeError) as e:
    raise UserError(f'{args.config}: invalid model config: {e}') from None


def import_t5x(args: argparse.Namespace) -> int:
  from gqa_spec.checkpoints import native, t5x_legacy  # pylint: disable=g-import-not-at-top
  _check_out('OUT_DIR', args.out_dir, args.overwrite, {'T5X_CKPT': args.t5x_ckpt})
  config = _t5x_config(args).replace(scan_layers=args.layout == 'scanned')
  params = t5x_legacy.load_t5x(args.t5x_ckpt, config)
  native.save_checkpoint(args.out_dir, config, params, args.vocab, overwrite=args.overwrite)
  print(f'imported {args.t5x_ckpt} -> {args.out_dir}')
  return 0


def convert(args: argparse.Namespace) -> int:
  from gqa_spec import convert as convert_lib  # pylint: disable=g-import-not-at-top
  from gqa_spec.checkpoints import load, native  # pylint: disable=g-import-not-at-top
  _check_out('OUT_DIR', args.out_dir, args.overwrite, {'CKPT_DIR': args.ckpt_dir})
  config, params, vocab = load.load_model(args.ckpt_dir)  # or a run directory
  vocab = arguments.vocab_file(vocab, args.vocab, args.ckpt_dir)
  params, config = convert_lib.convert_params(params, config, args.kv_heads, args.method, args.seed)
  if args.layout is not None:
    from gqa_spec.models import layout  # pylint: disable=g-import-not-at-top
    config, params = layout.convert(config, params, args.layout == 'scanned')
  native.save_checkpoint(args.out_dir, config, params, vocab, overwrite=args.overwrite)
  print(f'converted {args.ckpt_dir} -> {args.out_dir} ({args.method}, '
        f'{config.num_kv_heads} K/V heads)')
  return 0
