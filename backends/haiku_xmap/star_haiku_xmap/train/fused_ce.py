"""The fine-tuning loss's output layer with its gradients computed in the forward pass,
over chunks of tokens (``[model] loss_tokens``): three matmuls over the vocabulary, never
more than a chunk's (tokens x vocabulary) logits.

The SFT objective is linear in each token's log-probability, ``sum_n w_n log p(t_n)``,
with weights the batch gives. So the gradient with respect to the logits is known as soon
as a chunk's softmax is, ``dlogits = w * (onehot - softmax)``, and the forward pass can
finish the output layer's whole backward for that chunk at once:

    logits = h_c @ W + b           (M, V) fp32, M tokens of the chunk
    lse    = logsumexp(logits)     per token
    dl     = w * (onehot - exp(logits - lse))
    dh_c   = dl @ W^T              (M, D): the hidden states' gradient, kept
    dW    += h_c^T @ dl            (D, V), accumulated in fp32 over the chunks
    db    += 1^T dl                (V,)

The backward pass only scales what the forward kept by the loss's cotangent. Against the
vocabulary chunks of ``chunked_ce.py`` (which must hold for any cotangent, so recompute
each chunk's logits in the backward pass) this is one matmul less and one pass less over
the logits; against the plain path, the same arithmetic without the (tokens x vocabulary)
logits, their softmax and their gradient living in memory at once. The approach is the one
of Liger-Kernel's fused linear cross-entropy (``src/liger_kernel/ops/fused_linear_cross_entropy.py``,
``fused_linear_cross_entropy_forward``: chunks of tokens, the input, weight and bias
gradients computed in the forward pass, the backward scaling them by the loss's gradient);
this is written for XLA and this backend's loss, not a port of that kernel (no ignore
index, label smoothing, z-loss or softcap: the weights mask the loss).

The weight keeps its own layout, (D, V) for an ``lm_head`` or (V, D) for a tied embedding
table, and so does its gradient: no transposed or padded copy of either. The bias
gradient is a matmul with a ones vector: XLA:CPU reduces a (M, 50,400) array over its
rows some 60x slower than it multiplies it by a vector (docs/performance.md §3.5).

Precision follows the plain path (``loss.logits_logp``): a chunk's logits in the
weights' dtype plus the bias, then fp32; the softmax in fp32; the logits' gradient cast to
the weights' dtype before the two gradient matmuls (as autodiff of ``.astype(float32)``
does); the weight and bias gradients accumulated in fp32 over the chunks.

Rows are chunked along time: each step of the loop takes ``t`` consecutive positions of
every row (``t = max(1, tokens // B)``), so a batch split over "dp" by rows stays split
inside the loop. Positions past T (when t does not divide it) are zero-weight padding.

Shape suffixes: B rows, T time, D d_model, V vocabulary, M tokens of a chunk, K chunks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

LOGITS_BUDGET = 1 << 25  # fp32 logits a chunk may hold by default (128 MB): tokens_for()


def tokens_for(loss_tokens: int | None, vocab: int) -> int:
    """Tokens per chunk: ``loss_tokens`` as given; 0 means as many as ``LOGITS_BUDGET``
    logits allow at this vocabulary (at least 1); None is off (the caller's other paths)."""
    if loss_tokens is None:
        return 0
    if loss_tokens < 0:
        raise ValueError(f"loss_tokens must be >= 0, got {loss_tokens}")
    return loss_tokens or max(1, LOGITS_BUDGET // vocab)


def _dot(spec: str, a, b, mm):
    """``einsum(spec, a, b)`` in the weights' dtype (``mm`` None), or on ``mm`` operands with fp32
    accumulation (``b`` is then already ``mm``: the weight, cast once outside the loop)."""
    if mm is None:
        return jnp.einsum(spec, a, b)
    return jnp.einsum(spec, a.astype(mm), b, preferred_element_type=jnp.float32)


def _chunk(h_MD, w, w_mm, b_V, t_M, wt_M, layout: str, grads: bool, mm):
    """One chunk: (sum w log p, log p (M,), and with ``grads`` dl (M, V) in the weights' dtype)."""
    l_MV = _dot("md,dv->mv" if layout == "DV" else "md,vd->mv", h_MD, w_mm, mm)
    l_MV = (l_MV if b_V is None else l_MV + b_V.astype(l_MV.dtype)).astype(jnp.float32)
    m_M = jnp.max(l_MV, axis=1)
    e_MV = jnp.exp(l_MV - m_M[:, None])
    s_M = jnp.sum(e_MV, axis=1)
    target_M = jnp.take_along_axis(l_MV, t_M[:, None], axis=1)[:, 0]
    logp_M = target_M - m_M - jnp.log(s_M)
    total = jnp.sum(logp_M * wt_M)
    if not grads:
        return total, logp_M, None
    hit_MV = jnp.arange(l_MV.shape[1], dtype=jnp.int32)[None, :] == t_M[:, None]
    dl_MV = wt_M[:, None] * (hit_MV.astype(jnp.float32) - e_MV / s_M[:, None])
    return total, logp_M, dl_MV.astype(w.dtype)


def _split(x_BT, B: int, T: int, t: int, K: int):
    """(B, T, ...) padded to K * t positions and cut into (K, B, t, ...) chunks."""
    pad = [(0, 0), (0, K * t - T)] + [(0, 0)] * (x_BT.ndim - 2)
    x = jnp.pad(x_BT, pad).reshape(B, K, t, *x_BT.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def _run(h_BTD, w, b_V, t_BT, wt_BT, tokens: int, layout: str, grads: bool, weight_grad: bool, dot_dtype):
    B, T, D = h_BTD.shape
    w_mm = w if dot_dtype is None else w.astype(dot_dtype)
    t = max(1, min(T, tokens // B))
    K = -(-T // t)
    xs = (_split(h_BTD, B, T, t, K), _split(t_BT.astype(jnp.int32), B, T, t, K),
          _split(wt_BT.astype(jnp.float32), B, T, t, K))
    f32 = jnp.float32

    def step(carry, x):
        total, dw, db = carry
        h_BtD, t_Bt, wt_Bt = x
        h_MD = h_BtD.reshape(B * t, D)
        part, logp_M, dl_MV = _chunk(h_MD, w, w_mm, b_V, t_Bt.reshape(-1), wt_Bt.reshape(-1), layout, grads,
                                     dot_dtype)
        out = {"logp": logp_M.reshape(B, t)}
        if grads:
            dl_mm = dl_MV if dot_dtype is None else dl_MV.astype(dot_dtype)
            dh_MD = _dot("mv,dv->md" if layout == "DV" else "mv,vd->md", dl_mm, w_mm, dot_dtype)
            out["dh"] = dh_MD.astype(h_BTD.dtype).reshape(B, t, D)
            if weight_grad:
                spec = "md,mv->dv" if layout == "DV" else "md,mv->vd"
                h_mm = h_MD if dot_dtype is None else h_MD.astype(dot_dtype)
                dw = dw + jnp.einsum(spec, h_mm, dl_mm, preferred_element_type=f32)
                if b_V is not None:  # 1^T dl: a row reduction of (M, V) is XLA:CPU's slow case
                    db = db + jnp.einsum("m,mv->v", jnp.ones((B * t,), dl_MV.dtype), dl_MV,
                                         preferred_element_type=f32)
        return (total + part, dw, db), out

    zeros_w = jnp.zeros(w.shape, f32) if grads and weight_grad else jnp.zeros((), f32)
    zeros_b = jnp.zeros(b_V.shape, f32) if grads and weight_grad and b_V is not None else jnp.zeros((), f32)
    (total, dw, db), out = jax.lax.scan(step, (jnp.zeros((), f32), zeros_w, zeros_b), xs)
    unsplit = lambda x_KBt: jnp.moveaxis(x_KBt, 0, 1).reshape(B, K * t, *x_KBt.shape[3:])[:, :T]
    logp_BT = unsplit(out["logp"])
    if not grads:
        return total, logp_BT, None
    dh_BTD = unsplit(out["dh"])
    if not weight_grad:  # a frozen head: no cotangent (None is zeros to JAX), no (D, V) residual
        return total, logp_BT, (dh_BTD, None, None)
    return total, logp_BT, (dh_BTD, dw.astype(w.dtype), None if b_V is None else db.astype(b_V.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _weighted(h_BTD, w, b_V, t_BT, wt_BT, tokens, layout, weight_grad, dot_dtype):
    with jax.named_scope("fused_ce"):  # the ops' source path (benchmarks/xla_ops.py)
        return _run(h_BTD, w, b_V, t_BT, wt_BT, tokens, layout, False, weight_grad, dot_dtype)[0]


def _weighted_fwd(h_BTD, w, b_V, t_BT, wt_BT, tokens, layout, weight_grad, dot_dtype):
    with jax.named_scope("fused_ce"):
        total, logp_BT, grads = _run(h_BTD, w, b_V, t_BT, wt_BT, tokens, layout, True, weight_grad, dot_dtype)
    return total, (grads, logp_BT)


def _weighted_bwd(tokens, layout, weight_grad, dot_dtype, res, g):
    (dh_BTD, dw, db), logp_BT = res
    scale = lambda x: None if x is None else (g * x).astype(x.dtype)
    return scale(dh_BTD), scale(dw), scale(db), None, scale(logp_BT)


_weighted.defvjp(_weighted_fwd, _weighted_bwd)


def weighted_logp_sum(h_BTD: jax.Array, w: jax.Array, b_V: jax.Array | None, targets_BT: jax.Array,
                      weights_BT: jax.Array, *, tokens: int, w_layout: str = "DV",
                      weight_grad: bool = True, dot_dtype: str | None = None) -> jax.Array:
    """fp32 ``sum(weights * log softmax(h W + b)[target])``, differentiable in ``h``, ``w``,
    ``b`` (and ``weights``), with the output layer's gradients computed in the forward pass.

    ``h_BTD``: the final hidden states (after the final norm); ``w``: the output weight,
    (D, V) for ``w_layout = "DV"`` (an ``lm_head``) or (V, D) for ``"VD"`` (a tied table);
    ``b_V``: its bias or None; ``targets_BT``: ids in [0, V); ``weights_BT``: each token's
    weight (0 for padding). ``tokens``: tokens per chunk (``tokens_for``). ``weight_grad=False``:
    a frozen head (LoRA): zero gradients for ``w``/``b``, and their matmuls skipped. ``dot_dtype``: None
    (the weights' dtype) or "bfloat16" (the three matmuls on bf16 operands, fp32 accumulation)."""
    if w_layout not in ("DV", "VD"):
        raise ValueError(f"w_layout must be 'DV' or 'VD', got {w_layout!r}")
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    dd = None if dot_dtype is None else jnp.dtype(dot_dtype)
    return _weighted(h_BTD, w, b_V, targets_BT, weights_BT, int(tokens), w_layout, bool(weight_grad), dd)
