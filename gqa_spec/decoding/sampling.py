"""Logits -> adjusted distributions, and the modified rejection sampling of speculative decoding.

Every sampling method is standard sampling from an adjusted distribution (Leviathan et al. 2023,
sec. 2.2): temperature, then top-k, then top-p; temperature 0 is argmax. The same adjustment is
applied to the target's p and the draft's q, which keeps speculative sampling exact for every
method. `verify` accepts draft token x_i when r_i < p_i(x_i) / (l q_i(x_i)), r_i ~ U[0, 1)
(lenience l = 1 is exact), resamples the first rejected position from norm(max(0, p - q)) and
otherwise draws the bonus token from p_{gamma+1}. At temperature 0 a token is accepted while it is
the target's argmax or, with l < 1, while p(x) >= l max p (sec. A.5, as its stated intent; the
printed inequality is reversed).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from gqa_spec.errors import UserError


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How tokens are chosen; hashable so it can be a static `jax.jit` argument.

  Attributes:
    temperature: 0 = greedy (argmax); > 0 divides the logits.
    top_k: keep the k most likely tokens (0 = off).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1.0 = off).
    lenience: l in (0, 1] of speculative acceptance (1 = exact); ignored by autoregressive decoding.
  """

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  lenience: float = 1.0

  def __post_init__(self):
    if not self.temperature >= 0:
      raise UserError(f'temperature must be >= 0, got {self.temperature}')
    if int(self.top_k) != self.top_k or self.top_k < 0:
      raise UserError(f'top_k must be a non-negative integer, got {self.top_k}')
    if not 0.0 < self.top_p <= 1.0:
      raise UserError(f'top_p must be in (0, 1], got {self.top_p}')
    if not 0.0 < self.lenience <= 1.0:
      raise UserError(f'lenience must be in (0, 1], got {self.lenience}')

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


GREEDY = SamplingConfig()
NEG_INF = -1.0e7  # t5x's "effective -inf": masked logits, dead beams


def adjust_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
  """`[..., V]` logits -> `[..., V]` float32 probabilities of the configured sampling method."""
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  if config.greedy:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), vocab, dtype=jnp.float32)  # [..., V]
  # Shifted to a maximum of 0: a masked logit (NEG_INF) then has no mass at any temperature.
  logits = (logits - jnp.max(logits, axis=-1, keepdims=True)) / config.temperature
  if 0 < config.top_k < vocab:
    logits = topk_mask(logits, config.top_k)
  if config.top_p < 1.0:
    logits = topp_mask(logits, config.top_p)
  return jax.nn.softmax(logits, axis=-1)  # [..., V]


def topk_mask(logits: jax.Array, k: jax.Array) -> jax.Array:
  """Keeps the logits >= the k-th largest (ties kept, as t5x's `binary_search.topk_mask`).

  Args:
    logits: `[..., V]`.
    k: scalar, possibly traced; k >= V keeps everything.

  Returns:
    `[..., V]` with the others set to NEG_INF.
  """
  vocab = logits.shape[-1]
  ascending = jnp.sort(logits, axis=-1)  # [..., V]
  pos = jnp.clip(vocab - jnp.asarray(k, jnp.int32), 0, vocab - 1)
  kth = jax.lax.dynamic_index_in_dim(ascending, pos, axis=-1, keepdims=True)  # [..., 1]
  return jnp.where(logits >= kth, logits, jnp.asarray(NEG_INF, logits.dtype))


def topp_mask(logits: jax.Array, p: jax.Array) -> jax.Array:
  """Keeps the smallest set of most likely tokens whose mass is >= p (ties at the edge kept).

  The set of t5x's `binary_search.topp_mask`, except that p <= 0 keeps everything (t5x's binary
  search masks every token for a traced p = 0).

  Args:
    logits: `[..., V]`.
    p: scalar or `[rows]` (for `[rows, V]` logits), possibly traced.

  Returns:
    `[..., V]` with the others set to NEG_INF.
  """
  p = jnp.asarray(p, jnp.float32)
  p = p[..., None] if p.ndim else p  # [rows, 1] or []
  probs = jax.nn.softmax(logits, axis=-1)  # [..., V]
  descending = -jnp.sort(-probs, axis=-1)  # [..., V]
  mass = jnp.cumsum(descending, axis=-1)  # [..., V]
  # The first sorted position whose cumulative mass reaches p (the last one if none does).
  edge = jnp.minimum(jnp.sum(mass < p, axis=-1, keepdims=True), probs.shape[-1] - 1)  # [..., 1]
  threshold = jnp.take_along_axis(descending, edge, axis=-1)  # [..., 1]
  keep = (probs >= threshold) | (p <= 0)
  return jnp.where(keep, logits, jnp.asarray(NEG_INF, logits.dtype))


def sample(rng: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one token per row from `[..., V]` probabilities -> `[...]` int32."""
  return jax.random.categorical(rng, jnp.log(probs), axis=-1).astype(jnp.int32)


def choose(rng: jax.Array, logits: jax.Array, config: SamplingConfig) -> Tuple[jax.Array, jax.Array]:
  """Picks tokens from `[..., V]` logits -> (`[...]` tokens, `[..., V]` the adjusted distribution)."""
  probs = adjust_logits(logits, config)  # [..., V]
  if config.greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), probs
  return sample(rng, probs), probs


def _first_rejection(accept: jax.Array) -> jax.Array:
  """`[b, gamma]` bools -> `[b]` number of leading Trues."""
  return jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=-1), axis=-1)


def verify(rng: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array,
           target_logits: jax.Array, config: SamplingConfig, limit: Optional[jax.Array] = None
           ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Modified rejection sampling of one speculative iteration.

  Args:
    rng: PRNG key.
    draft_tokens: `[b, gamma]` the draft's proposals x_1..x_gamma.
    draft_probs: `[b, gamma, V]` the draft's adjusted q_1..q_gamma (one-hot for deterministic drafts;
      unused at temperature 0).
    target_logits: `[b, gamma + 1, V]` target logits for p_1..p_{gamma+1}.
    config: sampling method and lenience.
    limit: optional `[b]` in [0, gamma]: row r verifies only its first limit[r] draft tokens
      (the bonus token then comes from p_{limit+1}).

  Returns:
    (`[b]` n, the number of accepted draft tokens; `[b]` the corrected / bonus token t;
     `[b, gamma]` beta_i = sum_x min(p_i / l, q_i), position i's acceptance probability).
  """
  gamma = draft_tokens.shape[1]
  lenience = config.lenience
  if config.greedy:
    argmax = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [b, gamma + 1]
    accept = draft_tokens == argmax[:, :gamma]  # [b, gamma]
    if lenience < 1.0:
      p = jax.nn.softmax(target_logits[:, :gamma].astype(jnp.float32), axis=-1)  # [b, gamma, V]
      p_x = jnp.take_along_axis(p, draft_tokens[..., None], axis=-1)[..., 0]  # [b, gamma]
      accept |= p_x >= lenience * jnp.max(p, axis=-1)
  else:
    p = adjust_logits(target_logits, config)  # [b, gamma + 1, V]
    q = draft_probs.astype(jnp.float32)  # [b, gamma, V]
    if limit is not None:
      q = jnp.where((jnp.arange(gamma)[None] < limit[:, None])[..., None], q, 0.0)  # [b, gamma, V]
    p_x = jnp.take_along_axis(p[:, :gamma], draft_tokens[..., None], axis=-1)[..., 0]  # [b, gamma]
    q_x = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]  # [b, gamma]
    r_rng, t_rng = jax.random.split(rng)
    r = jax.random.uniform(r_rng, p_x.shape)  # [b, gamma] in [0, 1)
    accept = r * lenience * q_x < p_x  # r < p / (l q), without dividing by q = 0
  if limit is not None:
    accept &= jnp.arange(gamma)[None] < limit[:, None]  # [b, gamma]
  n = _first_rejection(accept)  # [b]
  if config.greedy:  # rejected or all accepted, the next token is the target's argmax at n + 1
    return n, jnp.take_along_axis(argmax, n[:, None], axis=1)[:, 0], accept.astype(jnp.float32)
  p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]  # [b, V] p_{n+1}
  q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)  # [b, gamma + 1, V]
  q_n = jnp.take_along_axis(q_pad, n[:, None, None], axis=1)[:, 0]  # [b, V]; zeros if all accepted
  residual = jnp.maximum(p_n - q_n, 0.0)  # [b, V]
  mass = jnp.sum(residual, axis=-1, keepdims=True)  # [b, 1]
  # mass == 0 only when p_{n+1} <= q_{n+1} everywhere, i.e. p == q, where rejection cannot happen
  # (up to float rounding): fall back to p then.
  residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_n)  # [b, V]
  token = sample(t_rng, residual)  # [b]
  beta = jnp.sum(jnp.minimum(p[:, :gamma] / lenience, q), axis=-1)  # [b, gamma]
  return n, token, beta
