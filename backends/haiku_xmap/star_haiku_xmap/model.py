"""GPT-J in dm-haiku (the architecture of HF ``GPTJForCausalLM``), mesh-agnostic,
and the public model API of every architecture: a ``LlamaConfig`` runs the
Llama-style decoder of ``llama.py`` through the same functions (``_transformed``).

Parameter tree (haiku names; the HF importer maps onto exactly these)::

    wte/embeddings (V, D)
    h_{i}/ln/{scale, offset} (D,)
    h_{i}/attn/{q, k, v}/w (D, H*K)      h_{i}/attn/out/w (H*K, D)
    h_{i}/mlp/fc_in/{w (D, F), b (F,)}   h_{i}/mlp/fc_out/{w (F, D), b (D,)}
    ln_f/{scale, offset} (D,)            lm_head/{w (D, V), b (V,)}

The network is Haiku modules (``Block`` = ``LayerNorm`` + ``Attention`` + ``MLP``,
with the ``layers.py`` pieces), each creating its parameters where it uses them,
run through ``hk.transform``; it is laid out for XLA:CPU: a 2-D (B*T, D)
residual stream, attention in head-major (B, H, T, K) order, per-layer KV caches.

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
from jax.ad_checkpoint import checkpoint_name

from .config import GPTJConfig, architecture
from .layers import (CAUSAL_BLOCK, Embed, LayerNorm, Linear, Shared, attention_kind, fused_attention,
                     masked_softmax, write_slots)

Params = Any  # haiku's nested dict {module_path: {name: array}}

LAYER_INPUT = "layer_input"  # checkpoint name of each block's input (the residual stream)


class KVCache(NamedTuple):
    """Post-rotary keys and values, one (B, H, S, K) buffer per layer, ``S`` slots
    (H: the key/value heads, fewer than the query heads under grouped-query attention).

    Per-layer buffers in head-major order let a decode step write its slot in
    place and feed attention without slicing or transposing a stacked cache."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def k_LBSHK(self) -> jax.Array:  # stacked view, for inspection only (copies)
        return jnp.stack([x.transpose(0, 2, 1, 3) for x in self.k])

    @property
    def v_LBSHK(self) -> jax.Array:
        return jnp.stack([x.transpose(0, 2, 1, 3) for x in self.v])


def dtype_of(config: GPTJConfig):
    return jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32


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


def _attention(q_BHTK, k_BHSK, v_BHSK, allowed_BTS, d_head: int, block: int = 0) -> jax.Array:
    """Softmax attention with fp32 scores and softmax (as HF does even in half precision).

    ``block`` > 0 (causal self-attention, S == T): the queries in [a, a + block)
    attend keys [0, a + block) only. The keys skipped are all masked, so this is
    the same attention with up to half the score work and memory."""
    T = q_BHTK.shape[2]
    if 0 < block < T:
        ctx = [_attention(q_BHTK[:, :, a:a + block], k_BHSK[:, :, :a + block], v_BHSK[:, :, :a + block],
                          allowed_BTS[:, a:a + block, :a + block], d_head) for a in range(0, T, block)]
        return jnp.concatenate(ctx, axis=2)
    scale = np.sqrt(d_head).astype(np.float32)
    scores_BHTS = jnp.einsum("bhtk,bhsk->bhts", q_BHTK.astype(jnp.float32), k_BHSK.astype(jnp.float32))
    probs_BHTS = masked_softmax(scores_BHTS, allowed_BTS[:, None, :, :], scale).astype(v_BHSK.dtype)
    return jnp.einsum("bhts,bhsk->bhtk", probs_BHTS, v_BHSK)


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
        if kv is None:
            k_BHSK, v_BHSK = k_BHTK, v_BHTK
        else:
            # Only the T new slots are written; inside a decode loop XLA updates the buffer in place.
            k_BHSK = write_slots(kv[0], k_BHTK, sh.start, sh.per_row)
            v_BHSK = write_slots(kv[1], v_BHTK, sh.start, sh.per_row)
        kind = attention_kind() if T > 1 else "reference"  # decoding (one query a row) stays on the reference
        ctx_BHTK = (_attention(q_BHTK, k_BHSK, v_BHSK, sh.allowed_BTS, K, sh.block) if kind == "reference"
                    else fused_attention(q_BHTK, k_BHSK, v_BHSK, sh.allowed_BTS, kind))
        ctx_ND = ctx_BHTK.transpose(0, 2, 1, 3).reshape(B * T, H * K).astype(dtype_of(c))
        return Linear(c.d_model, name="out")(ctx_ND), k_BHSK, v_BHSK


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


def _gptj(config: GPTJConfig, tokens_BT, positions_BT, key_mask_BS, cache: KVCache | None, start,
          last_only: bool = False, segments_BT=None):
    """Logits (B, T, V) fp32 (``last_only``: (B, 1, V) of the last slot) and the
    new per-layer keys/values (run inside ``hk.transform``: ``_transformed``).

    Without a cache the keys are the T input tokens (S == T) and the second
    result is the (k, v) tuples of those T slots. With a cache the T new tokens
    are written into slots [start, start + T) and attend to every slot;
    ``key_mask_BS`` marks which of the S slots hold real tokens (left padding is
    False). ``start`` is one slot for every row, or a (B,) array: row b then
    writes (and its queries sit at) slots [start[b], start[b] + T).
    ``segments_BT`` (no cache): packed rows, a token attends only to the
    tokens of its own segment (block-diagonal causal attention).

    The modules are made here, at the top level, so that their parameters are
    ``wte``, ``h_{i}/...``, ``ln_f``, ``lm_head`` with no enclosing module name.
    """
    c = config
    B, T = tokens_BT.shape
    dtype = dtype_of(c)

    # The residual stream is kept 2-D, (B*T, D): every matmul and its gradients are
    # then plain 2-D dots, which XLA:CPU runs without transposed copies of the
    # cotangents (3-D operands made it transpose whole gradient chains).
    N = B * T
    x_ND = Embed(c.vocab, c.d_model)(tokens_BT.reshape(N), dtype)
    sin, cos = _rotary_sin_cos(positions_BT, c.rotary_dim)
    sin, cos = sin.transpose(0, 2, 1, 3), cos.transpose(0, 2, 1, 3)  # (B, 1, T, R): broadcast over heads

    per_row = cache is not None and jnp.ndim(start) == 1
    if cache is None:
        q_slot_T, S = jnp.arange(T), T
    else:
        q_slot_T, S = jnp.asarray(start)[..., None] + jnp.arange(T), cache.k[0].shape[2]
    causal_TS = jnp.arange(S) <= q_slot_T[..., None]  # (T, S), or (B, T, S) with a slot per row
    allowed_BTS = (causal_TS if per_row else causal_TS[None]) & key_mask_BS[:, None, :].astype(bool)
    if segments_BT is not None:
        allowed_BTS = allowed_BTS & (segments_BT[:, :, None] == segments_BT[:, None, :])

    # Long self-attention (training, long prompts) runs in causal query blocks.
    block = CAUSAL_BLOCK if cache is None and T >= 2 * CAUSAL_BLOCK else 0
    sh = Shared(B, T, sin, cos, allowed_BTS, start, per_row, block)
    new_k, new_v = [], []
    for i in range(c.n_layer):
        x_ND = checkpoint_name(x_ND, LAYER_INPUT)  # what per-layer rematerialisation keeps (train.py)
        x_ND, k_BHSK, v_BHSK = Block(c, name=f"h_{i}")(x_ND, sh, None if cache is None else (cache.k[i], cache.v[i]))
        new_k.append(k_BHSK)
        new_v.append(v_BHSK)

    if last_only:
        x_ND = x_ND.reshape(B, T, c.d_model)[:, -1]
    x_ND = LayerNorm(c.ln_eps, name="ln_f")(x_ND)
    logits_NV = Linear(c.vocab, bias=True, name="lm_head")(x_ND).astype(jnp.float32)
    return logits_NV.reshape(B, -1, c.vocab), KVCache(tuple(new_k), tuple(new_v))


@functools.cache
def _transformed(config: GPTJConfig) -> hk.Transformed:
    """``config``'s network as a pure (init, apply) pair (the one place that dispatches
    on the architecture); apply(params, tokens_BT, positions_BT, key_mask_BS, cache,
    start, last_only=False, segments_BT=None), as ``_gptj``."""
    if architecture(config) == "llama":
        from . import llama

        return hk.without_apply_rng(hk.transform(functools.partial(llama.network, config)))
    return hk.without_apply_rng(hk.transform(functools.partial(_gptj, config)))


# ----------------------------------------------------------------------------- public API


def init_params(config: GPTJConfig, rng) -> Params:
    """Random parameters in ``config.dtype`` (``rng``: a jax key or an int seed)."""
    if isinstance(rng, int):
        rng = jax.random.key(rng)
    return _init(config, rng)


@functools.partial(jax.jit, static_argnames="config")
def _init(config: GPTJConfig, rng) -> Params:
    # One token through the network: enough for every module to create its parameters.
    zeros_11 = jnp.zeros((1, 1), jnp.int32)
    params = _transformed(config).init(rng, zeros_11, zeros_11, jnp.ones((1, 1), bool), None, 0)
    return jax.tree.map(lambda p: p.astype(dtype_of(config)), params)


def default_positions(mask_BT: jax.Array) -> jax.Array:
    """Positions that skip left padding: the first real token of each row is position 0."""
    return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=1) - 1, 0)


def apply_forward(params: Params, tokens_BT: jax.Array, config: GPTJConfig,
                  positions_BT: jax.Array | None = None, mask: jax.Array | None = None,
                  segments: jax.Array | None = None) -> jax.Array:
    """Causal LM logits (B, T, V) in fp32: ``forward`` before ``jit``, for callers that
    trace it inside their own jit and context (``lora.forward``'s method interceptor).

    ``mask`` (B, T) bool marks real tokens (False = padding, never attended to);
    ``positions_BT`` defaults to the count of real tokens before each one, so
    left-padded rows get the positions they would have alone. ``segments`` (B, T)
    int: several sequences packed in a row (1, 2, ... each; 0 = padding): a token
    attends only to earlier tokens of its own segment; ``mask`` defaults to
    ``segments > 0`` (pass ``positions_BT`` restarting at each segment).
    """
    tokens_BT = jnp.asarray(tokens_BT, jnp.int32)
    if segments is not None:
        segments = jnp.asarray(segments, jnp.int32)
        mask = segments > 0 if mask is None else mask
    mask_BT = jnp.ones(tokens_BT.shape, bool) if mask is None else jnp.asarray(mask, bool)
    if positions_BT is None:
        positions_BT = default_positions(mask_BT)
    logits_BTV, _ = _transformed(config).apply(params, tokens_BT, positions_BT, mask_BT, None, 0,
                                               segments_BT=segments)
    return logits_BTV


forward = jax.jit(apply_forward, static_argnames="config")
"""``apply_forward`` jit'd (``config`` static): the model's logits."""


def init_cache(config: GPTJConfig, batch: int, max_len: int) -> KVCache:
    """An empty cache of ``max_len`` slots in the activation dtype."""
    shape = (batch, getattr(config, "n_kv_head", config.n_head), max_len, config.d_head)
    zeros = tuple(jnp.zeros(shape, dtype_of(config)) for _ in range(config.n_layer))
    return KVCache(zeros, zeros)


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
    # The prompt attends to itself only (the empty slots after it are masked out
    # anyway), then its keys/values are padded to the cache length.
    logits_B1V, kv = _transformed(config).apply(params, jnp.asarray(tokens_BT, jnp.int32),
                                                default_positions(mask_BT), mask_BT, None, 0, last_only=True)
    pad = ((0, 0), (0, 0), (0, max_len - T), (0, 0))
    cache = KVCache(*(tuple(jnp.pad(x, pad) for x in xs) for xs in kv))
    return logits_B1V[:, 0], cache, key_mask_BS


@functools.partial(jax.jit, static_argnames="config")
def prefill_after(params: Params, prefix: KVCache, tokens_BT: jax.Array, mask_BT: jax.Array,
                  config: GPTJConfig) -> tuple[jax.Array, KVCache]:
    """Prompts that continue a shared prefix whose keys/values are already computed.

    ``prefix``: the prefix's cache, (1, H, P, K) per layer, filled from slot 0 with
    no padding (``prefill`` of the P prefix tokens). ``tokens_BT``/``mask_BT``: each
    row's own tokens after the prefix, left-padded. Row b attends the prefix and its
    own real tokens; its positions continue from P, as if the whole prompt had been
    prefilled. Returns (logits of the last slot (B, V), cache (B, H, P + T, K): the
    prefix in slots [0, P), the row's tokens left-padded in [P, P + T)).
    """
    B, T = tokens_BT.shape
    P = prefix.k[0].shape[2]
    mask_BT = jnp.asarray(mask_BT, bool)
    grow = lambda x: jnp.concatenate([jnp.broadcast_to(x, (B,) + x.shape[1:]),
                                      jnp.zeros((B, x.shape[1], T, x.shape[3]), x.dtype)], axis=2)
    cache = KVCache(tuple(map(grow, prefix.k)), tuple(map(grow, prefix.v)))
    key_mask_BS = jnp.concatenate([jnp.ones((B, P), bool), mask_BT], axis=1)
    logits_B1V, cache = _transformed(config).apply(params, jnp.asarray(tokens_BT, jnp.int32),
                                                   P + default_positions(mask_BT), key_mask_BS, cache, P,
                                                   last_only=True)
    return logits_B1V[:, 0], cache


@functools.partial(jax.jit, static_argnames="config")
def decode_step(params: Params, token_B: jax.Array, position_B: jax.Array, slot, cache: KVCache,
                key_mask_BS: jax.Array, config: GPTJConfig) -> tuple[jax.Array, KVCache, jax.Array]:
    """One token per row written to cache slot ``slot``. Returns (logits (B, V), cache, key mask)."""
    key_mask_BS = key_mask_BS.at[:, slot].set(True)
    logits_BTV, cache = _transformed(config).apply(params, token_B[:, None], position_B[:, None], key_mask_BS,
                                                   cache, slot)
    return logits_BTV[:, 0], cache, key_mask_BS


def decode_rows(params: Params, token_B: jax.Array, length_B: jax.Array, cache: KVCache,
                config: GPTJConfig) -> tuple[jax.Array, KVCache]:
    """One token per row for caches filled from slot 0 (no padding): row b holds
    ``length_B[b]`` tokens, so its new token sits at position and slot
    ``length_B[b]`` and attends slots [0, length_B[b]]. Each row has its own
    length (continuous batching). Returns (logits (B, V), cache)."""
    S = cache.k[0].shape[2]
    length_B = jnp.minimum(length_B, S - 1)  # a finished row may sit at the end; it is not read back
    key_mask_BS = jnp.arange(S)[None, :] <= length_B[:, None]
    logits_BTV, cache = _transformed(config).apply(params, token_B[:, None], length_B[:, None], key_mask_BS,
                                                   cache, length_B)
    return logits_BTV[:, 0], cache
