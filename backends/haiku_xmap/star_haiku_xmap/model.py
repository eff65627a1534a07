"""GPT-J in dm-haiku (the architecture of HF ``GPTJForCausalLM``), mesh-agnostic.

Parameter tree (haiku names; the HF importer maps onto exactly these)::

    wte/embeddings (V, D)
    h_{i}/ln/{scale, offset} (D,)
    h_{i}/attn/{q, k, v}/w (D, H*K)      h_{i}/attn/out/w (H*K, D)
    h_{i}/mlp/fc_in/{w (D, F), b (F,)}   h_{i}/mlp/fc_out/{w (F, D), b (D,)}
    ln_f/{scale, offset} (D,)            lm_head/{w (D, V), b (V,)}

Shape suffixes: B batch, T query time, S key/cache slots, D d_model, H heads,
K head dim, V vocabulary, F d_ff, L layers.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from .config import GPTJConfig

Params = Any  # haiku's nested dict {module_path: {name: array}}

_NEG = -1e30  # finite "minus infinity": a fully masked row softmaxes to uniform, not NaN


class KVCache(NamedTuple):
    """Post-rotary keys and values of every layer, preallocated to ``S`` slots."""

    k_LBSHK: jax.Array
    v_LBSHK: jax.Array


def dtype_of(config: GPTJConfig):
    return jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32


# ----------------------------------------------------------------------------- pieces


def _rotary_sin_cos(positions_BT: jax.Array, rotary_dim: int) -> tuple[jax.Array, jax.Array]:
    """GPT-J's sin/cos tables, each frequency repeated x2 for interleaved pairs."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, rotary_dim, 2, dtype=np.float32) / rotary_dim))
    angle_BTR = positions_BT.astype(jnp.float32)[..., None] * inv_freq  # R = rotary_dim // 2
    sin = jnp.repeat(jnp.sin(angle_BTR), 2, axis=-1)[:, :, None, :]  # (B, T, 1, rotary_dim)
    cos = jnp.repeat(jnp.cos(angle_BTR), 2, axis=-1)[:, :, None, :]
    return sin, cos


def _rotate_every_two(x: jax.Array) -> jax.Array:
    # pairs (0,1), (2,3), ... -> (-x1, x0), (-x3, x2), ...
    x_even, x_odd = x[..., ::2], x[..., 1::2]
    return jnp.stack((-x_odd, x_even), axis=-1).reshape(x.shape)


def _apply_rotary(x_BTHK: jax.Array, sin: jax.Array, cos: jax.Array, rotary_dim: int) -> jax.Array:
    """Rotate the first ``rotary_dim`` dims of each head; computed in fp32 like HF."""
    x = x_BTHK.astype(jnp.float32)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    rot = rot * cos + _rotate_every_two(rot) * sin
    return jnp.concatenate([rot, rest], axis=-1).astype(x_BTHK.dtype)


def _layer_norm(x_BTD: jax.Array, name: str, eps: float) -> jax.Array:
    # Normalise in fp32 (bf16 mean/variance are too coarse), hand back the activation dtype.
    y = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=eps, name=name)(
        x_BTD.astype(jnp.float32))
    return y.astype(x_BTD.dtype)


def _linear(x: jax.Array, size: int, name: str, with_bias: bool) -> jax.Array:
    return hk.Linear(size, with_bias=with_bias, name=name)(x)


def _attention(q_BTHK, k_BSHK, v_BSHK, allowed_BTS, d_head: int) -> jax.Array:
    """Softmax attention with fp32 scores and softmax (as HF does even in half precision)."""
    scores_BHTS = jnp.einsum("bthk,bshk->bhts", q_BTHK.astype(jnp.float32),
                             k_BSHK.astype(jnp.float32)) / np.sqrt(d_head).astype(np.float32)
    scores_BHTS = jnp.where(allowed_BTS[:, None, :, :], scores_BHTS, _NEG)
    probs_BHTS = jax.nn.softmax(scores_BHTS, axis=-1).astype(v_BSHK.dtype)
    return jnp.einsum("bhts,bshk->bthk", probs_BHTS, v_BSHK)


# ----------------------------------------------------------------------------- network


def _gptj(config: GPTJConfig, tokens_BT, positions_BT, key_mask_BS, cache: KVCache | None, start):
    """Logits (B, T, V) fp32 and the updated cache (None without one).

    Without a cache the keys are the T input tokens (S == T). With a cache the T
    new tokens are written into slots [start, start + T) and attend to every
    earlier slot; ``key_mask_BS`` marks which of the S cache slots hold real tokens
    (left padding is False).
    """
    c = config
    B, T = tokens_BT.shape
    HK = c.n_head * c.d_head
    dtype = dtype_of(c)

    x_BTD = hk.Embed(c.vocab, c.d_model, w_init=hk.initializers.TruncatedNormal(0.02),
                     name="wte")(tokens_BT).astype(dtype)
    sin, cos = _rotary_sin_cos(positions_BT, c.rotary_dim)

    if cache is None:
        q_slot_T = jnp.arange(T)
        S = T
    else:
        q_slot_T = start + jnp.arange(T)
        S = cache.k_LBSHK.shape[2]
    causal_TS = jnp.arange(S)[None, :] <= q_slot_T[:, None]
    allowed_BTS = causal_TS[None] & key_mask_BS[:, None, :].astype(bool)

    if cache is not None:
        k_all, v_all = cache
    for i in range(c.n_layer):
        with hk.name_scope(f"h_{i}"):
            h_BTD = _layer_norm(x_BTD, "ln", c.ln_eps)
            with hk.name_scope("attn"):
                q_BTHK = _linear(h_BTD, HK, "q", False).reshape(B, T, c.n_head, c.d_head)
                k_BTHK = _linear(h_BTD, HK, "k", False).reshape(B, T, c.n_head, c.d_head)
                v_BTHK = _linear(h_BTD, HK, "v", False).reshape(B, T, c.n_head, c.d_head)
                q_BTHK = _apply_rotary(q_BTHK, sin, cos, c.rotary_dim)
                k_BTHK = _apply_rotary(k_BTHK, sin, cos, c.rotary_dim)
                if cache is None:
                    k_BSHK, v_BSHK = k_BTHK, v_BTHK
                else:
                    # Write only the T new slots of layer i into the whole (L, B, S, H, K)
                    # buffer, so that inside the decode loop XLA updates it in place
                    # instead of rebuilding the cache every step.
                    at = (i, 0, start, 0, 0)
                    k_all = jax.lax.dynamic_update_slice(k_all, k_BTHK[None].astype(k_all.dtype), at)
                    v_all = jax.lax.dynamic_update_slice(v_all, v_BTHK[None].astype(v_all.dtype), at)
                    k_BSHK, v_BSHK = k_all[i], v_all[i]
                ctx_BTHK = _attention(q_BTHK, k_BSHK, v_BSHK, allowed_BTS, c.d_head)
                attn_BTD = _linear(ctx_BTHK.reshape(B, T, HK).astype(dtype), c.d_model, "out", False)
            with hk.name_scope("mlp"):
                ff_BTF = jax.nn.gelu(_linear(h_BTD, c.d_ff, "fc_in", True), approximate=True)
                mlp_BTD = _linear(ff_BTF, c.d_model, "fc_out", True)
            # Parallel residual: attention and MLP both read the same normalised input.
            x_BTD = x_BTD + attn_BTD + mlp_BTD

    x_BTD = _layer_norm(x_BTD, "ln_f", c.ln_eps)
    logits_BTV = _linear(x_BTD, c.vocab, "lm_head", True).astype(jnp.float32)
    new_cache = None if cache is None else KVCache(k_all, v_all)
    return logits_BTV, new_cache


@functools.lru_cache(maxsize=None)
def _transformed(config: GPTJConfig) -> hk.Transformed:
    return hk.without_apply_rng(hk.transform(functools.partial(_gptj, config)))


# ----------------------------------------------------------------------------- public API


def init_params(config: GPTJConfig, rng) -> Params:
    """Random parameters in ``config.dtype`` (``rng``: a jax key or an int seed)."""
    if isinstance(rng, int):
        rng = jax.random.key(rng)
    return _init(config, rng)


@functools.partial(jax.jit, static_argnames="config")
def _init(config: GPTJConfig, rng) -> Params:
    tokens_BT = jnp.zeros((1, 1), jnp.int32)
    params = _transformed(config).init(rng, tokens_BT, jnp.zeros((1, 1), jnp.int32),
                                       jnp.ones((1, 1), bool), None, 0)
    return jax.tree.map(lambda p: p.astype(dtype_of(config)), params)


def default_positions(mask_BT: jax.Array) -> jax.Array:
    """Positions that skip left padding: the first real token of each row is position 0."""
    return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=1) - 1, 0)


@functools.partial(jax.jit, static_argnames="config")
def forward(params: Params, tokens_BT: jax.Array, config: GPTJConfig,
            positions_BT: jax.Array | None = None, mask: jax.Array | None = None) -> jax.Array:
    """Causal LM logits (B, T, V) in fp32 (jit'd; ``config`` is static).

    ``mask`` (B, T) bool marks real tokens (False = padding, never attended to);
    ``positions_BT`` defaults to the count of real tokens before each one, so
    left-padded rows get the positions they would have alone.
    """
    tokens_BT = jnp.asarray(tokens_BT, jnp.int32)
    mask_BT = jnp.ones(tokens_BT.shape, bool) if mask is None else jnp.asarray(mask, bool)
    if positions_BT is None:
        positions_BT = default_positions(mask_BT)
    logits_BTV, _ = _transformed(config).apply(params, tokens_BT, positions_BT, mask_BT, None, 0)
    return logits_BTV


def init_cache(config: GPTJConfig, batch: int, max_len: int) -> KVCache:
    """An empty cache of ``max_len`` slots in the activation dtype."""
    shape = (config.n_layer, batch, max_len, config.n_head, config.d_head)
    return KVCache(jnp.zeros(shape, dtype_of(config)), jnp.zeros(shape, dtype_of(config)))


@functools.partial(jax.jit, static_argnames="config")
def forward_cached(params: Params, tokens_BT: jax.Array, config: GPTJConfig, cache: KVCache,
                   start, positions_BT: jax.Array, key_mask_BS: jax.Array) -> tuple[jax.Array, KVCache]:
    """Run T new tokens that occupy cache slots [start, start + T).

    Prefill is ``start=0`` with the whole (left-padded) prompt; a decode step is
    T == 1 at ``start = current length``. ``key_mask_BS`` (B, S) marks slots holding
    real tokens (it must already include the new ones). Returns fp32 logits (B, T, V)
    and the cache with the new keys/values written.
    """
    return _transformed(config).apply(params, jnp.asarray(tokens_BT, jnp.int32), positions_BT,
                                      key_mask_BS, cache, start)


@functools.partial(jax.jit, static_argnames=("config", "max_len"))
def prefill(params: Params, tokens_BT: jax.Array, mask_BT: jax.Array, config: GPTJConfig,
            max_len: int) -> tuple[jax.Array, KVCache, jax.Array]:
    """Fill a fresh ``max_len``-slot cache with left-padded prompts.

    Returns (logits of the last prompt slot (B, V), cache, key mask (B, max_len)).
    """
    B, T = tokens_BT.shape
    if T > max_len:
        raise ValueError(f"prompt length {T} exceeds cache length {max_len}")
    mask_BT = jnp.asarray(mask_BT, bool)
    key_mask_BS = jnp.zeros((B, max_len), bool).at[:, :T].set(mask_BT)
    logits_BTV, cache = forward_cached(params, tokens_BT, config, init_cache(config, B, max_len), 0,
                                       default_positions(mask_BT), key_mask_BS)
    return logits_BTV[:, -1], cache, key_mask_BS


@functools.partial(jax.jit, static_argnames="config")
def decode_step(params: Params, token_B: jax.Array, position_B: jax.Array, slot, cache: KVCache,
                key_mask_BS: jax.Array, config: GPTJConfig) -> tuple[jax.Array, KVCache, jax.Array]:
    """One token per row written to cache slot ``slot``. Returns (logits (B, V), cache, key mask)."""
    key_mask_BS = key_mask_BS.at[:, slot].set(True)
    logits_BTV, cache = forward_cached(params, token_B[:, None], config, cache, slot,
                                       position_B[:, None], key_mask_BS)
    return logits_BTV[:, 0], cache, key_mask_BS
