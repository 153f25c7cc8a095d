"""benchmarks.compile_profile reads XLA:CPU's timer lines (as XLA 0.10's `cpu_compiler` and
`ir_compiler` print them) and `benchmarks.compile_time` parses `NAME@LAYERS` sizes."""

import pytest

from benchmarks import compile_profile, compile_time

_LOG = '''\
I1125 10:57:35.023226 15576 cpu_compiler.cc:1269] Running HLO passes on [jit_convert_element_type] for CPU time: 3 ms (3005 us) (cumulative: 3 ms, max: 3 ms, #called: 1)
I1125 10:57:35.033568 15576 ir_compiler.cc:293] Compiled LLVM module: __compute_module_convert_kernel_module time: 9 ms (9000 us) (cumulative: 9 ms, max: 9 ms, #called: 1)
I1125 10:57:50.871191 15679 cpu_compiler.cc:1269] Running HLO passes on [jit__lambda] for CPU time: 89.3 ms (89328 us) (cumulative: 106 ms, max: 89.3 ms, #called: 3)
I1125 10:57:50.871236 15679 cpu_compiler.cc:2091] Compiling: jit__lambda
I1125 10:57:52.322802 15683 ir_compiler.cc:293] Compiled LLVM module: __compute_module___compute_module_wrapped_add.1 time: 25.8 ms (25751 us) (cumulative: 25.8 ms, max: 25.8 ms, #called: 1)
I1125 10:58:12.863231 15750 ir_compiler.cc:293] Compiled LLVM module: __compute_module_dot.629_elemental_kernel_module time: 141 ms (141309 us) (cumulative: 141 ms, max: 141 ms, #called: 1)
I1125 10:58:12.870289 15751 ir_compiler.cc:293] Compiled LLVM module: __compute_module_dot.438_elemental_kernel_module time: 1.2 s (1200000 us) (cumulative: 278 ms, max: 141 ms, #called: 2)
I1125 10:57:55.353721 15679 cpu_compiler.cc:2094] Compiling [jit__lambda] for CPU using JIT time: 4.48 s (4482478 us) (cumulative: 4.51 s, max: 4.48 s, #called: 3)
CHILD lower_s=0.43 compile_s=4.63 layers=24 emb_dim=2048
'''


def test_parse_reads_the_step_after_the_helper_compiles():
  row = compile_profile.parse(_LOG)
  assert row['hlo_passes_s'] == pytest.approx(0.0893)
  assert row['xla_compile_s'] == pytest.approx(4.48)
  assert (row['lower_s'], row['compile_s'], row['layers'], row['emb_dim']) == (0.43, 4.63, 24, 2048)
  assert row['llvm_modules'] == 3  # the helper's convert kernel is not the step's
  assert row['dot_kernels'] == 2 and row['dot_llvm_s'] == pytest.approx(1.341)
  assert row['llvm_summed_s'] == pytest.approx(1.341 + 0.0258)
  assert [k['kind'] for k in row['top_kinds']] == ['dot_elemental', 'wrapped_add']


def test_parse_refuses_a_log_without_timers():
  with pytest.raises(RuntimeError, match='no XLA timer lines'):
    compile_profile.parse('CHILD lower_s=1 compile_s=2 layers=2 emb_dim=64\n')


def test_size_with_layers_overrides_the_depth_only():
  deep = compile_time.config_of('small@24', True)
  small = compile_time.config_of('small', True)
  assert (deep.num_encoder_layers, deep.num_decoder_layers) == (24, 24)
  assert deep.replace(num_encoder_layers=small.num_encoder_layers,
                      num_decoder_layers=small.num_decoder_layers) == small
