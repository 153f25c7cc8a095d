"""`gqa-spec reproduce --preset {smoke,cpu,gpu} [--out DIR] [--work-dir DIR] [--stages ...]
[--set KEY=VALUE ...] [--exported DIR] [--time-limit SECONDS]` and `gqa-spec calibrate --preset {smoke,cpu} [--out DIR] [--work-dir DIR]
[--sweeps ...] [--report-only] [--force]`."""

from __future__ import annotations

import argparse
import json
import logging
import os


def register(subparsers) -> None:
  from gqa_spec.reproduce.stages import STAGES  # pylint: disable=g-import-not-at-top
  parser = subparsers.add_parser(
      'reproduce', help='run the papers\' study end to end at CPU scale (cached, resumable)',
      description='Pre-train, convert and uptrain (GQA), fine-tune, evaluate, time and run '
                  'speculative decoding on the local DDTP tasks; writes tables and figures to '
                  'results/<preset>/. Finished stages are skipped; killed runs resume.')
  parser.add_argument('--preset', default='smoke', choices=('smoke', 'cpu', 'gpu'),
                      help='smoke: minutes, numbers meaningless; cpu: the CPU-scale study; gpu: '
                           'the study sized for one H100 (docs/reproduce.md)')
  parser.add_argument('--out', default=None, help='results directory (default results/<preset>)')
  parser.add_argument('--work-dir', default=None,
                      help='models, data and caches (default runs/<preset>; not for git)')
  parser.add_argument('--stages', nargs='+', default=None, metavar='STAGE',
                      help=f'run only these stages (of: {", ".join(STAGES)})')
  parser.add_argument('--force', action='store_true',
                      help='re-run the named stages even if their results exist')
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE', dest='overrides',
                      help='change one preset field (repeatable; tuples comma-separated, e.g. '
                           '--set warmup_steps=10000 --set gammas=1,3,7); needs --out and '
                           '--work-dir')
  parser.add_argument('--exported', default=None, metavar='DIR',
                      help='read the tasks from `gqa-spec data export`\'s DIR (no TensorFlow or '
                           'seqio needed; required where they are missing)')
  parser.add_argument('--time-limit', type=float, default=None, metavar='SECONDS',
                      help='stop cleanly before SECONDS (checkpoints saved, finished jobs kept; '
                           'exit status 75); the same command resumes')
  parser.add_argument('--verbose', action='store_true', default=argparse.SUPPRESS,
                      help="show the libraries' logs (as `gqa-spec --verbose`)")
  parser.set_defaults(func=_reproduce)
  _register_calibrate(subparsers)


def _register_calibrate(subparsers) -> None:
  parser = subparsers.add_parser(
      'calibrate', help='short learning-curve sweeps (lr, warm-up, batch) that size a preset',
      description='Pre-training and fine-tuning sweeps of the target and the draft, recording '
                  'validation loss (and BLEU / ROUGE-1 for fine-tuning) against step and wall '
                  'seconds; writes calibration.{json,png,md} to results/<preset>/. Finished '
                  'points are skipped; an interrupted point restarts.')
  parser.add_argument('--preset', default='cpu', choices=('smoke', 'cpu'))
  parser.add_argument('--out', default=None, help='results directory (default results/<preset>)')
  parser.add_argument('--work-dir', default=None,
                      help='models, data and caches (default runs/<preset>; not for git)')
  parser.add_argument('--sweeps', nargs='+', default=(), metavar='SWEEP',
                      help='run only these sweeps (e.g. pretrain.target finetune.target.translate)')
  parser.add_argument('--report-only', action='store_true',
                      help='write calibration.{json,png,md} from the finished points, to --out '
                           '(default: the work dir, not results/); train nothing')
  parser.add_argument('--force', action='store_true',
                      help='replace a calibration.json that holds more finished points than the '
                           'work dir (refused otherwise)')
  parser.set_defaults(func=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:
  import shlex  # pylint: disable=g-import-not-at-top
  from gqa_spec import console  # pylint: disable=g-import-not-at-top
  from gqa_spec.reproduce import calibration  # pylint: disable=g-import-not-at-top
  console.configure_logging(getattr(args, 'verbose', False), library_level=logging.ERROR)
  # The record holds every sweep, so its command is the one that runs (or resumes) them all.
  command = f'gqa-spec calibrate --preset {args.preset}'
  if args.work_dir:
    command += f' --work-dir {shlex.quote(args.work_dir)}'
  record = calibration.calibrate(args.preset, args.out, args.work_dir, args.sweeps, command,
                                 train=not args.report_only, force=args.force)
  out = args.out or (args.work_dir or f'runs/{args.preset}' if args.report_only
                     else f'results/{args.preset}')
  print(f'calibrate --preset {args.preset}: {record["status"]} ({record["pending_points"]} point(s) '
        f'pending); results in {out}/calibration.md')
  return 0


STOPPED_EXIT_CODE = 75  # EX_TEMPFAIL: stopped by --time-limit, not finished; not an error


def _reproduce(args: argparse.Namespace) -> int:
  from gqa_spec import console  # pylint: disable=g-import-not-at-top
  from gqa_spec.reproduce import pipeline, writeup  # pylint: disable=g-import-not-at-top
  # seqio and orbax warn on every evaluation and save (uncached sources, truncation notices);
  # the stage JSON and report carry what matters. Errors and progress lines still show.
  verbose = getattr(args, 'verbose', False)
  console.configure_logging(verbose, library_level=logging.ERROR)
  if not verbose:  # the trainer's per-job INFO lines (initialised from, new best): in the JSON
    logging.getLogger('gqa_spec.training').setLevel(logging.WARNING)
  records = pipeline.run(args.preset, args.out, args.work_dir, args.stages, args.force,
                         overrides=args.overrides, exported_dir=args.exported,
                         time_limit=args.time_limit)
  out = args.out or f'results/{args.preset}'
  stopped = records.pop('stopped', None)
  if stopped:
    print(f'reproduce --preset {args.preset}: stopped at the time limit in stage '
          f'{stopped["stage"]} ({len(records)} stage(s) done); run the same command to resume')
    return STOPPED_EXIT_CODE
  report = records.get('report')
  print(f'reproduce --preset {args.preset}: {len(records)} stage(s) done; results in {out}/'
        + (f' (report: {out}/report.md)' if report else ''))
  if report and 'claims' in report:  # what holds first, not a table of scores
    print(writeup.claims_summary(report['claims']))
  if args.preset == 'smoke' and 'corpus' in records:
    with open(os.path.join(out, 'preset.json')) as f:  # the preset as run (`--set` included)
      fast = json.load(f).get('fast_compile_decoding', False)
    print(writeup.smoke_note(*writeup.smoke_splits(records['corpus']), fast).replace('**', ''))
  return 0
