"""Leviathan et al. (2023) sec. 3: expected tokens, the walltime factor and the best gamma.

  alpha       = E[sum_x min(p, q)] over the target's own prefixes (Corollary 6; the loops measure it)
  E[tokens]   = (1 - alpha^(gamma+1)) / (1 - alpha)                     (Eq. 1)
  speedup     = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + v(gamma)))  (Theorem 8 at v = 1)

v(gamma) is the verification call's cost in target steps (Theorem 8 assumes 1); c may be a number
or a function of gamma. `batch_inflation` prices a batch's wait for its slowest row, which Eq. 1
(one row's tokens per iteration) leaves out.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from gqa_spec.errors import UserError

Cost = Union[float, Callable[[int], float]]


def expected_tokens(alpha_: float, gamma: int) -> float:
  """Eq. 1: expected tokens per iteration (the corrected / bonus token included)."""
  if alpha_ >= 1.0:
    return float(gamma + 1)
  return (1 - alpha_ ** (gamma + 1)) / (1 - alpha_)


def _cost(c: Cost, gamma: int) -> float:
  return float(c(gamma)) if callable(c) else float(c)


def walltime_improvement(alpha_: float, gamma: int, c: Cost, verify_ratio: Cost = 1.0) -> float:
  """Theorem 8: expected walltime improvement factor, the verification call costing
  `verify_ratio(gamma)` single target steps (1 in the paper)."""
  return expected_tokens(alpha_, gamma) / (gamma * _cost(c, gamma) + _cost(verify_ratio, gamma))


def optimal_gamma(alpha_: float, c: Cost, max_gamma: int = 64, verify_ratio: Cost = 1.0) -> int:
  """The gamma in [1, max_gamma] maximising the (generalised) Theorem 8 improvement."""
  gammas = np.arange(1, max_gamma + 1)
  values = [walltime_improvement(alpha_, int(g), c, verify_ratio) for g in gammas]
  return int(gammas[int(np.argmax(values))])


# Each batch's rows' output lengths in tokens (greedy decoding's, `calibration.first_stage`): what
# a batch's wait for its slowest row is priced at. (): not priced (Theorem 8 as printed).
Lengths = Tuple[Tuple[float, ...], ...]


def checked_lengths(lengths) -> Lengths:
  """`lengths` as hashable `Lengths`, each batch's rows sorted (one cache key per setting); a
  `UserError` where a batch is empty or a length is not a number > 0."""
  try:
    out = tuple(tuple(sorted(float(x) for x in batch)) for batch in lengths)
  except (TypeError, ValueError):
    raise UserError(f'lengths must be batches of row lengths (numbers > 0), got {lengths!r}'
                    ) from None
  if not all(batch and all(x > 0 for x in batch) for batch in out):
    raise UserError(f'lengths must be non-empty batches of row lengths > 0, got {lengths!r}')
  return out


def checked_costs(cost_ratio: float, verify_ratio, count: int, per: str, alpha_init: float,
                  decay: float, prior_weight: float) -> Union[float, Tuple[float, ...]]:
  """An adaptive policy's costs and prior checked, a `UserError` naming the first bad one;
  returns `verify_ratio` (one number > 0, or `count` numbers > 0, one per `per`) hashable."""
  if not cost_ratio >= 0:
    raise UserError(f'cost ratio must be >= 0, got {cost_ratio}')
  if not 0.0 <= alpha_init <= 1.0 or not 0.0 <= decay < 1.0:
    raise UserError(f'alpha_init must be in [0, 1] and decay in [0, 1), got {alpha_init}, {decay}')
  if not prior_weight >= 0:
    raise UserError(f'prior_weight must be >= 0, got {prior_weight}')
  if isinstance(verify_ratio, (tuple, list)):
    if len(verify_ratio) != count or not all(x > 0 for x in verify_ratio):
      raise UserError(f'per-{per} verify ratios must be {count} numbers > 0, got {verify_ratio}')
    return tuple(float(x) for x in verify_ratio)
  if not verify_ratio > 0:
    raise UserError(f'verify ratio must be > 0, got {verify_ratio}')
  return verify_ratio


_T_GRID = np.geomspace(1e-2, 1e4, 241)  # [T] the t = sqrt(mu / var) `_wait_curve` is made on


@functools.lru_cache(maxsize=256)
def _wait_curve(lengths: Tuple[float, ...]) -> np.ndarray:
  """`[len(_T_GRID)]` h(t) = E[max_r (t (l_r - l_max) + sqrt(l_r) Z_r)] for one batch's row
  lengths l_r (Z_r independent standard normals), by quadrature on each t of `_T_GRID`; 0 for
  one row. Rows of one length enter once, as a power."""
  l = np.maximum(np.asarray(lengths, np.float64), 1.0)  # [R]
  if l.size == 1:
    return np.zeros_like(_T_GRID)
  top = float(np.max(l))
  x = np.linspace(-8.0 * np.sqrt(top), 8.0 * np.sqrt(top), 401)  # [Q] max >= the longest row's
  cdf = np.ones((_T_GRID.size, x.size))  # [T, Q] P(max <= x)
  for length, count in zip(*np.unique(l, return_counts=True)):
    z = (x[None] - _T_GRID[:, None] * (length - top)) / np.sqrt(length)  # [T, Q]
    cdf *= special.ndtr(z) ** count
  integral = np.sum(cdf[:, 1:] + cdf[:, :-1], axis=-1) * (x[1] - x[0]) / 2  # [T] trapezoids
  return x[-1] - integral  # E[max] = x_hi - int F dx, F(x_lo) ~ 0


def batch_inflation(alphas: np.ndarray, max_gamma: int, lengths: Lengths) -> np.ndarray:
  """`[n]` alphas -> `[n, max_gamma + 1]`: batches' expected iterations at each gamma over what
  Eq. 1 gives for their longest rows (sum of l_max / E[tokens]), for batches whose rows need
  `lengths` tokens (1 where `lengths` is (): not priced).

  A row's tokens per iteration X are 1 + its accepted count (a geometric at alpha, cut at gamma):
  mean mu = Eq. 1, E[X^2] = sum_{j=1}^{gamma+1} (2j - 1) alpha^(j-1), variance var. A row's
  iterations K_r to reach its l_r tokens have mean (l_r + E[overshoot]) / mu (Wald; the last
  iteration's tokens past the end, in the stationary limit o = (E[X^2] - mu) / (2 mu)) and
  variance ~ l_r var / mu^3 (renewal theory), and the batch waits for the largest, by quadrature
  over independent normals (`_wait_curve`). So, per batch,

    E[max_r K_r] = (l_max + o) / mu + sqrt(var / mu^3) h(sqrt(mu / var)),

  with h from `_wait_curve`."""
  a = np.clip(np.asarray(alphas, np.float64), 0.0, 1.0)[:, None]  # [n, 1]
  if not lengths:
    return np.ones((a.shape[0], max_gamma + 1))
  powers = a ** np.arange(max_gamma + 1)[None]  # [n, G + 1] alpha^j, j = 0..G
  mu = np.cumsum(powers, axis=-1)  # [n, G + 1]
  ex2 = np.cumsum((2.0 * np.arange(max_gamma + 1) + 1.0)[None] * powers, axis=-1)  # [n, G + 1]
  var = np.maximum(ex2 - mu * mu, 0.0)  # [n, G + 1]
  scale = np.sqrt(var / mu ** 3)  # [n, G + 1] sigma' (0 where X is certain: no wait)
  log_t = np.log(np.clip(np.sqrt(mu / np.maximum(var, 1e-300)), _T_GRID[0], _T_GRID[-1]))
  wait = sum(np.interp(log_t, np.log(_T_GRID), _wait_curve(b))
             for b in checked_lengths(lengths))  # [n, G + 1]
  longest = sum(max(b) for b in lengths)
  return 1.0 + (len(lengths) * (ex2 - mu) / (2.0 * mu) + mu * scale * wait) / longest


def tree_batch_inflation(accepted: Sequence[float], depth: int, lengths: Lengths) -> np.ndarray:
  """`[K]` accepted draft tokens a call of trees of depth `depth` -> `[K]` `batch_inflation` of
  the chain of `depth` tokens whose per-token alpha accepts as many on average (found by
  bisection; a tree's accepted count has no closed form). 1 where `lengths` is ()."""
  accepted = np.clip(np.asarray(accepted, np.float64), 0.0, float(depth))  # [K]
  if not lengths:
    return np.ones(accepted.shape)
  powers = np.arange(1, depth + 1)  # [D]
  lo, hi = np.zeros_like(accepted), np.ones_like(accepted)  # [K]
  for _ in range(60):
    mid = (lo + hi) / 2
    low = np.sum(mid[:, None] ** powers[None], axis=1) < accepted  # [K]
    lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
  return batch_inflation((lo + hi) / 2, depth, lengths)[:, depth]


def _theorem8_gammas(alphas: np.ndarray, c: float, max_gamma: int,
                     verify_ratio: Tuple[float, ...], lengths: Lengths = ()) -> np.ndarray:
  """`[n]` alphas -> `[n]`: the gamma in [0, max_gamma] maximising Theorem 8 (the expected tokens
  over `batch_inflation` where `lengths` are given), in NumPy float64."""
  gammas = np.arange(max_gamma + 1, dtype=np.float64)  # [G + 1]
  a = np.clip(alphas, 0.0, 1.0)[:, None]  # [n, 1]
  tokens = np.cumsum(a ** gammas[None], axis=-1)  # [n, G + 1]
  tokens = tokens / batch_inflation(alphas, max_gamma, lengths)  # [n, G + 1]
  cost = gammas * c + np.concatenate([[1.0], verify_ratio])  # [G + 1]
  return np.argmax(tokens / cost[None], axis=-1)  # [n] (the first maximum: ties to the smaller)


@functools.lru_cache(maxsize=256)
def optimal_gamma_steps(c: float, max_gamma: int, verify_ratio: Union[float, Tuple[float, ...]],
                        lengths: Lengths = (), grid: int = 1 << 14) -> Tuple[np.ndarray, np.ndarray]:
  """Theorem 8's gamma (`_theorem8_gammas`) as a step function of alpha: `(edges [m] float32
  ascending, gammas [m + 1] int32)`, the gamma at alpha being `gammas[sum(alpha > edges)]` (at an
  edge, where two gammas tie, the one before it: the smaller where gamma grows with alpha).
  Found on `grid` + 1 evenly spaced alphas in [0, 1], each change bisected to float32
  resolution. Both the host (`step_gamma`) and the jitted loops (`optimal_gammas`) read it."""
  v = tuple(np.broadcast_to(np.asarray(verify_ratio, np.float64), (max_gamma,)).tolist())
  alphas = np.linspace(0.0, 1.0, grid + 1)
  gammas = _theorem8_gammas(alphas, c, max_gamma, v, lengths)
  edges, values = [], [int(gammas[0])]
  for i in np.flatnonzero(gammas[1:] != gammas[:-1]):
    lo, hi = alphas[i], alphas[i + 1]  # gamma(lo) = values[-1] != gamma(hi)
    while np.float32(lo) != np.float32(hi) and hi - lo > 1e-12:
      mid = (lo + hi) / 2
      if _theorem8_gammas(np.array([mid]), c, max_gamma, v, lengths)[0] == values[-1]:
        lo = mid
      else:
        hi = mid
    edges.append(hi)
    values.append(int(gammas[i + 1]))
  return np.asarray(edges, np.float32), np.asarray(values, np.int32)


def _steps(c: float, max_gamma: int, verify_ratio, lengths: Lengths):
  """`optimal_gamma_steps` of these settings, made hashable."""
  v = (float(verify_ratio) if np.ndim(verify_ratio) == 0 else
       tuple(float(x) for x in np.asarray(verify_ratio).reshape(-1)))
  return optimal_gamma_steps(float(c), int(max_gamma), v, checked_lengths(lengths))


def step_gamma(alpha_: float, c: float, max_gamma: int,
               verify_ratio: Union[float, Sequence[float]] = 1.0, lengths: Lengths = ()) -> int:
  """`optimal_gammas` at one alpha, on the host (no device op): a Python int."""
  edges, gammas = _steps(c, max_gamma, verify_ratio, lengths)
  return int(gammas[int(np.sum(np.float32(min(max(alpha_, 0.0), 1.0)) > edges))])


def optimal_gammas(alpha_: jax.Array, c: float, max_gamma: int,
                   verify_ratio: Union[float, Sequence[float]] = 1.0,
                   lengths: Lengths = ()) -> jax.Array:
  """`[b]` alphas -> `[b]` int32: the gamma in [0, max_gamma] maximising Theorem 8, in jitted code.

  A gamma >= 1 costs gamma c + v(gamma) target steps (`verify_ratio`: one number or
  v(1)..v(max_gamma)); gamma 0 (plain steps) wins when no gamma pays; ties go to the smaller.
  With `lengths` the expected tokens are over the batch's iterations (`batch_inflation`). Read
  from `optimal_gamma_steps`: a comparison and a sum here."""
  edges, gammas = _steps(c, max_gamma, verify_ratio, lengths)
  a = jnp.clip(alpha_.astype(jnp.float32), 0.0, 1.0)  # [b]
  index = jnp.sum(a[:, None] > jnp.asarray(edges)[None], axis=1)  # [b]
  return jnp.asarray(gammas)[index]  # [b]
