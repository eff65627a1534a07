"""The layers every architecture shares (GPT-J: ``gptj.py``; the Llama family:
``llama.py``): Haiku modules, the KV cache, the attention prologue (causal mask,
packed segments, sliding window, left padding), grouped-query attention (GPT-J is
the case of one query head per key/value head) with its fused path, and the layer
loop.

Each module creates its parameters (``hk.get_parameter``) where it uses them,
with the names, dtypes and initialisers of the hk.Embed / hk.LayerNorm /
hk.Linear model these replace, so a seed gives the same weights. Activations are
2-D, (N, D) with N = B*T tokens: every matmul and its gradients are then plain
2-D dots, which XLA:CPU runs without transposed copies of the cotangents (3-D
operands made it transpose whole gradient chains).

Shape suffixes: B batch, T query time, S key/cache slots, N tokens, D features,
H heads, K head dim, V vocabulary.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from .config import ModelConfig
from ..runtime.envvars import ATTENTION_ENV, ATTENTION_KINDS, attention_choice  # noqa: F401 -- ATTENTION_* re-exported

# Finite "minus infinity": a fully masked row (a left-padding query) softmaxes to
# uniform over the keys it is given, not NaN; its output is never used.
_NEG = -1e30
CAUSAL_BLOCK = 128  # query block of causal self-attention (64 and 128 measured alike at T=256)
LAYER_INPUT = "layer_input"  # checkpoint name of each block's input (the residual stream)
DECODE_ATTENTION = ("dense", "ragged")  # how a decode step's attention reads the cache (model.decode_attention)
_decode_attention: contextvars.ContextVar[str] = contextvars.ContextVar("decode_attention", default="dense")


@contextlib.contextmanager
def decode_attention(kind: str) -> Iterator[None]:
    """Within: a decode step's attention (one query a row) is "dense" (every slot read, masked) or
    "ragged" (``kernels.ragged``: each row's cache read to its last allowed key); read at trace time."""
    if kind not in DECODE_ATTENTION:
        raise ValueError(f"decode attention must be one of {DECODE_ATTENTION}, got {kind!r}")
    token = _decode_attention.set(kind)
    try:
        yield
    finally:
        _decode_attention.reset(token)


class KVCache(NamedTuple):
    """Post-rotary keys and values, one (B, G, S, K) buffer per layer, ``S`` slots
    (G: the key/value heads, fewer than the query heads under grouped-query attention).

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


def dtype_of(config: ModelConfig):
    """The parameter/activation dtype of ``config``."""
    return jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32


class Shared(NamedTuple):
    """What every layer's attention takes from one call of the network: ``B`` rows
    of ``T`` new tokens, their rotary tables (B, 1, T, rotary dims), which keys
    each query may read (``allowed_BTS``), the cache slot(s) the new keys go to
    (``start``: one slot, or (B,) slots when ``per_row``) and the causal query
    block (0: none). With a shared prefix (``attention_prologue``'s ``prefix_len``):
    which of its P keys each query may read (``prefix_allowed_BTP``) and, set per layer
    by ``layer_loop``, that layer's prefix keys and values (``prefix``: (1, G, P, K) each,
    one copy for every row)."""

    B: int
    T: int
    sin: jax.Array
    cos: jax.Array
    allowed_BTS: jax.Array
    start: Any
    per_row: bool
    block: int
    prefix_allowed_BTP: Any = None
    prefix: Any = None


class Linear(hk.Module):
    """``x @ w (+ b)``: w (n_in, n_out) truncated normal with stddev 1/sqrt(n_in)
    and b zeros, both in the input's dtype (as hk.Linear)."""

    def __init__(self, n_out: int, bias: bool = False, *, name: str):
        super().__init__(name=name)
        self.n_out, self.bias = n_out, bias

    def __call__(self, x_ND: jax.Array) -> jax.Array:
        n_in = x_ND.shape[-1]
        w = hk.get_parameter("w", [n_in, self.n_out], x_ND.dtype,
                             init=hk.initializers.TruncatedNormal(1.0 / np.sqrt(n_in)))
        if not self.bias:
            return x_ND @ w
        return x_ND @ w + hk.get_parameter("b", [self.n_out], x_ND.dtype, init=jnp.zeros)


class Embed(hk.Module):
    """Token embeddings ``embeddings`` (V, D), fp32 truncated normal (stddev 0.02)
    as hk.Embed's: looked up, or (``attend``) read as a tied output layer."""

    def __init__(self, vocab: int, d_model: int, *, name: str = "wte"):
        super().__init__(name=name)
        self.vocab, self.d_model = vocab, d_model

    def _table_VD(self) -> jax.Array:
        return jnp.asarray(hk.get_parameter("embeddings", [self.vocab, self.d_model], jnp.float32,
                                            init=hk.initializers.TruncatedNormal(0.02)))

    def __call__(self, tokens_N: jax.Array, dtype) -> jax.Array:
        """The (N, D) embeddings of ``tokens_N`` in ``dtype``."""
        table_VD = self._table_VD()
        if hk.running_init():  # creating the parameters needs no lookup, whose int32 index
            # arithmetic fails for a vocabulary of 2^31 or more (a forged checkpoint's shapes
            # are computed abstractly, to be refused by size)
            return jnp.zeros((tokens_N.shape[0], self.d_model), dtype)
        return table_VD[(tokens_N,)].astype(dtype)

    def attend(self, x_ND: jax.Array, dtype) -> jax.Array:
        """Logits (N, V) of ``x_ND`` against the table (in ``dtype``)."""
        return jnp.einsum("nd,vd->nv", x_ND, self._table_VD().astype(dtype))


def layer_norm(x: jax.Array, scale: jax.Array, offset: jax.Array, eps: float) -> jax.Array:
    """hk.LayerNorm's formula, normalised in fp32 (bf16 statistics are too coarse)."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.var(xf, axis=-1, keepdims=True)
    inv = scale.astype(jnp.float32) * jax.lax.rsqrt(var + jnp.float32(eps))
    return (inv * (xf - mean) + offset.astype(jnp.float32)).astype(x.dtype)


class LayerNorm(hk.Module):
    """``layer_norm`` over the last axis with fp32 ``scale`` (ones) and ``offset`` (zeros)."""

    def __init__(self, eps: float, *, name: str):
        super().__init__(name=name)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        D = x.shape[-1]
        scale = hk.get_parameter("scale", [D], jnp.float32, init=jnp.ones)
        offset = hk.get_parameter("offset", [D], jnp.float32, init=jnp.zeros)
        return layer_norm(x, scale, offset, self.eps)


class RMSNorm(hk.Module):
    """HF's RMSNorm over the last axis: normalised in fp32, cast back, then scaled
    by ``scale`` (fp32, ones)."""

    def __init__(self, eps: float, *, name: str):
        super().__init__(name=name)
        self.eps = eps

    def __call__(self, x_ND: jax.Array) -> jax.Array:
        scale = hk.get_parameter("scale", [x_ND.shape[-1]], jnp.float32, init=jnp.ones)
        xf = x_ND.astype(jnp.float32)
        normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + jnp.float32(self.eps))
        return scale.astype(x_ND.dtype) * normed.astype(x_ND.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def masked_softmax(scores, allowed, scale):
    """softmax(where(allowed, scores / scale, -1e30)) over the last axis, in fp32."""
    return jax.nn.softmax(jnp.where(allowed, scores / scale, _NEG), axis=-1)


def _masked_softmax_fwd(scores, allowed, scale):
    probs = masked_softmax(scores, allowed, scale)
    return probs, (probs, allowed)


def _masked_softmax_bwd(scale, res, d_probs):
    # The gradient autodiff derives, written out so that XLA keeps only the
    # probabilities for the backward pass instead of ~3 more score-sized tensors.
    probs, allowed = res
    d_logits = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True))
    return jnp.where(allowed, d_logits, 0.0) / scale, None


masked_softmax.defvjp(_masked_softmax_fwd, _masked_softmax_bwd)


def write_slots(buf_BHSK, new_BHTK, start, per_row: bool) -> jax.Array:
    """``new`` written into slots [start, start + T) of ``buf`` (per row: row b at start[b])."""
    new_BHTK = new_BHTK.astype(buf_BHSK.dtype)
    if not per_row:
        return jax.lax.dynamic_update_slice(buf_BHSK, new_BHTK, (0, 0, start, 0))
    return jax.vmap(lambda b, n, s: jax.lax.dynamic_update_slice(b, n, (0, s, 0)))(buf_BHSK, new_BHTK, start)


# ----------------------------------------------------------------------------- fused attention



def attention_kind() -> str:
    """How training and prefill attention run (read when a step is traced):
    ``STAR_HAIKU_XMAP_ATTENTION`` = ``auto`` (default: ``reference`` on a CPU, ``cudnn``
    elsewhere), ``reference`` (this module's fp32 scores and softmax, with causal query
    blocks: what the CPU figures and every golden test were made with), ``xla`` or
    ``cudnn`` (``jax.nn.dot_product_attention`` with that implementation; cuDNN's flash
    attention falls back to XLA's for a shape or dtype it does not take)."""
    kind = attention_choice()
    if kind == "auto":
        return "reference" if jax.default_backend() == "cpu" else "cudnn"
    return kind


def fused_attention(q_BHTK: jax.Array, k_BGSK: jax.Array, v_BGSK: jax.Array, allowed_BTS: jax.Array,
                    kind: str) -> jax.Array:
    """Attention of H query heads over G key/value heads (H a multiple of G) through
    ``jax.nn.dot_product_attention``, masked by ``allowed_BTS`` (causal, packed segments,
    sliding window and left padding all folded into it); (B, H, T, K) like the queries.
    A query allowed no key at all (a padding token) is given every key instead: its output
    is never read, and a fully masked row would make cuDNN's softmax 0/0."""
    q_BTHK, k_BSGK, v_BSGK = (x.transpose(0, 2, 1, 3) for x in (q_BHTK, k_BGSK, v_BGSK))
    mask_B1TS = (allowed_BTS | ~jnp.any(allowed_BTS, axis=-1, keepdims=True))[:, None]
    out = None
    if kind == "cudnn":
        try:
            out = jax.nn.dot_product_attention(q_BTHK, k_BSGK.astype(q_BTHK.dtype), v_BSGK.astype(q_BTHK.dtype),
                                               mask=mask_B1TS, implementation="cudnn")
        except (ValueError, NotImplementedError, TypeError, RuntimeError):
            out = None  # not a shape, dtype or platform cuDNN's flash attention takes
    if out is None:
        out = jax.nn.dot_product_attention(q_BTHK, k_BSGK.astype(q_BTHK.dtype), v_BSGK.astype(q_BTHK.dtype),
                                           mask=mask_B1TS, implementation="xla")
    return out.transpose(0, 2, 1, 3).astype(v_BGSK.dtype)


# ----------------------------------------------------------------------------- attention


def attention_prologue(B: int, T: int, sin: jax.Array, cos: jax.Array, key_mask_BS: jax.Array,
                       cache: KVCache | None, start, segments_BT: jax.Array | None = None,
                       sliding_window: int | None = None, prefix_len: int = 0) -> Shared:
    """What every layer's attention reads (``Shared``) for ``B`` rows of ``T`` new tokens.

    Without a cache the keys are the T new tokens (S == T). With one, the new tokens sit
    at slots [start, start + T) of its S slots (``start``: one slot, or (B,) slots, one a
    row). A query reads the keys at or before its slot that are real (``key_mask_BS``;
    left padding is False), of its own packed segment (``segments_BT``) and, under a
    ``sliding_window``, less than that many real tokens behind it: a key's position is
    the count of real keys before it in its row, which is what positions are everywhere
    in this backend (left padding, a shared prefix, decode slots), so the window is right
    wherever a row's slots have gaps. Long self-attention (training, long prompts) runs
    in causal query blocks.

    ``prefix_len`` P > 0: every row continues the same P tokens, whose keys are not in the
    cache but shared (``prefix_attention``): positions [0, P), before every slot. A query
    may read all of them (they precede it), within the ``sliding_window`` counted from its
    own position P + (its real keys so far)."""
    per_row = cache is not None and jnp.ndim(start) == 1
    if cache is None:
        q_slot_T, S = jnp.arange(T), T
    else:
        q_slot_T, S = jnp.asarray(start)[..., None] + jnp.arange(T), cache.k[0].shape[2]
    causal_TS = jnp.arange(S) <= q_slot_T[..., None]  # (T, S), or (B, T, S) with a slot per row
    key_mask_BS = key_mask_BS.astype(bool)
    allowed_BTS = (causal_TS if per_row else causal_TS[None]) & key_mask_BS[:, None, :]
    if segments_BT is not None:
        allowed_BTS = allowed_BTS & (segments_BT[:, :, None] == segments_BT[:, None, :])
    prefix_BTP = jnp.ones((B, T, prefix_len), bool) if prefix_len else None
    if sliding_window is not None:
        kpos_BS = jnp.cumsum(key_mask_BS.astype(jnp.int32), axis=1)  # real keys up to each slot
        q_slot_BT = jnp.broadcast_to(q_slot_T, (B, T))
        qpos_BT = jnp.take_along_axis(kpos_BS, q_slot_BT, axis=1)
        allowed_BTS = allowed_BTS & (qpos_BT[:, :, None] - kpos_BS[:, None, :] < sliding_window)
        if prefix_len:  # prefix key p is the (p + 1)-th real key; the query the (P + qpos)-th
            prefix_BTP = (prefix_len + qpos_BT)[:, :, None] - (jnp.arange(prefix_len) + 1) < sliding_window
    block = CAUSAL_BLOCK if cache is None and T >= 2 * CAUSAL_BLOCK else 0
    return Shared(B, T, sin, cos, allowed_BTS, start, per_row, block, prefix_BTP)


def gqa_attention(q_xTK, k_BGSK, v_BGSK, allowed_BTS, d_head: int, block: int = 0) -> jax.Array:
    """Softmax attention with fp32 scores and softmax (as HF does even in half precision)
    of the queries over G key/value heads: ``q_BGRTK``, R query heads per key/value head
    (grouped-query attention), or ``q_BHTK`` with H == G (GPT-J: one query head per
    key/value head, computed head by head, the order its golden figures were made in).

    ``block`` > 0 (causal self-attention, S == T): the queries in [a, a + block)
    attend keys [0, a + block) only. The keys skipped are all masked, so this is
    the same attention with up to half the score work and memory."""
    T = q_xTK.shape[-2]
    if 0 < block < T:
        ctx = [gqa_attention(q_xTK[..., a:a + block, :], k_BGSK[:, :, :a + block], v_BGSK[:, :, :a + block],
                             allowed_BTS[:, a:a + block, :a + block], d_head) for a in range(0, T, block)]
        return jnp.concatenate(ctx, axis=-2)
    grouped = q_xTK.ndim == 5
    scale = np.sqrt(d_head).astype(np.float32)
    spec = "bgrtk,bgsk->bgrts" if grouped else "bhtk,bhsk->bhts"
    scores = jnp.einsum(spec, q_xTK.astype(jnp.float32), k_BGSK.astype(jnp.float32))
    allowed = allowed_BTS[:, None, None] if grouped else allowed_BTS[:, None, :, :]
    probs = masked_softmax(scores, allowed, scale).astype(v_BGSK.dtype)
    return jnp.einsum("bgrts,bgsk->bgrtk" if grouped else "bhts,bhsk->bhtk", probs, v_BGSK)


def prefix_attention(q_xTK, pk_1GPK, pv_1GPK, k_BGSK, v_BGSK, allowed_BTP, allowed_BTS, d_head: int) -> jax.Array:
    """``gqa_attention`` over a shared prefix's P keys, then each row's own S keys: one softmax
    over [prefix | own] (what ``gqa_attention`` computes when the row's cache holds the prefix
    in front of its own slots), with the prefix's keys and values read once for all the rows
    ((1, G, P, K): every row continues the same few-shot prompt) instead of once a row."""
    grouped = q_xTK.ndim == 5
    scale = np.sqrt(d_head).astype(np.float32)
    qf = q_xTK.astype(jnp.float32)
    pre, own = ("bgrtk,gpk->bgrtp", "bgrtk,bgsk->bgrts") if grouped else ("bhtk,hpk->bhtp", "bhtk,bhsk->bhts")
    scores = jnp.concatenate([jnp.einsum(pre, qf, pk_1GPK[0].astype(jnp.float32)),
                              jnp.einsum(own, qf, k_BGSK.astype(jnp.float32))], axis=-1)
    allowed = jnp.concatenate([allowed_BTP, allowed_BTS], axis=-1)
    allowed = allowed[:, None, None] if grouped else allowed[:, None, :, :]
    probs = masked_softmax(scores, allowed, scale).astype(v_BGSK.dtype)
    P = pk_1GPK.shape[2]
    out_pre = jnp.einsum("bgrtp,gpk->bgrtk" if grouped else "bhtp,hpk->bhtk", probs[..., :P], pv_1GPK[0])
    return out_pre + jnp.einsum("bgrts,bgsk->bgrtk" if grouped else "bhts,bhsk->bhtk", probs[..., P:], v_BGSK)


def attend(q_BHTK: jax.Array, k_BGTK: jax.Array, v_BGTK: jax.Array, sh: Shared,
           kv: tuple[jax.Array, jax.Array] | None, d_model: int, dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The attention of a layer after its q/k/v projections (H query heads, G key/value
    heads, H a multiple of G): the new keys/values written into the layer's cache ``kv``
    (or, without one, the keys are the T new ones), attention over them and the output
    projection ``out`` (a module of the caller's). Returns (output (N, D), keys, values
    (B, G, S, K))."""
    B, H, T, K = q_BHTK.shape
    G = k_BGTK.shape[1]
    if kv is None:
        k_BGSK, v_BGSK = k_BGTK, v_BGTK
    else:
        # Only the T new slots are written; inside a decode loop XLA updates the buffer in place.
        k_BGSK = write_slots(kv[0], k_BGTK, sh.start, sh.per_row)
        v_BGSK = write_slots(kv[1], v_BGTK, sh.start, sh.per_row)
    # decoding (one query a row) and a shared prefix stay on the reference
    kind = attention_kind() if T > 1 and sh.prefix is None else "reference"
    if T == 1 and kv is not None and _decode_attention.get() == "ragged":
        from ..kernels.ragged import ragged_decode_attention

        prefix_allowed = None if sh.prefix is None else sh.prefix_allowed_BTP[:, 0]
        ctx_BHTK = ragged_decode_attention(q_BHTK[:, :, 0], k_BGSK, v_BGSK, sh.allowed_BTS[:, 0], sh.prefix,
                                           prefix_allowed)[:, :, None].astype(v_BGSK.dtype)
    elif kind == "reference":
        q_xTK = q_BHTK if G == H else q_BHTK.reshape(B, G, H // G, T, K)
        if sh.prefix is None:
            ctx_BHTK = gqa_attention(q_xTK, k_BGSK, v_BGSK, sh.allowed_BTS, K, sh.block).reshape(B, H, T, K)
        else:
            pk_1GPK, pv_1GPK = sh.prefix
            ctx_BHTK = prefix_attention(q_xTK, pk_1GPK, pv_1GPK, k_BGSK, v_BGSK, sh.prefix_allowed_BTP,
                                        sh.allowed_BTS, K).reshape(B, H, T, K)
    else:
        ctx_BHTK = fused_attention(q_BHTK, k_BGSK, v_BGSK, sh.allowed_BTS, kind)
    ctx_ND = ctx_BHTK.transpose(0, 2, 1, 3).reshape(B * T, H * K).astype(dtype)
    return Linear(d_model, name="out")(ctx_ND), k_BGSK, v_BGSK


# ----------------------------------------------------------------------------- layer loop

BlockFn = Callable[[jax.Array, Shared, "tuple[jax.Array, jax.Array] | None"], tuple[jax.Array, jax.Array, jax.Array]]


def layer_loop(x_ND: jax.Array, sh: Shared, cache: KVCache | None, n_layer: int,
               make_block: Callable[[int], BlockFn], last_only: bool = False,
               prefix: KVCache | None = None) -> tuple[jax.Array, KVCache]:
    """The residual stream (N, D) through ``n_layer`` blocks (``make_block(i)``: layer i's
    module, named ``h_{i}``), each reading its layer of ``cache`` (and of a shared
    ``prefix``'s keys and values, ``prefix_attention``); each block's input is named
    ``LAYER_INPUT`` (what per-layer rematerialisation keeps, ``train.py``).
    Returns (the stream, (B, D) of each row's last slot with ``last_only``; the new
    per-layer keys/values)."""
    new_k, new_v = [], []
    for i in range(n_layer):
        x_ND = checkpoint_name(x_ND, LAYER_INPUT)
        sh_i = sh if prefix is None else sh._replace(prefix=(prefix.k[i], prefix.v[i]))
        x_ND, k_BGSK, v_BGSK = make_block(i)(x_ND, sh_i, None if cache is None else (cache.k[i], cache.v[i]))
        new_k.append(k_BGSK)
        new_v.append(v_BGSK)
    if last_only:
        x_ND = x_ND.reshape(sh.B, sh.T, x_ND.shape[-1])[:, -1]
    return x_ND, KVCache(tuple(new_k), tuple(new_v))
