"""XLA compiler options for the decoding loops: `fast_compile()` trades run time for compile time.

Inside `fast_compile()` the decoding loops (and the encoder/cache init) compile with LLVM's
optimisation off and XLA:CPU's simpler emitters (the test suite's `CHEAP_XLA_FLAGS`): the same
tokens, slower code. Functions decorated with `xla_options.jit` (as `jax.jit`) keep one compiled
version per set of options; `decoding.mesh` keys its loops by them too.

  with xla_options.fast_compile():
    result = speculative.decode(...)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import jax

# XLA debug options (`jax.jit(compiler_options=...)`), as tests/conftest.py's CHEAP_XLA_FLAGS.
FAST_COMPILE: Dict[str, Any] = {'xla_backend_optimization_level': 0,
                                'xla_llvm_disable_expensive_passes': True,
                                'xla_cpu_use_fusion_emitters': False}
_OPTIONS: contextvars.ContextVar = contextvars.ContextVar('gqa_spec_decoding_compiler_options',
                                                         default=None)


@contextlib.contextmanager
def fast_compile(enabled: bool = True):
  """Decoding loops compiled inside the block use `FAST_COMPILE` (`enabled` False: the defaults)."""
  token = _OPTIONS.set(dict(FAST_COMPILE) if enabled else None)
  try:
    yield
  finally:
    _OPTIONS.reset(token)


def current() -> Optional[Dict[str, Any]]:
  """The compiler options in force (None: XLA's defaults)."""
  return _OPTIONS.get()


def key() -> Optional[Tuple[Tuple[str, Any], ...]]:
  """`current()` as a hashable cache key."""
  options = current()
  return None if options is None else tuple(sorted(options.items()))


def jit(fun: Optional[Callable] = None, **jit_kwargs):
  """`jax.jit(fun, **jit_kwargs)` compiled with the options in force at each call (and `.lower`).

  Called inside another jit (an argument is a tracer: one decoding function built on another,
  `adaptive.decode`'s greedy path on `autoregressive.decode`), it is a plain `jax.jit`: JAX
  refuses compiler options on a nested jit, and the outer one's options apply anyway."""
  if fun is None:
    return functools.partial(jit, **jit_kwargs)
  versions: Dict[Any, Any] = {}
  lock = threading.Lock()  # threads compiling side by side (`timing.first_runs`) share a version

  def version(k):
    with lock:
      if k not in versions:
        versions[k] = jax.jit(fun, compiler_options=None if k is None else dict(k),
                              **jit_kwargs)
      return versions[k]

  @functools.wraps(fun)
  def call(*args, **kwargs):
    k = key()
    if k is not None and any(isinstance(x, jax.core.Tracer)
                             for x in jax.tree_util.tree_leaves((args, kwargs))):
      k = None  # nested: the outer jit's options
    return version(k)(*args, **kwargs)

  call.lower = lambda *args, **kwargs: version(key()).lower(*args, **kwargs)
  return call
