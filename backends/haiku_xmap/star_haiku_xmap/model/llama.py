"""Llama-style decoders in dm-haiku (HF ``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
``MistralForCausalLM``), behind the same public API as GPT-J (``model.py``, through the architecture
registry ``architectures.py``).

Parameter tree (haiku names; ``convert/hf_llama.py`` maps the HF tensors onto them)::

    wte/embeddings (V, D)
    h_{i}/ln_attn/scale (D,)              h_{i}/ln_mlp/scale (D,)        RMSNorm weights
    h_{i}/attn/q/w (D, H*K)               h_{i}/attn/{k, v}/w (D, G*K)
    h_{i}/attn/{q, k, v}/b                (qkv_bias: Qwen2)
    h_{i}/attn/out/w (H*K, D)
    h_{i}/mlp/{gate, up}/w (D, F)         h_{i}/mlp/down/w (F, D)
    ln_f/scale (D,)                       lm_head/w (D, V)  (absent when tie_embeddings)

The network is Haiku modules as GPT-J's (``Block`` = ``RMSNorm`` + ``Attention`` +
``MLP``, with the ``layers.py`` pieces), each creating the parameters it uses.
Each block is ``x + attn(rms(x))`` then ``x + down(silu(gate(h)) * up(h))`` with
``h = rms(x)`` (sequential residual, unlike GPT-J's parallel one). Query head
``j`` reads key/value head ``j // (H / G)``, as HF's ``repeat_kv``; the cache holds
the G key/value heads only, (B, G, S, K) per layer. Rotary embeddings rotate the
two halves of each head (HF's ``rotate_half``), with HF's inverse frequencies:
``rope_theta`` as base and, with ``rope_scaling``, Llama 3's smoothed scaling.

The sliding window (Mistral) is measured in real tokens (``layers.attention_prologue``).
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from .config import LlamaConfig
from .layers import Embed, KVCache, Linear, RMSNorm, Shared, attend, attention_prologue, dtype_of, layer_loop


def inv_freq(config: LlamaConfig) -> np.ndarray:
    """HF's rotary inverse frequencies (fp32, K/2): ``rope_theta ** -(2i / K)``, then
    (``rope_scaling``, rope_type "llama3") long wavelengths divided by ``factor``,
    short ones kept, and those between interpolated smoothly."""
    K = config.d_head
    base = np.float32(1.0) / (np.float32(config.rope_theta) ** (np.arange(0, K, 2).astype(np.float32) / np.float32(K)))
    if config.rope_scaling is None:
        return base.astype(np.float32)
    factor, low, high, old_ctx = (np.float32(x) for x in config.rope_scaling)
    wavelen = np.float32(2 * np.pi) / base
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    scaled = np.where(wavelen > low_wavelen, base / factor, base)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _rotary(x_BHTK: jax.Array, sin_B1TK: jax.Array, cos_B1TK: jax.Array) -> jax.Array:
    """HF's ``x * cos + rotate_half(x) * sin`` with rotate_half(x) = (-x2, x1) over
    the two halves of the head; the tables are cast to the activation dtype, as HF."""
    half = x_BHTK.shape[-1] // 2
    rotated = jnp.concatenate([-x_BHTK[..., half:], x_BHTK[..., :half]], axis=-1)
    return x_BHTK * cos_B1TK.astype(x_BHTK.dtype) + rotated * sin_B1TK.astype(x_BHTK.dtype)


class Attention(hk.Module):
    """Grouped-query self-attention of the (N, D) normalised stream: q (H heads) and
    k, v (G heads) projections (with biases under ``qkv_bias``), half-split rotary
    on q and k, softmax attention over the layer's keys (the T new ones, or the
    cache with them written in) and the output projection. Returns (output (N, D),
    keys, values (B, G, S, K))."""

    def __init__(self, config: LlamaConfig, *, name: str = "attn"):
        super().__init__(name=name)
        self.config = config

    def __call__(self, h_ND: jax.Array, sh: Shared, kv: tuple[jax.Array, jax.Array] | None):
        c = self.config
        B, T, H, G, K = sh.B, sh.T, c.n_head, c.n_kv_head, c.d_head

        def proj(name, heads):
            y_ND = Linear(heads * K, bias=c.qkv_bias, name=name)(h_ND)
            return y_ND.reshape(B, T, heads, K).transpose(0, 2, 1, 3)

        q_BHTK = _rotary(proj("q", H), sh.sin, sh.cos)
        k_BGTK = _rotary(proj("k", G), sh.sin, sh.cos)
        v_BGTK = proj("v", G)
        return attend(q_BHTK, k_BGTK, v_BGTK, sh, kv, c.d_model, dtype_of(c))


class MLP(hk.Module):
    """SwiGLU feed-forward: ``down(silu(gate(h)) * up(h))``, (N, D) -> (N, F) -> (N, D)."""

    def __init__(self, config: LlamaConfig, *, name: str = "mlp"):
        super().__init__(name=name)
        self.config = config

    def __call__(self, h_ND: jax.Array) -> jax.Array:
        c = self.config
        ff_NF = jax.nn.silu(Linear(c.d_ff, name="gate")(h_ND)) * Linear(c.d_ff, name="up")(h_ND)
        return Linear(c.d_model, name="down")(ff_NF)


class Block(hk.Module):
    """One Llama layer: ``x + attn(rms(x))``, then ``x + mlp(rms(x))`` (sequential
    residual). Returns (x (N, D), the layer's keys, values)."""

    def __init__(self, config: LlamaConfig, *, name: str):
        super().__init__(name=name)
        self.config = config

    def __call__(self, x_ND: jax.Array, sh: Shared, kv: tuple[jax.Array, jax.Array] | None):
        c = self.config
        h_ND = RMSNorm(c.rms_eps, name="ln_attn")(x_ND)
        attn_ND, k_BGSK, v_BGSK = Attention(c)(h_ND, sh, kv)
        x_ND = x_ND + attn_ND
        h_ND = RMSNorm(c.rms_eps, name="ln_mlp")(x_ND)
        return x_ND + MLP(c)(h_ND), k_BGSK, v_BGSK


def network(config: LlamaConfig, tokens_BT, positions_BT, key_mask_BS, cache: KVCache | None, start,
            last_only: bool = False, segments_BT=None, head: bool = True, prefix: KVCache | None = None):
    """``gptj.network``'s contract (same arguments, same results, top-level module
    names) for a Llama-style model."""
    c = config
    B, T = tokens_BT.shape
    dtype = dtype_of(c)
    wte = Embed(c.vocab, c.d_model)
    x_ND = wte(tokens_BT.reshape(B * T), dtype)
    angle_BTR = positions_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq(c))
    angle_B1TK = jnp.concatenate([angle_BTR, angle_BTR], axis=-1)[:, None]
    sin, cos = jnp.sin(angle_B1TK), jnp.cos(angle_B1TK)
    sh = attention_prologue(B, T, sin, cos, key_mask_BS, cache, start, segments_BT, c.sliding_window,
                            prefix_len=0 if prefix is None else prefix.k[0].shape[2])
    x_ND, kv = layer_loop(x_ND, sh, cache, c.n_layer, lambda i: Block(c, name=f"h_{i}"), last_only, prefix)
    x_ND = RMSNorm(c.rms_eps, name="ln_f")(x_ND)
    if not head:
        return x_ND.reshape(B, -1, c.d_model), kv
    logits_NV = wte.attend(x_ND, dtype) if c.tie_embeddings else Linear(c.vocab, name="lm_head")(x_ND)
    return logits_NV.astype(jnp.float32).reshape(B, -1, c.vocab), kv
