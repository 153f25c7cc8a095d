"""`gqa-spec generate` and `gqa-spec ngram` end to end on a tiny checkpoint."""

import json

import numpy as np
import pytest

from gqa_spec import cli
from gqa_spec.checkpoints import native
from gqa_spec.decoding.drafts import fit_ngram, load_ngram, save_ngram
from tests.decoding.conftest import INPUTS, VOCAB, model_and_params


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  d = tmp_path_factory.mktemp('generate')
  model, params = model_and_params(2)
  native.save_checkpoint(str(d / 'ckpt'), model.config, params)
  with open(d / 'in.jsonl', 'w') as f:
    for row in INPUTS[:3]:  # 3 rows with batch size 2: the last batch has a dummy row
      f.write(json.dumps({'input_ids': [int(t) for t in row if t]}) + '\n')
  save_ngram(fit_ngram([[5, 6, 7, 8], [6, 7, 1]], order=2, vocab_size=VOCAB), str(d / 'bigram.npz'))
  return d


def _generate(d, name, *extra):
  argv = ['generate', '--model', str(d / 'ckpt'), '--inputs', str(d / 'in.jsonl'), '--out',
          str(d / f'{name}.jsonl'), '--stats', str(d / f'{name}.json'), '--max-decode-len', '8',
          '--batch-size', '2', *extra]
  assert cli.main(argv) == 0
  outputs = [json.loads(line)['output_ids'] for line in open(d / f'{name}.jsonl')]
  return outputs, json.load(open(d / f'{name}.json'))


def test_greedy_drafts_give_the_same_outputs(workdir):
  ref, stats = _generate(workdir, 'ar')
  assert len(ref) == 3 and all(1 not in ids and len(ids) <= 8 for ids in ref)
  assert stats['mean_tokens_per_call'] == 1.0 and stats['tokens'] == stats['target_calls']
  for name, draft in [('self', str(workdir / 'ckpt')), ('copy', 'copy'),
                      ('bigram', 'bigram:' + str(workdir / 'bigram.npz'))]:
    out, stats = _generate(workdir, name, '--draft', draft, '--gamma', '3')
    assert out == ref, name
    for key in ('tokens', 'seconds', 'target_calls', 'mean_tokens_per_call', 'acceptance_rate',
                'accepted_per_position'):
      assert key in stats
    assert len(stats['accepted_per_position']) == 3
    if name == 'self':
      assert stats['acceptance_rate'] == 1.0


def test_model_parallel_one_and_memory_stats(workdir):
  # A 1x1 mesh on the one CPU device: the mesh loops give the single-device outputs (8-device
  # meshes: tests/decoding/test_mesh.py, tests/training/test_mesh_eval.py).
  ref, ref_stats = _generate(workdir, 'ar1')
  out, stats = _generate(workdir, 'mesh1', '--model-parallel', '1')
  assert out == ref and stats['mesh'] == ref_stats['mesh'] == {'data': 1, 'model': 1}
  memory = stats['memory_per_device']
  assert memory == ref_stats['memory_per_device'] and memory['batch'] == 2
  assert memory['cache_length'] == 9 and memory['param_bytes'] == memory['param_bytes_total'] > 0
  # A token tree on the (1x1) mesh: `generate` no longer refuses it (8 devices, model and staged
  # tree drafts: tests/decoding/test_mesh.py).
  out, stats = _generate(workdir, 'mesh_tree', '--model-parallel', '1', '--draft',
                         'bigram:' + str(workdir / 'bigram.npz'), '--tree', 'topk:2,1')
  assert out == ref and stats['tree'] == 'topk:2,1' and stats['mesh'] == {'data': 1, 'model': 1}


def test_loop_chunk_and_param_dtype_flags(workdir):
  ref, ref_stats = _generate(workdir, 'ar2')
  out, stats = _generate(workdir, 'chunk', '--loop-chunk', '3')
  assert out == ref and stats['loop_chunk'] == 3 and ref_stats['param_dtype'] == 'float32'
  out, stats = _generate(workdir, 'bf16', '--param-dtype', 'bfloat16')
  assert len(out) == 3 and stats['param_dtype'] == 'bfloat16'
  # The memory estimate reads the config's dtype: half the float32 bytes.
  assert 2 * stats['memory_per_device']['param_bytes'] == ref_stats['memory_per_device']['param_bytes']


def test_layout_flag_gives_the_stored_layouts_tokens(workdir):
  """`--layout scanned` converts the (unrolled) checkpoint at load: the same greedy tokens, alone,
  and with a model draft (the same checkpoint, kept unrolled). Every loop on scanned models:
  tests/models/test_layout.py."""
  ref, ref_stats = _generate(workdir, 'ar3')
  assert ref_stats['scan_layers'] is False
  for name, extra in [('scan', []), ('scan_draft', ['--draft', str(workdir / 'ckpt')])]:
    out, stats = _generate(workdir, name, '--layout', 'scanned', *extra)
    assert out == ref and stats['scan_layers'] is True, name


def test_sampling_flags_run(workdir):
  out, stats = _generate(workdir, 'sample', '--draft', 'copy', '--temperature', '1', '--top-k',
                         '5', '--top-p', '0.9', '--lenience', '0.8', '--seed', '3')
  assert len(out) == 3 and stats['lenience'] == 0.8


@pytest.mark.parametrize('extra, message', [
    (['--draft', 'nonsense'], '--draft must be'),
    (['--gamma', '0'], '--gamma must be'),
    (['--lenience', '1.5'], 'lenience'),
    (['--draft', 'bigram:/nonexistent.npz'], 'not found'),
    (['--model-parallel', '0'], '--model-parallel must be'),
    (['--model-parallel', '3'], 'does not divide the 1 devices'),
    (['--loop-chunk', '0'], '--loop-chunk must be >= 1'),
    (['--loop-chunk', '2', '--draft', 'copy'],
     '--loop-chunk needs autoregressive decoding (no --draft)'),
    # a flag of another method is refused, not ignored (issue 61)
    (['--draft', 'copy', '--gamma', '4', '--gamma-max', '16'], '--gamma-max needs --gamma auto'),
    (['--gamma', '3'], '--gamma needs a chain --draft (not --tree)'),
    (['--lenience', '0.5'], '--lenience needs a chain --draft (not --tree)'),
    (['--draft', 'copy', '--stage2-gamma', '2'], '--stage2-gamma needs --stage2'),
    (['--draft', 'copy', '--gamma-policy', 'heuristic'], '--gamma-policy needs --gamma auto'),
    (['--gamma-max', '0', '--gamma', 'auto', '--draft', 'copy'], '--gamma-max must be >= 1'),
    (['--gamma', 'auto', '--draft', 'copy', '--model-parallel', '1'],
     '--gamma auto is not supported with --model-parallel'),
    # numbers are finite
    (['--gamma', 'auto', '--draft', 'copy', '--cost-ratio', 'inf'],
     '--cost-ratio must be a finite number, got inf'),
    (['--temperature', 'nan'], '--temperature must be a finite number, got nan'),
    (['--temperature', 'inf'], '--temperature must be a finite number, got inf'),
])
def test_bad_arguments_are_one_line_errors(workdir, capsys, extra, message):
  argv = ['generate', '--model', str(workdir / 'ckpt'), '--inputs', str(workdir / 'in.jsonl'),
          '--out', str(workdir / 'x.jsonl'), *extra]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('gqa-spec: error:') and message in err and '\n' not in err
  assert 'Warning' not in err


def test_flags_are_refused_before_the_model_loads(tmp_path, capsys):
  """A flag error needs no model: the plan checks the flags first (a missing --model would
  otherwise be the error), and a tree deeper than --max-decode-len is refused at once, never
  calibrated."""
  import time  # pylint: disable=g-import-not-at-top
  base = ['generate', '--model', str(tmp_path / 'none'), '--inputs', str(tmp_path / 'in.jsonl'),
          '--out', str(tmp_path / 'o.jsonl')]
  t0 = time.perf_counter()
  for extra, message in [
      (['--draft', 'copy', '--tree', 'best:auto,depth:500'],
       '--tree depth 500 is more than --max-decode-len 64'),
      (['--draft', 'copy', '--tree', 'topk:1,1,1', '--max-decode-len', '2'],
       '--tree depth 3 is more than --max-decode-len 2'),
      (['--draft', 'copy', '--gamma', '4', '--gamma-max', '16'], '--gamma-max needs --gamma auto')]:
    assert cli.main(base + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith('gqa-spec: error:') and message in err and err.count('\n') == 1, err
  assert time.perf_counter() - t0 < 10


def test_bad_inputs_are_one_line_errors(workdir, tmp_path, capsys):
  bad = tmp_path / 'bad.jsonl'
  for content, message in [('{"input_ids": [1, "a"]}\n', 'input_ids'), ('nope\n', 'JSON'),
                           ('{"inputs": "hello"}\n', 'vocabulary'),
                           ('{"input_ids": [999]}\n', 'outside')]:
    bad.write_text(content)
    argv = ['generate', '--model', str(workdir / 'ckpt'), '--inputs', str(bad), '--out',
            str(tmp_path / 'o.jsonl')]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
  assert cli.main(['generate', '--model', str(tmp_path / 'none'), '--inputs', str(bad), '--out',
                   str(tmp_path / 'o.jsonl')]) == 2


def test_ngram_round_trip_and_successors(tmp_path):
  model = fit_ngram([[5, 6, 7, 1], [5, 6, 8, 1], [5, 6, 7, 1]], order=2, vocab_size=VOCAB)
  save_ngram(model, str(tmp_path / 'b.npz'))
  loaded = load_ngram(str(tmp_path / 'b.npz'))
  succ = loaded.successor()
  assert (succ[0], succ[5], succ[6], succ[7]) == (5, 6, 7, 1)
  assert succ[20] == int(np.argmax(loaded.unigram))  # unseen predecessor: unigram backoff


def test_ngram_over_a_smaller_vocabulary_drafts_for_a_padded_model(workdir, tmp_path, capsys):
  """A model's embedding may outgrow its vocabulary (nano's 8192 rows over a 400-id DDTP one): a
  bigram fitted on the vocabulary pads to the model's and gives greedy decoding's tokens; a
  bigram over more ids than the model has is one line."""
  small = fit_ngram([[5, 6, 7, 8], [6, 7, 1]], order=2, vocab_size=VOCAB // 2)
  save_ngram(small, str(tmp_path / 'small.npz'))
  padded = small.for_model(VOCAB, 'small.npz')
  assert padded.vocab_size == VOCAB and (padded.successor()[:VOCAB // 2] == small.successor()).all()
  ref, _ = _generate(workdir, 'ar_small')
  out, stats = _generate(workdir, 'bigram_small', '--draft', f'bigram:{tmp_path / "small.npz"}')
  assert out == ref and stats['proposed'] > 0
  save_ngram(fit_ngram([[5, 6]], order=2, vocab_size=VOCAB * 2), str(tmp_path / 'big.npz'))
  assert cli.main(['generate', '--model', str(workdir / 'ckpt'), '--inputs', str(workdir / 'in.jsonl'),
                   '--out', str(tmp_path / 'o.jsonl'), '--draft', f'bigram:{tmp_path / "big.npz"}']) == 2
  err = capsys.readouterr().err.strip()
  assert f'n-gram vocabulary {VOCAB * 2} > model vocabulary {VOCAB}' in err and '\n' not in err


def test_ngram_fit_unknown_task_is_a_one_line_error(tmp_path, capsys):
  assert cli.main(['ngram', 'fit', '--task', 'no_such_task', '--order', '2', '--out',
                   str(tmp_path / 'x.npz')]) == 2
  assert 'unknown task' in capsys.readouterr().err


def test_output_paths_are_checked_before_decoding(workdir, tmp_path, capsys):
  inputs = str(workdir / 'in.jsonl')
  before = open(inputs).read()
  out = str(tmp_path / 'o.jsonl')
  for outputs, message in [
      (['--out', inputs], '--out'),  # would replace the inputs
      (['--out', out, '--stats', out], 'the same path'),
      (['--out', str(tmp_path)], 'is a folder'),
      (['--out', out, '--stats', str(tmp_path / 'no' / 's.json')], 'does not exist')]:
    argv = ['generate', '--model', str(workdir / 'ckpt'), '--inputs', inputs, *outputs]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith('gqa-spec: error:') and message in err and err.count('\n') == 1, err
  assert open(inputs).read() == before and not (tmp_path / 'o.jsonl').exists()


def test_hf_folder_as_model_suggests_import_hf(tmp_path, capsys):
  hf = tmp_path / 'hf'
  hf.mkdir()
  (hf / 'config.json').write_text('{"d_model": 32, "num_heads": 4}')
  (hf / 'model.safetensors').write_bytes(b'')
  (tmp_path / 'in.jsonl').write_text('{"input_ids": [5, 1]}\n')
  assert cli.main(['generate', '--model', str(hf), '--inputs', str(tmp_path / 'in.jsonl'),
                   '--out', str(tmp_path / 'o.jsonl')]) == 2
  assert f'gqa-spec import-hf {hf} OUT_DIR' in capsys.readouterr().err


def test_gamma_auto_gives_greedy_outputs_and_reports_gammas(workdir):
  from tests.decoding.test_speculative_t5 import greedy_reference  # cached: shared compiles
  seqs, lengths = greedy_reference('gqa', len(INPUTS))  # max_decode_len 10, batch 4
  ref = [[int(t) for t in s[1:1 + min(n, 8)] if t != 1] for s, n in zip(seqs[:3], lengths)]
  out, stats = _generate(workdir, 'auto', '--draft', 'bigram:' + str(workdir / 'bigram.npz'),
                         '--gamma', 'auto', '--gamma-max', '3')
  assert out == ref
  assert stats['gamma'].startswith('auto(optimal,max=3,c=') and stats['cost_ratio_measured']
  assert stats['calibration_seconds'] > 0
  # the guard times the run where it speculates (one call here: too few to decide)
  assert (stats['guard'] is not None) == stats['speculated']
  assert stats['guard'] is None or stats['guard']['speculative_calls'] == 1
  # ... with a call's encoder pass in its greedy-equivalent seconds (no plain call timed)
  assert stats['guard'] is None or 0 < stats['guard']['call_seconds'] < stats['seconds']
  # a bigram proposes gamma_max tokens whatever a row asks: its cost is in every iteration's v
  assert stats['cost_ratio'] == 0
  v = stats['verify_ratio']  # v(1)..v(3): the widths 2, 3, 4 tokens, each measured
  assert len(v) == 3 and all(x > 0 for x in v)
  trace = stats['gamma_per_call_per_row']
  assert len(trace) == 3 and sum(len(t) for t in trace) == stats['target_calls']
  assert sum(stats['gamma_histogram']) == stats['target_calls']
  assert stats['proposed'] == sum(map(sum, trace))
  # A bigram proposes gamma_max whenever a row speculates (it cannot stop early); whether rows do
  # depends on the measured c and v, so only the accounting is checked here.
  assert stats['draft_steps'] % 3 == 0
  assert (stats['draft_steps'] > 0) == (stats['proposed'] > 0)


def fire_guard(monkeypatch) -> None:
  """`cost_calibration.measure_costs` (chain or tree) returns costs that pay for 3 draft tokens or
  3 widths (c 0, v 1, alpha 0.9) with a greedy step priced at 1e-12 s, and the guard decides after
  one call: its first check reads speculation far below 0.97x, and the next call is a plain
  probe."""
  import functools  # pylint: disable=g-import-not-at-top
  from gqa_spec.decoding import cost_calibration, guard  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(cost_calibration, 'measure_costs',
                      lambda *a, **k: cost_calibration.Calibration(0.0, (1.0,) * 3, 0.9, 1e-12))
  monkeypatch.setattr(guard, 'SpeculationGuard',
                      functools.partial(guard.SpeculationGuard, min_calls=1))


def test_gamma_auto_guard_turns_to_greedy_decodings_program(workdir, monkeypatch):
  """`--guard` (the default with measured costs) end to end, made to fire: the calibration is
  replaced by one that speculates (c 0, v 1, alpha 0.9) with a greedy step priced at 1e-12 s, so
  the first call measures far below 0.97x and the second is a plain probe (greedy decoding's
  program; the probe's unit then decides the third). The tokens stay greedy decoding's."""
  fire_guard(monkeypatch)
  ref, _ = _generate(workdir, 'guard_ref', '--batch-size', '1')
  out, stats = _generate(workdir, 'guard', '--batch-size', '1', '--draft',
                         'bigram:' + str(workdir / 'bigram.npz'), '--gamma', 'auto',
                         '--gamma-max', '3')
  assert out == ref and stats['speculated']
  g = stats['guard']
  assert g['speculative_calls'] + g['plain_calls'] == 3 and g['plain_calls'] >= 1
  assert g['unit_measured'] and g['unit_seconds'] > 1e-9 and g['floor'] == 0.97
  trace = stats['gamma_per_call_per_row']  # one row a batch: row i is call i
  assert trace[0][0] == 3 and set(trace[1]) == {0}  # speculated, then the probe's plain steps
  assert stats['compile_seconds'] > 0
  _, stats = _generate(workdir, 'no_guard', '--batch-size', '1', '--draft',
                       'bigram:' + str(workdir / 'bigram.npz'), '--gamma', 'auto',
                       '--gamma-max', '3', '--no-guard')
  assert stats['guard'] is None and all(t[0] == 3 for t in stats['gamma_per_call_per_row'])


@pytest.mark.parametrize('extra, message', [
    (['--guard'], '--guard needs --gamma auto or --tree best:auto'),
    (['--no-guard', '--draft', 'copy'], '--no-guard needs --gamma auto or --tree best:auto'),
    (['--gamma', 'auto', '--draft', 'copy', '--cost-ratio', '0.1', '--guard'],
     '--guard: the guard runs with measured costs only, so not with --cost-ratio'),
    (['--gamma', 'auto', '--draft', 'copy', '--gamma-policy', 'heuristic', '--no-guard'],
     '--no-guard applies to --gamma-policy optimal (heuristic has no guard)'),
    (['--gamma', 'auto'], '--gamma auto needs a --draft'),
    (['--draft-confidence', '0.4', '--draft', 'copy'], '--draft-confidence needs --gamma auto'),
    (['--gamma', 'auto', '--draft', 'copy', '--draft-confidence', '0.4'],
     '--draft-confidence needs a model draft'),
    (['--gamma', 'auto', '--draft', 'copy', '--tree', 'topk:2'], 'not supported with --tree'),
    (['--gamma', 'auto', '--draft', 'copy', '--cost-ratio', '-1'], 'cost ratio must be >= 0'),
    (['--gamma', 'auto', '--draft', 'copy', '--gamma-policy', 'heuristic', '--cost-ratio', '1'],
     '--cost-ratio applies to --gamma-policy optimal'),
])
def test_gamma_auto_bad_arguments_are_one_line_errors(workdir, capsys, extra, message):
  test_bad_arguments_are_one_line_errors(workdir, capsys, extra, message)
