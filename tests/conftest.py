"""Fixtures shared across test packages."""

import os

import pytest

# Most of the suite's time is XLA compiling tiny models, not running them: compile cheaply (LLVM's
# expensive passes off, XLA:CPU's new fusion emitters off). Set before JAX starts its backend;
# subprocesses the tests start inherit it. XLA_FLAGS given by the caller come after these, so they
# win (XLA keeps the last value of a flag).
CHEAP_XLA_FLAGS = ('--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true '
                   '--xla_cpu_use_fusion_emitters=false')
os.environ['XLA_FLAGS'] = ' '.join(filter(None, [CHEAP_XLA_FLAGS, os.environ.get('XLA_FLAGS')]))


# The test files that use the `smoke_run` fixture: they read (and `test_pipeline.py` re-runs jobs
# of) the same reproduction, so under xdist they share one worker (see below).
SMOKE_FILES = ('tests/reproduce/test_pipeline.py', 'tests/test_notebooks.py')


# The files that take longest, longest first (seconds on one worker of `.ci/run`'s suite beside
# each: upper bounds, measured on a shared 2-core machine). They are the `slow` tier: every test in
# them is marked `slow`, so `python -m pytest -m "not slow"` (the fast tier, the edit-test loop)
# leaves them out; the whole suite (`python -m pytest -q`, what `.ci/run` runs) runs them first.
# xdist hands out whole files in collection order, so these start first and the last minutes are
# many short files spread over both workers, not one worker finishing a long file alone. A file
# that takes more than ~15 s belongs here (the fast tier's budget is 5 minutes on 2 cores for all
# the rest); a single slow test in a fast file gets `@pytest.mark.slow` instead.
SLOW_FILES = (
    # Seconds beside each, upper bounds from machines shared with other jobs: on one worker of
    # `.ci/run`'s suite, or the file's CPU seconds alone (its tests, not the process's imports);
    # `(judged)`: not measured, slow by the processes it starts.
    'tests/test_manual.py',  # ~600 (every page's commands, one after another)
    'tests/scripts/test_benchmarks.py',  # ~220 (tiny runs of every entry point)
    'tests/checkpoints/test_batch_drift.py',  # ~35
    'tests/decoding/test_adaptive.py',  # ~150
    'tests/training/test_resume.py',  # ~145 (5 train processes)
    'tests/reproduce/test_study_design.py',  # 145
    'tests/scripts/test_device_study.py',  # ~135 at load 6 (the gpu reproduction at nano size)
    'tests/reproduce/test_calibration.py',  # 123
    'tests/multihost/test_scale_out_doc.py',  # ~110 (10 processes, up to 5 at a time; load 4)
    'tests/models/test_layout.py',  # 88
    'tests/models/test_t5.py',  # 88
    'tests/multihost/test_multihost.py',  # ~85 + ~50 before the decoding joined its processes (3 side by side, then 1, then 4)
    'tests/decoding/test_speculative_t5.py',  # 78
    'tests/decoding/test_tree_staged.py',  # ~76 (147 compiles, was 771)
    'tests/training/test_draft_training.py',  # 70
    'tests/decoding/test_adaptive_hlo.py',  # ~70 alone (3 compiles of the adaptive loops)
    'tests/decoding/test_tree_t5.py',  # 61
    'tests/training/test_chaos.py',  # 6 training processes, 4 of them killed (not yet timed in CI)
    'tests/decoding/test_commands.py',  # ~59 (31 generate runs in process)
    'tests/decoding/test_tree_commands.py',  # ~58 (24 generate runs in process)
    'tests/decoding/test_autoregressive.py',  # ~49
    'tests/decoding/test_mesh.py',  # ~48 (shared states, the suite's XLA flags)
    'tests/reproduce/test_gpu_preset.py',  # 46
    'tests/training/test_sharding.py',  # ~42 (the suite's XLA flags)
    'tests/training/test_mesh_eval.py',  # ~32 (the suite's XLA flags)
    'tests/decoding/test_tree_stub.py',  # ~33-42
    'tests/decoding/test_speculative_chimera.py',  # ~23-30
    'tests/models/test_config.py',  # ~22
    'tests/models/test_decode_cache_tree.py',  # ~20 (one test)
    'tests/checkpoints/test_hf.py',  # ~27 (torch's reference models)
    'tests/decoding/test_tree_adaptive.py',  # (judged: the adaptive tree loops)
    'tests/test_signals.py',  # (judged: generate processes signalled at each stage)
    'tests/multihost/test_faults.py',  # (judged: training processes, 2 of them ~25 s each)
    'tests/checkpoints/test_checkpoint_commands.py',  # ~22 (CLI processes)
    'tests/checkpoints/test_native.py',  # ~21
    'tests/decoding/test_t5x_compat.py',  # ~20
    'tests/decoding/test_staged.py',  # ~17
    'tests/decoding/test_tree.py',  # ~17
    'tests/data/test_exported.py',  # ~17
    'tests/data/test_paper_tasks.py',  # ~17 (seqio pipelines of 8 tasks)
    'tests/models/test_chimera.py',  # ~16
    'tests/data/test_tasks.py',  # ~16
    'tests/test_console.py',  # ~30 (CLI and library start-ups in fresh processes)
    'tests/training/test_evaluation_tree.py',  # ~25
    'tests/decoding/test_xla_options.py',  # ~20
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks added here
def pytest_collection_modifyitems(config, items):
  """Marks every test of SMOKE_FILES and SLOW_FILES `slow`; runs the smoke files first (the longest
  unit of work when the suite makes its own smoke reproduction), then SLOW_FILES longest first,
  then the rest in file order; checks that SMOKE_FILES names every file that uses `smoke_run`."""
  rootpath = config.rootpath
  path = lambda item: item.path.relative_to(rootpath).as_posix()
  users = {path(item) for item in items if 'smoke_run' in item.fixturenames}
  if users - set(SMOKE_FILES):
    raise pytest.UsageError(f'tests/conftest.py: add {sorted(users - set(SMOKE_FILES))} to SMOKE_FILES')
  missing = [f for f in SLOW_FILES if not (rootpath / f).is_file()]
  if missing:
    raise pytest.UsageError(f'tests/conftest.py: SLOW_FILES names missing files {missing}')
  rank = {f: i for i, f in enumerate(SMOKE_FILES + SLOW_FILES)}
  for item in items:
    if path(item) in rank:
      item.add_marker(pytest.mark.slow)
  items.sort(key=lambda item: rank.get(path(item), len(rank)))  # stable: file order kept otherwise


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """pytest-xdist (`-n 2` in pyproject's addopts) schedules whole test files: each file runs on one
  worker, so its module-scoped fixtures (compiled models, trained checkpoints) are built once, not
  once per worker; the SMOKE_FILES form one unit, so the smoke reproduction is neither run twice
  nor read while another worker re-runs its jobs."""
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=g-import-not-at-top
  config.option.loadscopereorder = False  # keep the collection's order (above), not by test count

  class FileScheduling(LoadScopeScheduling):

    def _split_scope(self, nodeid):
      path = nodeid.split('::', 1)[0]
      return 'smoke_run' if path in SMOKE_FILES else path

  return FileScheduling(config, log)


@pytest.fixture(scope='session')
def smoke_run(tmp_path_factory):
  """One `gqa-spec reproduce --preset smoke` per test session (about 5 minutes on 2 CPU cores).

  `GQA_SPEC_SMOKE_RUN=OUT_DIR:WORK_DIR` names an existing smoke reproduction to reuse (`.ci/run`
  passes the one the README's first command just made): the stages are cached, so `pipeline.run`
  only checks them (and finishes any that are missing). Unset, the session makes its own.

  Returns:
    (out_dir, work_dir) as strings: the results (stage JSON, report.md, PNGs) and the models + data.
  """
  from gqa_spec.reproduce import pipeline  # pylint: disable=g-import-not-at-top
  reuse = os.environ.get('GQA_SPEC_SMOKE_RUN')
  if reuse:
    out_dir, sep, work_dir = reuse.partition(':')
    if not (sep and out_dir and work_dir):
      raise ValueError(f'GQA_SPEC_SMOKE_RUN={reuse!r}: expected OUT_DIR:WORK_DIR')
  else:
    root = tmp_path_factory.mktemp('smoke_run')
    out_dir, work_dir = os.path.join(root, 'results'), os.path.join(root, 'work')
  pipeline.run('smoke', out_dir=out_dir, work_dir=work_dir, progress_bar=False)
  return out_dir, work_dir


@pytest.fixture(scope='session')
def tiny_data_dir(tmp_path_factory):
  """A tiny DDTP corpus (the packaged Translation excerpt, a 300-piece vocabulary) for real-data
  runs (training, the t5x-style scripts)."""
  from gqa_spec.data import corpus  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path_factory.mktemp('ddtp'))
  corpus.prepare(corpus.SAMPLE_LISTS_DIR, data_dir, vocab_size=300,
                 fractions=corpus.SAMPLE_FRACTIONS)
  return data_dir


@pytest.fixture(scope='session')
def tiny_gpu_export(tiny_data_dir, tmp_path_factory):
  """`gqa-spec data export` of the gpu preset's tasks (pre-training mixture, translate +
  summarize) from `tiny_data_dir` at its pre-training lengths: what the preset reads on a machine
  without TensorFlow or seqio (`--exported`)."""
  from gqa_spec.data import export, tasks  # pylint: disable=g-import-not-at-top
  from gqa_spec.reproduce import presets  # pylint: disable=g-import-not-at-top
  out = str(tmp_path_factory.mktemp('gpu_export') / 'export')
  tasks.register_ddtp_tasks(tiny_data_dir)
  try:
    export.export([presets.PRETRAIN_MIXTURE, presets.MULTITASK], out,
                  splits=('train', 'validation', 'test'),
                  lengths=dict(zip(('inputs', 'targets'), presets.get('gpu').pretrain_lengths)))
  finally:
    tasks.register_ddtp_tasks()  # back to the default data dir for other modules
  return out


@pytest.fixture(scope='module', autouse=True)
def _release_compiled_executables():
  """Drops JAX's compiled executables after a test module once the process holds many memory maps.

  XLA:CPU maps each executable's code and data into its own memory regions (3 per compiled
  module), and JAX's caches keep every executable alive for the life of the process. The whole
  suite compiles tens of thousands of them; one process then passes Linux's default
  `vm.max_map_count` (65530) about half-way through the suite and segfaults inside the next
  compilation. Clearing after *every* module kept the count low but made later modules recompile
  the loops and models they share with earlier ones; the reproduction's policy
  (`jobs.release_compiled`: at half the limit, or sooner when twice the largest growth between
  two calls would pass 90% of it) keeps both.
  """
  yield
  from gqa_spec.reproduce import jobs  # pylint: disable=g-import-not-at-top
  jobs.release_compiled()
