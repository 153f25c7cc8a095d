"""Autoregressive decoding as one `jax.jit` over a `lax.while_loop`: greedy, temperature, top-k, top-p.

Each step feeds every row's last token to a `Decoder`, picks the next with `sampling.choose` and
writes it into a `[b, 1 + max_decode_len]` buffer (slot 0 the start token); a row is done at EOS
or `max_decode_len`, and done rows keep computing with their index rolled back, so they never
change. `loop_chunk` K > 1 runs K steps per while-loop iteration as a fixed-count `fori_loop`
(the host checks the loop condition once per K tokens on XLA:GPU); the tokens are those of K = 1.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp

from gqa_spec.decoding import sampling
from gqa_spec.decoding.sampling import SamplingConfig
from gqa_spec.decoding.targets import Decoder
from gqa_spec.decoding import xla_options

PyTree = Any
DECODER_START = 0
EOS = 1
PAD = 0


@flax.struct.dataclass
class DecodeResult:
  """Output of a decoding loop.

  Attributes:
    sequences: `[b, 1 + max_decode_len (+ slack)]` slot 0 the start token, then the generated
      tokens; slots at and after `1 + lengths` are PAD.
    lengths: `[b]` generated tokens per row, an EOS included.
    target_calls: `[b]` target decode calls made while the row was active.
    loop_iterations: `[]` iterations of the while loop (= target calls of the slowest row).
  """

  sequences: jax.Array
  lengths: jax.Array
  target_calls: jax.Array
  loop_iterations: jax.Array


@flax.struct.dataclass
class _State:
  decoder_state: PyTree
  sequences: jax.Array  # [b, 1 + max_len]
  lengths: jax.Array  # [b]
  done: jax.Array  # [b] bool
  target_calls: jax.Array  # [b]
  iterations: jax.Array  # []
  rng: jax.Array


def finish(sequences: jax.Array, lengths: jax.Array) -> jax.Array:
  """PADs every slot after `1 + lengths` of `[b, T]` sequences."""
  slots = jnp.arange(sequences.shape[1])[None]  # [1, T]
  return jnp.where(slots <= lengths[:, None], sequences, PAD)  # [b, T]


@functools.partial(xla_options.jit, static_argnames=('decoder', 'max_decode_len', 'config',
                                                     'eos_id', 'loop_chunk'))
def decode(decoder: Decoder, decoder_state: PyTree, rng: jax.Array, *, max_decode_len: int,
           config: SamplingConfig = sampling.GREEDY, eos_id: int = EOS,
           skip: Optional[jax.Array] = None, loop_chunk: int = 1) -> DecodeResult:
  """Decodes every row of the batch until EOS or `max_decode_len` tokens.

  Args:
    decoder: static decoder binding (e.g. `T5Decoder(model)`).
    decoder_state: its state with index 0 per row and at least `max_decode_len` cache slots.
    rng: PRNG key (unused when greedy).
    max_decode_len: most tokens generated per row (EOS included).
    config: sampling method (lenience is ignored).
    eos_id: end-of-sequence token.
    skip: optional `[b]` bools: rows that start done (batch padding) and generate nothing.
    loop_chunk: decode steps per while-loop iteration (static trip count; module docstring).

  Returns:
    `DecodeResult`.
  """
  if loop_chunk < 1:
    raise ValueError(f'loop_chunk must be >= 1, got {loop_chunk}')
  index = decoder.index(decoder_state)  # [b]
  batch = index.shape[0]
  sequences = jnp.full((batch, 1 + max_decode_len), PAD, jnp.int32).at[:, 0].set(DECODER_START)
  init = _State(decoder_state=decoder_state, sequences=sequences,
                lengths=jnp.zeros((batch,), jnp.int32),
                done=jnp.zeros((batch,), bool) if skip is None else jnp.asarray(skip, bool),
                target_calls=jnp.zeros((batch,), jnp.int32), iterations=jnp.zeros((), jnp.int32),
                rng=rng)

  def body(s: _State) -> _State:
    rng, step_rng = jax.random.split(s.rng)
    last = jnp.take_along_axis(s.sequences, s.lengths[:, None], axis=1)  # [b, 1]
    logits, dstate = decoder.tokens_to_logits(s.decoder_state, last)  # [b, 1, V]
    token, _ = sampling.choose(step_rng, logits[:, 0], config)  # [b]
    active = ~s.done  # [b]
    dstate = decoder.rollback(dstate, s.lengths + active)  # done rows: no trace
    sequences = jax.vmap(lambda row, t, i: row.at[i].set(t))(
        s.sequences, jnp.where(active, token, PAD), jnp.where(active, s.lengths + 1, 0))
    sequences = sequences.at[:, 0].set(DECODER_START)  # done rows wrote PAD at slot 0
    lengths = s.lengths + active  # [b]
    done = s.done | (active & (token == eos_id)) | (lengths >= max_decode_len)
    return _State(decoder_state=dstate, sequences=sequences, lengths=lengths, done=done,
                  target_calls=s.target_calls + active, iterations=s.iterations + jnp.any(active),
                  rng=rng)

  step = body if loop_chunk == 1 else (  # `loop_chunk` bodies, a static trip count
      lambda s: jax.lax.fori_loop(0, loop_chunk, lambda _, x: body(x), s))
  final = jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, init)
  return DecodeResult(sequences=finish(final.sequences, final.lengths), lengths=final.lengths,
                      target_calls=final.target_calls, loop_iterations=final.iterations)


def strip(sequences, lengths, eos_id: int = EOS) -> list:
  """Host-side: `[b, T]` sequences -> lists of generated ids without the start token and EOS."""
  out = []
  for row, n in zip(jax.device_get(sequences), jax.device_get(lengths)):
    ids = [int(t) for t in row[1:1 + int(n)]]
    if ids and ids[-1] == eos_id:
      ids = ids[:-1]
    out.append(ids)
  return out

