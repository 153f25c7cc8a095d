"""The notebooks: committed with their outputs (plots visible on the web), those outputs current
against the committed cpu study, and every notebook running on the user's latest run after the
README's first command alone (`gqa-spec reproduce --preset smoke`)."""

import json
import os
import pathlib
import shutil
import sys
import time

import pytest

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')
pytest.importorskip('ipykernel')

REPO = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO / 'notebooks'
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob('*.ipynb'))
KERNEL_NAME = 'gqa-spec-test-python'
# Rendered from the committed cpu study (`results/cpu`, JSON only). The walkthrough decodes with
# the run's checkpoints, which the repository does not hold: it is rendered from a smoke run
# (`python tests/test_notebooks.py --render RESULTS_DIR WORK_DIR`), and checked for its outputs'
# presence, not their text.
FROM_CPU_STUDY = ('gqa_tradeoffs.ipynb', 'speculative_decoding.ipynb')
# Notebooks committed without outputs until rendered (all or nothing; none today: the walkthrough
# was rendered from a smoke run's fine-tuned models, 2026-12-07).
NOT_RENDERED = ()


def _kernel_env(jupyter_dir: pathlib.Path) -> dict:
  """Environment under which the kernel runs this interpreter.

  A kernelspec of our own, pointing at `sys.executable`, in a JUPYTER_PATH entry: the notebooks
  then import the very gqa_spec under test, whatever 'python3' kernels the machine has (a
  user-level 'python3' spec may point at another interpreter).
  """
  spec_dir = jupyter_dir / 'kernels' / KERNEL_NAME
  spec_dir.mkdir(parents=True, exist_ok=True)
  (spec_dir / 'kernel.json').write_text(json.dumps({
      'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
      'display_name': 'gqa-spec tests', 'language': 'python'}))
  return {'JUPYTER_PATH': os.pathsep.join(filter(None, [str(jupyter_dir),
                                                        os.environ.get('JUPYTER_PATH')])),
          'PYTHONPATH': os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')])),
          'JAX_PLATFORMS': 'cpu', 'MPLBACKEND': 'module://matplotlib_inline.backend_inline',
          # Most of a notebook's time is compiling decode loops of tiny models: compile cheaply.
          'XLA_FLAGS': ' '.join(filter(None, [os.environ.get('XLA_FLAGS'),
                                              '--xla_backend_optimization_level=0',
                                              '--xla_llvm_disable_expensive_passes=true']))}


@pytest.fixture(scope='module')
def kernel_env(tmp_path_factory):
  return _kernel_env(tmp_path_factory.mktemp('jupyter'))


def execute(path: pathlib.Path, cwd: pathlib.Path, env: dict, monkeypatch=None):
  """Runs the notebook at `path` in `cwd` under `env` (GQA_SPEC_* unset unless given)."""
  for key in ('GQA_SPEC_RESULTS', 'GQA_SPEC_WORK_DIR'):
    if monkeypatch:
      monkeypatch.delenv(key, raising=False)
    else:
      os.environ.pop(key, None)
  for key, value in env.items():
    if monkeypatch:
      monkeypatch.setenv(key, value)
    else:
      os.environ[key] = value
  nb = nbformat.read(path, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == 'code':
      cell.outputs, cell.execution_count = [], None
  client = nbclient.NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=300,
                                   resources={'metadata': {'path': str(cwd)}})
  client.execute()
  return nb


def texts(nb) -> list:
  """Per code cell: its text outputs (streams, text/plain, text/markdown) and its image count."""
  out = []
  for cell in nb.cells:
    if cell.cell_type != 'code':
      continue
    text = []
    for o in cell.outputs:
      if o.output_type == 'stream':
        text.append(o.text)
      elif o.output_type in ('display_data', 'execute_result'):
        text.extend(o.data.get(k, '') for k in ('text/markdown',) if k in o.data)
      elif o.output_type == 'error':
        text.append(f'error {o.ename}: {o.evalue}')
    images = sum('image/png' in o.get('data', {}) for o in cell.outputs)
    out.append((''.join(text), images))
  return out


def test_there_are_notebooks():
  assert {p.name for p in NOTEBOOKS} >= {'gqa_tradeoffs.ipynb', 'speculative_decoding.ipynb',
                                         'speculative_walkthrough.ipynb'}


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_with_outputs(path):
  """Opened without running (on the web), every notebook shows its plots and tables."""
  nb = nbformat.read(path, as_version=4)
  code = [c for c in nb.cells if c.cell_type == 'code']
  if path.name in NOT_RENDERED:  # all or nothing: no half-run notebook
    assert not any(c.outputs for c in code), f'{path.name}: rendered now? take it off NOT_RENDERED'
    return
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), (
      f'{path.name}: run every cell once, in order (python tests/test_notebooks.py --render)')
  assert not [o for c in code for o in c.outputs if o.output_type == 'error']
  assert sum(n for _, n in texts(nb)) > 0, f'{path.name} is committed without its figures'


@pytest.mark.parametrize('name', FROM_CPU_STUDY)
def test_committed_outputs_are_current(name, kernel_env, monkeypatch):
  """Re-run on the committed cpu study, the notebook prints what it is committed with."""
  path = NOTEBOOKS_DIR / name
  fresh = execute(path, NOTEBOOKS_DIR, {**kernel_env, 'GQA_SPEC_RESULTS': str(REPO / 'results' / 'cpu')},
                  monkeypatch)
  committed = texts(nbformat.read(path, as_version=4))
  assert texts(fresh) == committed, (
      f'{name}: its outputs are stale; re-render it (python tests/test_notebooks.py --render)')
  assert texts(fresh)[0][0].startswith('results: results/cpu')


@pytest.fixture(scope='module')
def fresh_clone(smoke_run, tmp_path_factory):
  """A checkout after the README's first command: the committed results/cpu (older) beside the
  user's results/smoke and runs/smoke (the smoke reproduction), and no GQA_SPEC_* variables."""
  out_dir, work_dir = smoke_run
  root = tmp_path_factory.mktemp('clone')
  (root / 'notebooks').mkdir()
  shutil.copytree(REPO / 'results' / 'cpu', root / 'results' / 'cpu')
  for f in (root / 'results' / 'cpu').iterdir():
    os.utime(f, (1e9, 1e9))  # committed long before the user's run
  (root / 'results' / 'smoke').symlink_to(os.path.abspath(out_dir))
  (root / 'runs').mkdir()
  (root / 'runs' / 'smoke').symlink_to(os.path.abspath(work_dir))
  return root


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_the_users_latest_run(path, fresh_clone, kernel_env, monkeypatch):
  t0 = time.time()
  nb = execute(path, fresh_clone / 'notebooks', kernel_env, monkeypatch)
  seconds = time.time() - t0
  out = texts(nb)
  assert out[0][0].startswith('results: results/smoke'), out[0][0]  # the user's run, not cpu
  assert sum(n for _, n in out) > 0, f'{path.name} drew no figure'
  # A budget, not a benchmark: generous for a shared CPU, tight enough to notice a notebook that
  # retrains or re-measures instead of reading the results.
  assert seconds < 180, f'{path.name} took {seconds:.0f} s'


def render(smoke_results: str = None, smoke_work_dir: str = None) -> None:
  """Re-executes the notebooks in place, with outputs: the cpu study's two from `results/cpu`,
  the walkthrough (when given them) from a smoke run's results and work dir (the cpu study's
  checkpoints are not committed)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  env = _kernel_env(pathlib.Path(tempfile.mkdtemp()))
  for path in NOTEBOOKS:
    run_env = dict(env, GQA_SPEC_RESULTS=str(REPO / 'results' / 'cpu'))
    if path.name not in FROM_CPU_STUDY:
      if not smoke_results:
        continue
      run_env.update(GQA_SPEC_RESULTS=smoke_results, GQA_SPEC_WORK_DIR=smoke_work_dir)
    nb = execute(path, NOTEBOOKS_DIR, run_env)
    nb.metadata['kernelspec'] = {'display_name': 'Python 3', 'language': 'python',
                                 'name': 'python3'}
    nbformat.write(nb, path)
    print(f'{path.name}: rendered')


if __name__ == '__main__':
  if len(sys.argv) not in (2, 4) or sys.argv[1] != '--render':
    sys.exit('usage: python tests/test_notebooks.py --render [SMOKE_RESULTS_DIR SMOKE_WORK_DIR]')
  render(*sys.argv[2:])
