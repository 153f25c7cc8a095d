"""Every notebook in notebooks/ runs top to bottom on the smoke reproduction's results."""

import json
import os
import pathlib
import sys
import time

import pytest

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')
pytest.importorskip('ipykernel')

NOTEBOOKS_DIR = pathlib.Path(__file__).resolve().parent.parent / 'notebooks'
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob('*.ipynb'))
KERNEL_NAME = 'gqa-spec-test-python'


@pytest.fixture(scope='module')
def kernel_env(tmp_path_factory, smoke_run):
  """Environment under which the kernel runs this interpreter and the notebooks read the smoke run.

  A kernelspec of our own, pointing at `sys.executable`, in a temporary JUPYTER_PATH entry: the
  notebooks then import the very gqa_spec under test, whatever 'python3' kernels the machine has
  (a user-level 'python3' spec may point at another interpreter).
  """
  jupyter_dir = tmp_path_factory.mktemp('jupyter')
  spec_dir = jupyter_dir / 'kernels' / KERNEL_NAME
  spec_dir.mkdir(parents=True)
  (spec_dir / 'kernel.json').write_text(json.dumps({
      'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
      'display_name': 'gqa-spec tests', 'language': 'python'}))
  out_dir, work_dir = smoke_run
  env = {'JUPYTER_PATH': os.pathsep.join(filter(None, [str(jupyter_dir),
                                                       os.environ.get('JUPYTER_PATH')])),
         'GQA_SPEC_RESULTS': out_dir, 'GQA_SPEC_WORK_DIR': work_dir,
         'JAX_PLATFORMS': 'cpu', 'MPLBACKEND': 'module://matplotlib_inline.backend_inline',
         # Most of a notebook's time is compiling decode loops of tiny models: compile cheaply.
         'XLA_FLAGS': ' '.join(filter(None, [os.environ.get('XLA_FLAGS'),
                                             '--xla_backend_optimization_level=0',
                                             '--xla_llvm_disable_expensive_passes=true']))}
  return env


def test_there_are_notebooks():
  assert {p.name for p in NOTEBOOKS} >= {'gqa_tradeoffs.ipynb', 'speculative_decoding.ipynb',
                                         'speculative_walkthrough.ipynb'}


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
  nb = nbformat.read(path, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == 'code':
      assert not cell.outputs and cell.execution_count is None, f'{path.name}: clear the outputs'


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_smoke_results(path, kernel_env, monkeypatch):
  for key, value in kernel_env.items():
    monkeypatch.setenv(key, value)
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(
      nb, kernel_name=KERNEL_NAME, timeout=300,
      resources={'metadata': {'path': str(NOTEBOOKS_DIR)}})  # run where Jupyter would
  t0 = time.time()
  client.execute()
  seconds = time.time() - t0
  errors = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs
            if o.output_type == 'error']
  assert not errors
  images = sum('image/png' in o.get('data', {}) for c in nb.cells if c.cell_type == 'code'
               for o in c.outputs)
  assert images > 0, f'{path.name} drew no figure'
  # A budget, not a benchmark: generous for a shared CPU, tight enough to notice a notebook that
  # retrains or re-measures instead of reading the results.
  assert seconds < 180, f'{path.name} took {seconds:.0f} s'
