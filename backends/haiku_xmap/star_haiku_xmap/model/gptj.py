"""GPT-J in dm-haiku (the architecture of HF ``GPTJForCausalLM``), mesh-agnostic:
its blocks and network, run through the public API of ``model.py``.

Parameter tree (haiku names; the HF importer maps onto exactly these)::

    wte/embeddings (V, D)
    h_{i}/ln/{scale, offset} (D,)
    h_{i}/attn/{q, k, v}/w (D, H*K)      h_{i}/attn/out/w (H*K, D)
    h_{i}/mlp/fc_in/{w (D, F), b (F,)}   h_{i}/mlp/fc_out/{w (F, D), b (D,)}
    ln_f/{scale, offset} (D,)            lm_head/{w (D, V), b (V,)}

The network is Haiku modules (``Block`` = ``LayerNorm`` + ``Attention`` + ``MLP``,
with the ``layers.py`` pieces), each creating its parameters where it uses them;
it is laid out for XLA:CPU: a 2-D (B*T, D) residual stream, attention in
head-major (B, H, T, K) order (grouped-query attention with one query head per
key/value head), per-layer KV caches.

Shape suffixes: B batch, T query time, S key/cache slots, D d_model, H heads,
K head dim, V vocabulary, F d_ff, L layers.
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from .config import GPTJConfig
from .layers import (Embed, KVCache, LayerNorm, Linear, Shared, attend, attention_prologue, dtype_of,
                     layer_loop)


# ----------------------------------------------------------------------------- rotary


def _rotary_sin_cos(positions_BT: jax.Array, rotary_dim: int) -> tuple[jax.Array, jax.Array]:
    """GPT-J's sin/cos tables (B, T, 1, rotary_dim), each frequency repeated x2 for interleaved pairs."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, rotary_dim, 2, dtype=np.float32) / rotary_dim))
    angle_BTR = positions_BT.astype(jnp.float32)[..., None] * inv_freq  # R = rotary_dim // 2
    sin = jnp.repeat(jnp.sin(angle_BTR), 2, axis=-1)[:, :, None, :]
    cos = jnp.repeat(jnp.cos(angle_BTR), 2, axis=-1)[:, :, None, :]
    return sin, cos


def _rotate_every_two(x: jax.Array) -> jax.Array:
    # pairs (0,1), (2,3), ... -> (-x1, x0), (-x3, x2), ...
    x_even, x_odd = x[..., ::2], x[..., 1::2]
    return jnp.stack((-x_odd, x_even), axis=-1).reshape(x.shape)


def _apply_rotary(x: jax.Array, sin: jax.Array, cos: jax.Array, rotary_dim: int) -> jax.Array:
    """Rotate the first ``rotary_dim`` dims of each head (last axis); fp32 like HF.

    The tables are widened to the head (cos 1, sin 0 past ``rotary_dim``), which
    leaves those dims exactly as they are without slicing and concatenating
    (whose gradients are pads and adds)."""
    xf = x.astype(jnp.float32)
    extra = x.shape[-1] - rotary_dim
    if extra:
        widen = lambda t, fill: jnp.concatenate([t, jnp.full(t.shape[:-1] + (extra,), fill, t.dtype)], axis=-1)
        sin, cos = widen(sin, 0.0), widen(cos, 1.0)
    return (xf * cos + _rotate_every_two(xf) * sin).astype(x.dtype)


# ----------------------------------------------------------------------------- modules


class Attention(hk.Module):
    """GPT-J self-attention of the (N, D) normalised stream: bias-free q/k/v
    projections to H heads, interleaved rotary on q and k, softmax attention over
    the layer's keys (the T new ones, or the cache with them written in) and the
    output projection. Returns (output (N, D), keys, values (B, H, S, K))."""

    def __init__(self, config: GPTJConfig, *, name: str = "attn"):
        super().__init__(name=name)
        self.config = config

    def __call__(self, h_ND: jax.Array, sh: Shared, kv: tuple[jax.Array, jax.Array] | None):
        c = self.config
        B, T, H, K = sh.B, sh.T, c.n_head, c.d_head
        # Three matmuls: one fused q/k/v matmul measured no faster here, and its
        # stacked weight would cost memory (or a copy per decode step) at 6B.
        q_BHTK, k_BHTK, v_BHTK = (Linear(H * K, name=n)(h_ND).reshape(B, T, H, K).transpose(0, 2, 1, 3)
                                  for n in "qkv")
        q_BHTK = _apply_rotary(q_BHTK, sh.sin, sh.cos, c.rotary_dim)
        k_BHTK = _apply_rotary(k_BHTK, sh.sin, sh.cos, c.rotary_dim)
        return attend(q_BHTK, k_BHTK, v_BHTK, sh, kv, c.d_model, dtype_of(c))


class MLP(hk.Module):
    """GPT-J's feed-forward: ``fc_out(gelu_new(fc_in(h)))``, (N, D) -> (N, F) -> (N, D)."""

    def __init__(self, config: GPTJConfig, *, name: str = "mlp"):
        super().__init__(name=name)
        self.config = config

    def __call__(self, h_ND: jax.Array) -> jax.Array:
        c = self.config
        ff_NF = jax.nn.gelu(Linear(c.d_ff, bias=True, name="fc_in")(h_ND), approximate=True)
        return Linear(c.d_model, bias=True, name="fc_out")(ff_NF)


class Block(hk.Module):
    """One GPT-J layer, ``x + attn(ln(x)) + mlp(ln(x))`` (parallel residual: both
    read the same normalised input). Returns (x (N, D), the layer's keys, values)."""

    def __init__(self, config: GPTJConfig, *, name: str):
        super().__init__(name=name)
        self.config = config

    def __call__(self, x_ND: jax.Array, sh: Shared, kv: tuple[jax.Array, jax.Array] | None):
        h_ND = LayerNorm(self.config.ln_eps, name="ln")(x_ND)
        attn_ND, k_BHSK, v_BHSK = Attention(self.config)(h_ND, sh, kv)
        mlp_ND = MLP(self.config)(h_ND)
        return x_ND + attn_ND + mlp_ND, k_BHSK, v_BHSK


# ----------------------------------------------------------------------------- network


def network(config: GPTJConfig, tokens_BT, positions_BT, key_mask_BS, cache: KVCache | None, start,
            last_only: bool = False, segments_BT=None, head: bool = True, prefix: KVCache | None = None):
    """Logits (B, T, V) fp32 (``last_only``: (B, 1, V) of the last slot) and the
    new per-layer keys/values (run inside ``hk.transform``: ``model``); ``head=False``:
    the final hidden states (B, T, D) (after ``ln_f``, in the compute dtype) in place of
    the logits, which the caller projects itself (``network.output_head``).

    Without a cache the keys are the T input tokens (S == T) and the second
    result is the (k, v) tuples of those T slots. With a cache the T new tokens
    are written into slots [start, start + T) and attend to every slot;
    ``key_mask_BS`` marks which of the S slots hold real tokens (left padding is
    False). ``start`` is one slot for every row, or a (B,) array: row b then
    writes (and its queries sit at) slots [start[b], start[b] + T).
    ``segments_BT`` (no cache): packed rows, a token attends only to the
    tokens of its own segment (block-diagonal causal attention). ``prefix`` (with a
    cache): the keys/values (1, H, P, K) per layer of P tokens every row continues,
    kept out of the cache and read once for all rows (``layers.prefix_attention``);
    the cache then holds each row's own tokens, whose positions start at P.

    The modules are made here, at the top level, so that their parameters are
    ``wte``, ``h_{i}/...``, ``ln_f``, ``lm_head`` with no enclosing module name.
    """
    c = config
    B, T = tokens_BT.shape
    x_ND = Embed(c.vocab, c.d_model)(tokens_BT.reshape(B * T), dtype_of(c))
    sin, cos = _rotary_sin_cos(positions_BT, c.rotary_dim)
    sin, cos = sin.transpose(0, 2, 1, 3), cos.transpose(0, 2, 1, 3)  # (B, 1, T, R): broadcast over heads
    sh = attention_prologue(B, T, sin, cos, key_mask_BS, cache, start, segments_BT,
                            prefix_len=0 if prefix is None else prefix.k[0].shape[2])
    x_ND, kv = layer_loop(x_ND, sh, cache, c.n_layer, lambda i: Block(c, name=f"h_{i}"), last_only, prefix)
    x_ND = LayerNorm(c.ln_eps, name="ln_f")(x_ND)
    if not head:
        return x_ND.reshape(B, -1, c.d_model), kv
    logits_NV = Linear(c.vocab, bias=True, name="lm_head")(x_ND).astype(jnp.float32)
    return logits_NV.reshape(B, -1, c.vocab), kv
