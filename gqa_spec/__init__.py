"""gqa-spec: grouped-query attention and speculative decoding for T5.1.1 in JAX/Flax."""

from gqa_spec import console as _console

__version__ = '0.1.0'

# Library use too (not only the `gqa-spec` command): TensorFlow's CUDA-probing lines on a machine
# without a GPU ("failed call to cuInit") are dropped when seqio first imports it (`console`).
_console.quiet_tensorflow_import()
