"""What a `gqa-spec` command prints besides its own output: logging set-up and quiet start-up.

TensorFlow (seqio's input pipelines) probes for CUDA when it is imported and when it first lists
devices, and on a machine without a GPU it writes "Could not find cuda drivers on your machine"
and "failed call to cuInit: ... UNKNOWN ERROR (303)" straight to file descriptor 2, from C++,
before its logging is initialised (so TF_CPP_MIN_LOG_LEVEL cannot hide them all). Nothing is
wrong; the lines only alarm. `quiet_startup` runs TensorFlow's import (whenever it first happens)
and its device listing with file descriptor 2 captured, then writes back every captured line except
those of `NOISE`: real warnings and errors still show. `--verbose` skips all of this and restores
the libraries' own INFO logs (absl: orbax, seqio).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import os
import re
import sys
import tempfile

# Lines TensorFlow writes while probing for accelerators on a CPU-only machine.
NOISE = re.compile(
    r'cudart_stub\.cc.*Could not find cuda drivers'
    r'|failed call to cuInit'
    r'|All log messages before absl::InitializeLog\(\) is called are written to STDERR'
    r'|cpu_feature_guard\.cc|To enable the following instructions: .* rebuild TensorFlow'
    r'|oneDNN custom operations are on'
    r'|Unable to register cu(DNN|FFT|BLAS) factory'
    r'|computation placer already registered'
    r'|TF-TRT Warning: Could not find TensorRT')


@contextlib.contextmanager
def filtered_stderr():
  """Captures file descriptor 2 inside the block; afterwards writes back the non-`NOISE` lines."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as capture:
    os.dup2(capture.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      capture.seek(0)
      kept = [line for line in capture.read().decode(errors='replace').splitlines(keepends=True)
              if not NOISE.search(line)]
      if kept:
        os.write(2, ''.join(kept).encode())


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
  """Wraps the loader of the `tensorflow` package so that its import runs in `filtered_stderr`."""

  def find_spec(self, fullname, path, target=None):
    if fullname != 'tensorflow':
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    if spec is not None and spec.loader is not None:
      spec.loader = _QuietLoader(spec.loader)
    return spec


class _QuietLoader(importlib.abc.Loader):

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    with filtered_stderr():
      self._loader.exec_module(module)
      # The CUDA platform is initialised (cuInit) at the first device listing: do it here.
      module.config.list_physical_devices()

  def __getattr__(self, name):  # get_resource_reader, is_package, ... of the real loader
    return getattr(self._loader, name)


def quiet_startup() -> None:
  """Hides TensorFlow's accelerator-probing lines and INFO notices (see the module docstring);
  idempotent."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TF's INFO notices (oneDNN, CPU features)
  quiet_tensorflow_import()


def quiet_tensorflow_import() -> None:
  """Drops the `NOISE` lines of TensorFlow's import, whenever it happens (library use: the package
  calls it on import; it sets no environment variable); idempotent."""
  if 'tensorflow' in sys.modules or any(isinstance(f, _QuietTensorFlowFinder)
                                        for f in sys.meta_path):
    return
  sys.meta_path.insert(0, _QuietTensorFlowFinder())


def configure_logging(verbose: bool = False, library_level: int = logging.WARNING) -> None:
  """`gqa_spec`'s INFO logs (progress lines included) to stderr with timestamps; other libraries'
  warnings, with absl's (orbax, seqio) at `library_level`; with `verbose`, every INFO log."""
  logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                      format='%(asctime)s %(levelname)s %(name)s: %(message)s')
  logging.getLogger('gqa_spec').setLevel(logging.INFO)
  logging.getLogger('absl').setLevel(logging.INFO if verbose else library_level)


def setup(verbose: bool = False, user_tf_level: bool = False) -> None:
  """What `gqa-spec` does before a command: quiet start-up, or with `verbose` TensorFlow's C++
  INFO logs back (unless the user set TF_CPP_MIN_LOG_LEVEL: `user_tf_level`)."""
  if not verbose:
    quiet_startup()
    return
  # everything TensorFlow writes, the probing lines too (the package's import filters them)
  sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietTensorFlowFinder)]
  if not user_tf_level:
    os.environ['TF_CPP_MIN_LOG_LEVEL'] = '0'
