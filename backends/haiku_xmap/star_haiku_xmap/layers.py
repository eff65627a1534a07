"""Haiku modules and attention pieces shared by the GPT-J (``model.py``) and the
Llama-style (``llama.py``) decoders.

Each module creates its parameters (``hk.get_parameter``) where it uses them,
with the names, dtypes and initialisers of the hk.Embed / hk.LayerNorm /
hk.Linear model these replace, so a seed gives the same weights. Activations are
2-D, (N, D) with N = B*T tokens (see ``model._gptj``).

Shape suffixes: B batch, T query time, S key/cache slots, N tokens, D features,
H heads, K head dim, V vocabulary.
"""

from __future__ import annotations

import functools
import os
from typing import Any, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

# Finite "minus infinity": a fully masked row (a left-padding query) softmaxes to
# uniform over the keys it is given, not NaN; its output is never used.
_NEG = -1e30
CAUSAL_BLOCK = 128  # query block of causal self-attention (64 and 128 measured alike at T=256)


class Shared(NamedTuple):
    """What every layer's attention takes from one call of the network: ``B`` rows
    of ``T`` new tokens, their rotary tables (B, 1, T, rotary dims), which keys
    each query may read (``allowed_BTS``), the cache slot(s) the new keys go to
    (``start``: one slot, or (B,) slots when ``per_row``) and the causal query
    block (0: none)."""

    B: int
    T: int
    sin: jax.Array
    cos: jax.Array
    allowed_BTS: jax.Array
    start: Any
    per_row: bool
    block: int


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

ATTENTION_ENV = "STAR_HAIKU_XMAP_ATTENTION"
ATTENTION_KINDS = ("auto", "reference", "xla", "cudnn")


def attention_kind() -> str:
    """How training and prefill attention run (read when a step is traced):
    ``STAR_HAIKU_XMAP_ATTENTION`` = ``auto`` (default: ``reference`` on a CPU, ``cudnn``
    elsewhere), ``reference`` (this module's fp32 scores and softmax, with causal query
    blocks: what the CPU figures and every golden test were made with), ``xla`` or
    ``cudnn`` (``jax.nn.dot_product_attention`` with that implementation; cuDNN's flash
    attention falls back to XLA's for a shape or dtype it does not take)."""
    kind = os.environ.get(ATTENTION_ENV, "auto").strip() or "auto"
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"{ATTENTION_ENV}: must be one of {list(ATTENTION_KINDS)}, got {kind!r}")
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
