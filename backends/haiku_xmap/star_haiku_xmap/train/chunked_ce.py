"""log p(target) of the output projection + softmax, computed over vocabulary
chunks, never holding the (N, V) logits: the large-vocabulary training step.

``token_logp``'s plain path builds fp32 logits (N, V), their maximum, exp, a
one-hot of the same size and the gradients of all of these: at GPT-J's vocabulary
of 50,400 a dozen passes over a (N, V) array that lives in main memory, and
weight-gradient contractions that XLA:CPU runs well below its forward speed
(docs/performance.md §3.3). Here a ``lax.scan`` over chunks of C vocabulary rows
keeps, per token, the running maximum, the running sum of exponentials and the
target's logit; the backward pass recomputes each chunk's logits (one more
matmul, cheaper than writing and reading the (N, V) array) and gives

    dlogits = g * (onehot - softmax)     (N, C), one chunk at a time
    dh     += dlogits @ W_c              (N, D)
    dW_c    = dlogits^T @ h              (C, D)
    db_c    = sum_n dlogits              (C,)

The weight is handled in (V, D) layout, the one whose gradient contraction
XLA:CPU runs fastest (measured: ``benchmarks/vocab_step_profile.py``): a tied
embedding table already is; an ``lm_head`` (D, V) is transposed once on the way in
and its gradient once on the way out. A vocabulary that is not a multiple of the
chunk is padded with zero rows whose bias is -inf, so padding columns get
probability exactly 0 and no gradient.

Precision follows the plain path: each chunk's logits are computed in the
weights' dtype (``h @ W + b``, then cast to fp32), the softmax in fp32, and the
chunk's gradient is cast back to the weights' dtype before the two gradient
matmuls (as autodiff of ``.astype(float32)`` does). ``dot_dtype = "bfloat16"``
runs the three matmuls on bf16 operands with fp32 accumulation (CPUs with
native bf16 dot products: ``avx512_bf16``/``amx_bf16``), an option, not the default.

Shape suffixes: N tokens, D d_model, V vocabulary, C chunk, K number of chunks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

DEFAULT_CHUNK = 4096  # vocabulary rows per chunk when asked for (measured: docs/performance.md §3.3)


def chunk_for(loss_chunk: int | None) -> int:
    """The chunk ``token_logp`` uses (0: the plain path, full logits): ``loss_chunk`` as given
    (0 or a size); None (unset) is the plain path. Chunking is opt-in: it is faster on a CPU at
    GPT-J's vocabulary (docs/performance.md §3.3), but the GPT-J-6B train step under an mp = 8
    mesh no longer fit a TPU v3 core's 16 GiB with it (``test_plan.py``'s slow check), so it is
    not chosen for anyone by vocabulary size."""
    if loss_chunk is None:
        return 0
    if loss_chunk < 0:
        raise ValueError(f"loss_chunk must be >= 0, got {loss_chunk}")
    return loss_chunk


def _chunks(w_VD: jax.Array, b_V: jax.Array | None, chunk: int) -> tuple[jax.Array, jax.Array]:
    """(W as (K, C, D) chunks, zero rows past V; the additive bias (K, C) fp32: b, or 0, and
    -inf on the padding rows)."""
    V, D = w_VD.shape
    K = -(-V // chunk)
    pad = K * chunk - V
    w_KCD = jnp.pad(w_VD, ((0, pad), (0, 0))).reshape(K, chunk, D)
    bias_V = jnp.zeros((V,), w_VD.dtype) if b_V is None else b_V.astype(w_VD.dtype)
    bias_KC = jnp.concatenate([bias_V, jnp.full((pad,), -jnp.inf, w_VD.dtype)]).reshape(K, chunk)
    return w_KCD, bias_KC


def _logits(h_ND: jax.Array, w_CD: jax.Array, bias_C: jax.Array, dot_dtype) -> jax.Array:
    """One chunk's fp32 logits (N, C): ``h @ W_c^T + b_c`` in the weights' dtype (as the plain
    path's ``Linear``), or on ``dot_dtype`` operands accumulated in fp32."""
    if dot_dtype is None:
        return (jnp.einsum("nd,cd->nc", h_ND, w_CD) + bias_C).astype(jnp.float32)
    l_NC = jnp.einsum("nd,cd->nc", h_ND.astype(dot_dtype), w_CD.astype(dot_dtype),
                      preferred_element_type=jnp.float32)
    return l_NC + bias_C.astype(jnp.float32)


def _forward(h_ND, w_KCD, bias_KC, targets_N, dot_dtype):
    """(log p(target) (N,), log-sum-exp (N,)) by a scan over the K chunks."""
    N = h_ND.shape[0]
    C = w_KCD.shape[1]

    def step(carry, xs):
        m_N, s_N, t_N = carry
        k, w_CD, bias_C = xs
        l_NC = _logits(h_ND, w_CD, bias_C, dot_dtype)
        m_new = jnp.maximum(m_N, jnp.max(l_NC, axis=1))
        s_N = s_N * jnp.exp(m_N - m_new) + jnp.sum(jnp.exp(l_NC - m_new[:, None]), axis=1)
        hit_NC = jnp.arange(C, dtype=jnp.int32)[None, :] == (targets_N - k * C)[:, None]
        t_N = t_N + jnp.sum(jnp.where(hit_NC, l_NC, 0.0), axis=1)
        return (m_new, s_N, t_N), None

    init = (jnp.full((N,), -jnp.inf, jnp.float32), jnp.zeros((N,), jnp.float32), jnp.zeros((N,), jnp.float32))
    K = w_KCD.shape[0]
    (m_N, s_N, t_N), _ = jax.lax.scan(step, init, (jnp.arange(K, dtype=jnp.int32), w_KCD, bias_KC))
    lse_N = m_N + jnp.log(s_N)
    return t_N - lse_N, lse_N


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _chunked(h_ND, w_KCD, bias_KC, targets_N, dot_dtype, weight_grad):
    with jax.named_scope("chunked_ce"):  # the ops' source path (benchmarks/xla_ops.py)
        return _forward(h_ND, w_KCD, bias_KC, targets_N, dot_dtype)[0]


def _chunked_fwd(h_ND, w_KCD, bias_KC, targets_N, dot_dtype, weight_grad):
    with jax.named_scope("chunked_ce"):
        logp_N, lse_N = _forward(h_ND, w_KCD, bias_KC, targets_N, dot_dtype)
    return logp_N, (h_ND, w_KCD, bias_KC, targets_N, lse_N)


def _chunked_bwd(dot_dtype, weight_grad, res, g_N):
    with jax.named_scope("chunked_ce"):
        return _backward(dot_dtype, weight_grad, res, g_N)


def _backward(dot_dtype, weight_grad, res, g_N):
    h_ND, w_KCD, bias_KC, targets_N, lse_N = res
    C = w_KCD.shape[1]
    mm = h_ND.dtype if dot_dtype is None else dot_dtype
    h_mm = h_ND.astype(mm)
    g_N = g_N.astype(jnp.float32)

    def step(dh_ND, xs):
        k, w_CD, bias_C = xs
        l_NC = _logits(h_ND, w_CD, bias_C, dot_dtype)
        hit_NC = jnp.arange(C, dtype=jnp.int32)[None, :] == (targets_N - k * C)[:, None]
        dl_NC = g_N[:, None] * (hit_NC.astype(jnp.float32) - jnp.exp(l_NC - lse_N[:, None]))
        # the plain path's gradient reaches the matmuls in the weights' dtype (the cast's transpose)
        dl_mm = dl_NC.astype(h_ND.dtype).astype(mm)
        dh_ND = dh_ND + jnp.einsum("nc,cd->nd", dl_mm, w_CD.astype(mm), preferred_element_type=jnp.float32)
        if not weight_grad:
            return dh_ND, None
        dw_CD = jnp.einsum("nc,nd->cd", dl_mm, h_mm, preferred_element_type=jnp.float32)
        db_C = jnp.sum(dl_NC.astype(h_ND.dtype), axis=0, dtype=jnp.float32)
        return dh_ND, (dw_CD.astype(w_KCD.dtype), db_C.astype(bias_KC.dtype))

    K = w_KCD.shape[0]
    dh_ND, grads = jax.lax.scan(step, jnp.zeros(h_ND.shape, jnp.float32),
                                (jnp.arange(K, dtype=jnp.int32), w_KCD, bias_KC))
    dw_KCD, db_KC = grads if weight_grad else (jnp.zeros_like(w_KCD), jnp.zeros_like(bias_KC))
    return dh_ND.astype(h_ND.dtype), dw_KCD, db_KC, None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def chunked_logp(h_ND: jax.Array, w: jax.Array, b_V: jax.Array | None, targets_N: jax.Array, *,
                 w_layout: str = "DV", chunk: int = DEFAULT_CHUNK, dot_dtype: str | None = None,
                 weight_grad: bool = True) -> jax.Array:
    """fp32 log softmax(h W + b)[target] (N,), differentiable in ``h``, ``w`` and ``b``.

    ``h_ND``: the final hidden states (after the final norm); ``w``: the output weight,
    (D, V) for ``w_layout = "DV"`` (an ``lm_head``) or (V, D) for ``"VD"`` (a tied embedding
    table); ``b_V``: its bias or None; ``targets_N``: ids in [0, V). ``chunk``: vocabulary rows
    per step of the loop (any V: the last chunk is padded). ``dot_dtype``: None (the weights'
    dtype) or "bfloat16" (bf16 operands, fp32 accumulation). ``weight_grad=False``: the
    backward pass gives no gradient for ``w``/``b`` (zeros; a frozen head, e.g. under LoRA)
    and skips their matmul."""
    if w_layout not in ("DV", "VD"):
        raise ValueError(f"w_layout must be 'DV' or 'VD', got {w_layout!r}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    w_VD = w.T if w_layout == "DV" else w
    V = w_VD.shape[0]
    chunk = min(chunk, V)
    w_KCD, bias_KC = _chunks(w_VD, b_V, chunk)
    dd = None if dot_dtype is None else jnp.dtype(dot_dtype)
    return _chunked(h_ND, w_KCD, bias_KC, jnp.asarray(targets_N, jnp.int32), dd, weight_grad)
