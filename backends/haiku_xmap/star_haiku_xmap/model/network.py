"""The model API of every architecture (typed with the base ``ModelConfig``): random
parameters, logits, prefill and decode steps, the KV cache, the parameter count.
A config runs the network its architecture registers (``architectures.py``:
GPT-J in ``gptj.py``, the Llama family in ``llama.py``), mesh-agnostic, on the
shared layers of ``layers.py``.

Shape suffixes: B batch, T query time, S key/cache slots, D d_model, H heads,
K head dim, V vocabulary, L layers.
"""

from __future__ import annotations

import functools
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from .architectures import architecture_of
from .config import ModelConfig, architecture
from .layers import LAYER_INPUT, KVCache, decode_attention, dtype_of

__all__ = ["LAYER_INPUT", "KVCache", "Params", "apply_forward", "decode_rows", "decode_step", "default_positions",
           "dtype_of", "forward", "init_cache", "init_params", "output_head", "param_count", "prefill",
           "prefill_after"]

Params = Any  # haiku's nested dict {module_path: {name: array}}


@functools.cache
def _transformed(config: ModelConfig) -> hk.Transformed:
    """``config``'s network (its architecture's, ``architectures.py``) as a pure
    (init, apply) pair; apply(params, tokens_BT, positions_BT, key_mask_BS, cache,
    start, last_only=False, segments_BT=None), as ``gptj.network``."""
    return hk.without_apply_rng(hk.transform(functools.partial(architecture_of(config).network, config)))


def init_params(config: ModelConfig, rng) -> Params:
    """Random parameters in ``config.dtype`` (``rng``: a jax key or an int seed)."""
    if isinstance(rng, int):
        rng = jax.random.key(rng)
    return _init(config, rng)


@functools.partial(jax.jit, static_argnames="config")
def _init(config: ModelConfig, rng) -> Params:
    # One token through the network: enough for every module to create its parameters.
    zeros_11 = jnp.zeros((1, 1), jnp.int32)
    params = _transformed(config).init(rng, zeros_11, zeros_11, jnp.ones((1, 1), bool), None, 0)
    return jax.tree.map(lambda p: p.astype(dtype_of(config)), params)


def default_positions(mask_BT: jax.Array) -> jax.Array:
    """Positions that skip left padding: the first real token of each row is position 0."""
    return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=1) - 1, 0)


def apply_forward(params: Params, tokens_BT: jax.Array, config: ModelConfig,
                  positions_BT: jax.Array | None = None, mask: jax.Array | None = None,
                  segments: jax.Array | None = None, head: bool = True) -> jax.Array:
    """Causal LM logits (B, T, V) in fp32: ``forward`` before ``jit``, for callers that
    trace it inside their own jit and context (``lora.forward``'s method interceptor).
    ``head=False``: the final hidden states (B, T, D) in the compute dtype instead (after
    the final norm; ``output_head`` gives the projection that makes them logits).

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
                                               segments_BT=segments, head=head)
    return logits_BTV


def output_head(params: Params, config: ModelConfig) -> tuple[jax.Array, str, jax.Array | None]:
    """(weight, layout, bias) of the projection from the final hidden states to the logits:
    ``lm_head``'s w (D, V), "DV", and its b (V,) (GPT-J) or None (Llama); a tied model's
    embedding table (V, D), "VD", None (``tie_embeddings``). Logits = h @ w (+ b) in "DV",
    h @ w.T in "VD"."""
    if getattr(config, "tie_embeddings", False):
        return params["wte"]["embeddings"], "VD", None
    head = params["lm_head"]
    return head["w"], "DV", head.get("b")


forward = jax.jit(apply_forward, static_argnames=("config", "head"))
"""``apply_forward`` jit'd (``config`` static): the model's logits."""


def init_cache(config: ModelConfig, batch: int, max_len: int) -> KVCache:
    """An empty cache of ``max_len`` slots in the activation dtype."""
    shape = (batch, config.kv_heads, max_len, config.d_head)
    zeros = tuple(jnp.zeros(shape, dtype_of(config)) for _ in range(config.n_layer))
    return KVCache(zeros, zeros)


@functools.partial(jax.jit, static_argnames=("config", "max_len"))
def prefill(params: Params, tokens_BT: jax.Array, mask_BT: jax.Array, config: ModelConfig,
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
                  config: ModelConfig) -> tuple[jax.Array, KVCache]:
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
                key_mask_BS: jax.Array, config: ModelConfig) -> tuple[jax.Array, KVCache, jax.Array]:
    """One token per row written to cache slot ``slot``. Returns (logits (B, V), cache, key mask)."""
    key_mask_BS = key_mask_BS.at[:, slot].set(True)
    logits_BTV, cache = _transformed(config).apply(params, token_B[:, None], position_B[:, None], key_mask_BS,
                                                   cache, slot)
    return logits_BTV[:, 0], cache, key_mask_BS


def decode_rows(params: Params, token_B: jax.Array, length_B: jax.Array, cache: KVCache,
                config: ModelConfig, prefix: KVCache | None = None, attention: str = "dense",
                live_B: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
    """One token per row for caches filled from slot 0 (no padding): row b holds
    ``length_B[b]`` tokens, so its new token sits at position and slot
    ``length_B[b]`` and attends slots [0, length_B[b]]. Each row has its own
    length (continuous batching). ``prefix``: the keys/values (1, H, P, K) per layer of
    P tokens every row continues (a shared few-shot prompt), kept out of the cache and
    read once for all rows: row b's cache then holds its own tokens, at positions
    P + slot. ``attention``: "dense" or "ragged" (``layers.decode_attention``). ``live_B``: the
    rows whose logits are used (None: all); the others read no key (under "ragged" an ended
    row's cache is then not read at all), and their logits are meaningless. Returns (logits
    (B, V), cache)."""
    S = cache.k[0].shape[2]
    P = 0 if prefix is None else prefix.k[0].shape[2]
    length_B = jnp.minimum(length_B, S - 1)  # a finished row may sit at the end; it is not read back
    key_mask_BS = jnp.arange(S)[None, :] <= length_B[:, None]
    if live_B is not None:
        key_mask_BS = key_mask_BS & live_B[:, None]
    extra = {} if prefix is None else {"prefix": prefix}
    with decode_attention(attention):
        logits_BTV, cache = _transformed(config).apply(params, token_B[:, None], P + length_B[:, None],
                                                       key_mask_BS, cache, length_B, **extra)
    return logits_BTV[:, 0], cache


def param_shapes(config: ModelConfig) -> Any:
    """The parameters' abstract shapes (``jax.ShapeDtypeStruct``s): traced with an abstract raw
    key, so nothing is allocated and jax's backends are not started (a run's preflight may
    ask before ``[model] cpu_devices`` is set)."""
    return jax.eval_shape(lambda key: init_params(config, key), jax.ShapeDtypeStruct((2,), jnp.uint32))


def param_count(config: ModelConfig, mtj_shards: int | None = None) -> int:
    """Number of parameters, counted from the model's abstract shapes (no memory used).

    ``mtj_shards=None``: unique parameters (what HF counts). ``mtj_shards=n``: the
    figure mesh-transformer-jax reports for an n-way model-parallel checkpoint, which
    stores per shard a copy of every replicated vector (each block's LayerNorm
    scale/offset and fc_out bias, the final LayerNorm) plus an embedding bias of
    size D that our model (like HF) folds into ``wte``. For GPT-J-6B with 8 shards:
    6,050,882,784 + 7 x (28 x 3 x 4096 + 2 x 4096) + 8 x 4096 = 6,053,381,344.
    """
    total = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(param_shapes(config)))
    if mtj_shards is None:
        return total
    if architecture(config) != "gptj":
        raise ValueError("mtj_shards: mesh-transformer-jax checkpoints hold GPT-J only")
    if mtj_shards < 1:
        raise ValueError(f"mtj_shards must be >= 1, got {mtj_shards}")
    D = config.d_model
    replicated = config.n_layer * (2 * D + D) + 2 * D  # per-block ln + fc_out bias, ln_f
    return total + (mtj_shards - 1) * replicated + mtj_shards * D  # + embedding bias per shard
