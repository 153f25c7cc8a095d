"""Chimera (Zeng et al. 2024): a light draft that reads the frozen target's own hidden states.

Adapted from the paper's decoder-only target to T5's decoder. Positions are the decoder's: s_0 is
the start token, s_j the j-th generated token, h_j the target decoder's final hidden state at s_j
(the logits layer's input, `Transformer.decode(return_hidden=True)`), which predicts s_{j+1}.

  trigram encoder      g_j = W2 SiLU(W1 [E s_{j-2}; E s_{j-1}; E s_j])       (paper Eq. 2)
                       E is the target's frozen token embedding (an input, not a parameter);
                       j = 0, 1 collapse to uni/bigrams by zero embeddings for the missing tokens.
                       At inference a lookup table (`trigram_table`, below) replaces W1 E.
  full-context block   one T5 block (RMSNorm, relative position bias, gated-GELU MLP) whose query
                       at position j is g_j and whose keys are the target's h_i (i < j, the ones
                       the target has computed when s_j is the newest token) and the trigram
                       states g_i (i <= j: the paper's mask hides every trigram with a future
                       token). Output f_j, trained to match h_j (the paper's MSE term).
  residual heads       head i (1..H) predicts s_{j+i} from [h_{j-1}; f_j] with its own
                       `[2D, V]` kernel (Eq. 3); h_{-1} = 0.

Why no cross-attention to the encoder output: the target's hidden states h_i already carry it
(every target decoder layer cross-attends), the paper's block has none, and adding it would need
the encoder output at drafting time, i.e. a second encoder pass per input or a change to the
target's state; the draft's per-step cost then also does not grow with the input length.

Why head i predicts offset i + 1 from h_{j-1}: when drafting, the newest token s_N (the target's
own correction or bonus token of the last verification) has no target hidden state yet; h_{N-1}
predicted it. So the target's logits layer is "head 0" and heads 1..gamma propose s_{N+1..N+gamma}.
Heads are sliced before the vocabulary projection: a call asks for the first `num_heads` heads
(gamma when drafting) and projects only those, so drafting gamma < H tokens costs gamma heads'
`[2D, V]` products, not H.

The trigram lookup table (the paper's sec. 3.2.1 speed trick). W1 [E a; E b; E c] = W1_a E a +
W1_b E b + W1_c E c (W1 split by rows into the three slots), so `T[k] = E W1_k` (`[3, V, F]`,
computed once per draft from the frozen E and the trained W1) gives every trigram's hidden
pre-activation by three gathers and a sum: g_j = W2 SiLU(T[0, s_{j-2}] + T[1, s_{j-1}] + T[2, s_j])
(a missing token adds 0, as its zero embedding does). This is exact for every trigram. The
paper instead caches whole encoder outputs g for frequent trigrams in an LRU dictionary (V^3
possible keys); a per-token table of the first layer is what fits a jitted, fixed-shape gather
(3 V F floats: 3 x 32,128 x 768 x 4 B = 296 MB at T5-base width and vocabulary, computed in one matmul), and it
removes the trigram encoder's only large product (`[3D, F]` per position) from every draft step.
Training computes W1 x directly (cheaper than the table when batch x length < 3 V).

Initialisation: head i's kernel is [W_lm; 0] (W_lm the target's logits layer), so an untrained
head outputs exactly the target's logits from h_{j-1}; the Chimera code initialises [W_lm; W_lm],
which adds W_lm f_j and is not the target's guess at step 0.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from gqa_spec.models.attention import MultiHeadAttention, RelativePositionBiases
from gqa_spec.models.config import T5Config, check_types
from gqa_spec.models.layers import Dense, MlpBlock, RMSNorm

PyTree = Any


@dataclasses.dataclass(frozen=True)
class ChimeraConfig:
  """Shapes of a Chimera draft; `emb_dim` and `vocab_size` must be the target's.

  Attributes:
    vocab_size: the target's vocabulary size.
    emb_dim: the target's model width D (embedding and hidden states).
    num_heads, head_dim, mlp_dim: the full-context block.
    num_draft_heads: residual heads H (the most draft tokens per step, gamma <= H).
    trigram_dim: hidden width of the trigram MLP.
    relative_attention_num_buckets, relative_attention_max_distance: T5's relative position bias.
    layer_norm_epsilon: RMSNorm epsilon.
    mlp_activations: the block's gated MLP (T5.1.1's gated-GELU).
  """

  vocab_size: int
  emb_dim: int
  num_heads: int = 4
  head_dim: int = 16
  mlp_dim: int = 256
  num_draft_heads: int = 4
  trigram_dim: int = 256
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  mlp_activations: Sequence[str] = ('gelu', 'linear')

  def __post_init__(self):
    check_types(self)
    object.__setattr__(self, 'mlp_activations', tuple(self.mlp_activations))
    for name in ('vocab_size', 'emb_dim', 'num_heads', 'head_dim', 'mlp_dim', 'num_draft_heads',
                 'trigram_dim'):
      if getattr(self, name) < 1:
        raise ValueError(f'ChimeraConfig.{name} must be >= 1, got {getattr(self, name)}')

  @classmethod
  def for_target(cls, target: T5Config, **overrides: Any) -> 'ChimeraConfig':
    """A config sized to a target: its width and vocabulary, its head layout and MLP width."""
    base = dict(vocab_size=target.vocab_size, emb_dim=target.emb_dim, num_heads=target.num_heads,
                head_dim=target.head_dim, mlp_dim=target.mlp_dim, trigram_dim=target.emb_dim,
                relative_attention_num_buckets=target.relative_attention_num_buckets,
                relative_attention_max_distance=target.relative_attention_max_distance,
                layer_norm_epsilon=target.layer_norm_epsilon,
                mlp_activations=target.mlp_activations)
    base.update(overrides)
    return cls(**base)

  @property
  def num_kv_heads(self) -> int:  # the block is multi-head (read by the partitioning rules)
    return self.num_heads

  def check_target(self, target: T5Config) -> None:
    if (target.emb_dim, target.vocab_size) != (self.emb_dim, self.vocab_size):
      raise ValueError(f'Chimera draft (emb_dim {self.emb_dim}, vocab {self.vocab_size}) does not '
                       f'fit the target (emb_dim {target.emb_dim}, vocab {target.vocab_size})')

  def replace(self, **changes: Any) -> 'ChimeraConfig':
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d['mlp_activations'] = list(self.mlp_activations)
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict) -> 'ChimeraConfig':
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f'unknown ChimeraConfig fields {unknown}; known fields: {sorted(known)}')
    return cls(**d)


def trigram_inputs(embedding: jax.Array, tokens: jax.Array) -> jax.Array:
  """`[b, T]` tokens -> `[b, T, 3D]` concatenated embeddings of (s_{j-2}, s_{j-1}, s_j)."""
  emb = jnp.take(embedding, tokens, axis=0)  # [b, T, D]
  pad = jnp.zeros_like(emb[:, :1])  # the collapsed uni/bigrams at j = 0, 1
  prev1 = jnp.concatenate([pad, emb[:, :-1]], axis=1)  # [b, T, D]
  prev2 = jnp.concatenate([pad, pad, emb[:, :-2]], axis=1)[:, :emb.shape[1]]  # [b, T, D]
  return jnp.concatenate([prev2, prev1, emb], axis=-1)  # [b, T, 3D]


def target_logits_kernel(target_config: T5Config, target_params: PyTree) -> jax.Array:
  """The target's logits layer as a `[D, V]` kernel (tied embeddings folded in)."""
  if target_config.logits_via_embedding:
    emb = target_params['token_embedder']['embedding']  # [V, D]
    return emb.T / jnp.sqrt(jnp.float32(target_config.emb_dim))
  return target_params['decoder']['logits_dense']['kernel']  # [D, V]


def trigram_table(params: PyTree, embedding: jax.Array) -> jax.Array:
  """`[3, V, F]` lookup table: slot k's (s_{j-2}, s_{j-1}, s_j) share of the trigram MLP's `wi`.

  `T[k, v] = E[v] @ wi[k D:(k + 1) D]`, so `wi [E a; E b; E c] = T[0, a] + T[1, b] + T[2, c]`.
  """
  wi = params['trigram_mlp']['wi']['kernel'].astype(jnp.float32)  # [3D, F]
  d = embedding.shape[1]
  return jnp.einsum('vd,kdf->kvf', embedding.astype(jnp.float32),
                    wi.reshape(3, d, wi.shape[1]))  # [3, V, F]


def trigram_lookup(table: jax.Array, tokens: jax.Array) -> jax.Array:
  """`[3, V, F]` table, `[b, T]` tokens -> `[b, T, F]` = `wi` applied to `trigram_inputs`."""
  cur = jnp.take(table[2], tokens, axis=0)  # [b, T, F]
  pad = jnp.zeros_like(cur[:, :1])  # the missing tokens of the collapsed uni/bigrams add nothing
  prev1 = jnp.concatenate([pad, jnp.take(table[1], tokens[:, :-1], axis=0)], axis=1)  # [b, T, F]
  prev2 = jnp.concatenate([pad, pad, jnp.take(table[0], tokens[:, :-2], axis=0)],
                          axis=1)[:, :tokens.shape[1]]  # [b, T, F]
  return prev2 + prev1 + cur


class TrigramEncoder(nn.Module):
  """The paper's Eq. 2: `wo SiLU(wi x)` over `[.., 3D]` trigram embeddings, or, given the
  `trigram_table` of the same `wi`, `wo SiLU(lookup)` (the inference path)."""

  hidden_dim: int
  out_dim: int

  @nn.compact
  def __call__(self, embedding: jax.Array, tokens: jax.Array,
               table: Optional[jax.Array] = None) -> jax.Array:
    wi = Dense(self.hidden_dim, name='wi')
    if table is None or self.is_initializing():
      pre = wi(trigram_inputs(embedding, tokens))  # [b, T, F]
    else:
      pre = trigram_lookup(table, tokens)  # [b, T, F]
    return Dense(self.out_dim, name='wo')(nn.silu(pre))  # [b, T, D]


class Chimera(nn.Module):
  """The draft network; see the module docstring for what each part reads."""

  config: ChimeraConfig

  @nn.compact
  def __call__(self, embedding: jax.Array, tokens: jax.Array, target_hidden: jax.Array,
               query_positions: jax.Array, num_heads: Optional[int] = None,
               table: Optional[jax.Array] = None) -> Tuple[jax.Array, jax.Array]:
    """Full-context states and head logits at the query positions.

    Args:
      embedding: `[V, D]` the target's token embedding (frozen by the caller); unused with `table`.
      tokens: `[b, T]` s_0..s_{T-1} by slot (slot = position).
      target_hidden: `[b, T, D]` h_i by slot; slots >= a query's position are never read by it.
      query_positions: `[b, q]` the positions j to predict from (s_j must be in `tokens`).
      num_heads: project only heads 1..num_heads (default all H): gamma when drafting.
      table: `trigram_table(params, embedding)`, the inference path's lookup (default: compute
        the trigram MLP's first layer from `embedding`).

    Returns:
      `(f [b, q, D], logits [b, q, n, V])` with n = num_heads, logits float32; head i's slice is
      `[..., i - 1, :]`.
    """
    cfg = self.config
    num_heads = cfg.num_draft_heads if num_heads is None else num_heads
    if not 1 <= num_heads <= cfg.num_draft_heads:
      raise ValueError(f'num_heads {num_heads} is not in 1..{cfg.num_draft_heads}')
    batch, length = tokens.shape
    g = TrigramEncoder(cfg.trigram_dim, cfg.emb_dim, name='trigram_mlp')(
        embedding, tokens, table)  # [b, T, D]

    slots = jnp.arange(length, dtype=jnp.int32)  # [T]
    qpos = query_positions.astype(jnp.int32)  # [b, q]
    keys = jnp.concatenate([target_hidden.astype(jnp.float32), g], axis=1)  # [b, 2T, D]
    key_pos = jnp.broadcast_to(jnp.concatenate([slots, slots])[None], (batch, 2 * length))
    sees_h = slots[None, None, :] < qpos[:, :, None]  # [b, q, T]
    sees_g = slots[None, None, :] <= qpos[:, :, None]  # [b, q, T]
    mask = jnp.concatenate([sees_h, sees_g], axis=2)[:, None]  # [b, 1, q, 2T]
    bias = RelativePositionBiases(cfg.relative_attention_num_buckets,
                                  cfg.relative_attention_max_distance, cfg.num_heads,
                                  name='relpos_bias')(qpos, key_pos, bidirectional=False)
    norm = RMSNorm(cfg.layer_norm_epsilon, name='pre_attention_layer_norm')
    x = jnp.take_along_axis(g, qpos[:, :, None], axis=1)  # [b, q, D]
    h = MultiHeadAttention(cfg.num_heads, cfg.num_heads, cfg.head_dim, name='attention')(
        norm(x), norm(keys), mask, bias)  # [b, q, D]
    x = x + h
    x = x + MlpBlock(cfg.mlp_dim, cfg.mlp_activations, name='mlp')(
        RMSNorm(cfg.layer_norm_epsilon, name='pre_mlp_layer_norm')(x))
    f = RMSNorm(cfg.layer_norm_epsilon, name='final_norm')(x)  # [b, q, D]

    prev = jnp.concatenate([jnp.zeros_like(target_hidden[:, :1]), target_hidden], axis=1)
    h_prev = jnp.take_along_axis(prev, qpos[:, :, None], axis=1)  # [b, q, D]: h_{j-1}, h_{-1} = 0
    kernel = self.param('heads', nn.initializers.zeros,
                        (cfg.num_draft_heads, 2 * cfg.emb_dim, cfg.vocab_size))  # [H, 2D, V]
    features = jnp.concatenate([h_prev.astype(jnp.float32), f], axis=-1)  # [b, q, 2D]
    logits = jnp.einsum('bqe,hev->bqhv', features, kernel[:num_heads])  # [b, q, n, V]
    return f, logits.astype(jnp.float32)


def init_params(config: ChimeraConfig, target_config: T5Config, target_params: PyTree,
                rng: jax.Array) -> PyTree:
  """Fresh parameters with every head's kernel [W_lm; 0] (the target's logits layer)."""
  config.check_target(target_config)
  d = config.emb_dim
  params = Chimera(config).init(rng, jnp.zeros((config.vocab_size, d)), jnp.zeros((1, 4), jnp.int32),
                                jnp.zeros((1, 4, d)), jnp.zeros((1, 1), jnp.int32))['params']
  w_lm = target_logits_kernel(target_config, target_params).astype(jnp.float32)  # [D, V]
  heads = jnp.concatenate([w_lm, jnp.zeros_like(w_lm)], axis=0)  # [2D, V]
  params = dict(params)
  params['heads'] = jnp.broadcast_to(heads[None], params['heads'].shape)
  return params
