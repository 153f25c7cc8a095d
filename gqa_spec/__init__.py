"""gqa-spec: grouped-query attention and speculative decoding for T5.1.1 in JAX/Flax."""

__version__ = '0.1.0'
