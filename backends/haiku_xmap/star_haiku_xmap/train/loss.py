"""The training objective's log-probabilities: one micro-batch's fp32 log p(target) and
the default objective, the weighted next-token NLL, through one of three output layers:

- the plain path: the (B, T, V) fp32 logits and their log-softmax (``logits_logp``);
- ``loss_chunk``: vocabulary chunks that never hold the logits (``chunked_ce.py``), for
  any cotangent (DPO, scoring);
- ``loss_tokens``: token chunks with the output layer's gradients computed in the
  forward pass (``fused_ce.py``), for the weighted NLL alone, whose cotangent is known.

Shape suffixes: B rows, T time, D d_model, V vocabulary.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from ..model import lora
from ..model import network as model
from ..model.config import ModelConfig
from . import chunked_ce, fused_ce


def _body(params, batch: Mapping[str, jax.Array], config: ModelConfig, remat: bool, adapters: Any,
          adapter: lora.LoraSpec | None, head: bool) -> jax.Array:
    """The network on one micro-batch: fp32 logits (B, T, V), or with ``head=False`` the final
    hidden states (B, T, D). ``remat``: the backward pass keeps only each block's input and
    recomputes the rest of the block. ``adapter``: ``params`` is the frozen base and
    ``adapters`` its LoRA adapters (``lora.py``)."""

    def forward(p, ad, tokens, positions, segments):
        if adapter is None:
            return model.forward(p, tokens, config, positions_BT=positions, segments=segments, head=head)
        return lora.forward(p, ad, tokens, config, adapter, positions_BT=positions, segments=segments, head=head)

    if remat:
        forward = jax.checkpoint(forward, policy=jax.checkpoint_policies.save_only_these_names(model.LAYER_INPUT))
    return forward(params, adapters, batch["tokens"], batch["positions"], batch["segments"])


def token_logp(params, batch: Mapping[str, jax.Array], config: ModelConfig, remat: bool = False,
               adapters: Any = None, adapter: lora.LoraSpec | None = None, *,
               loss_chunk: int | None = None, loss_dot_dtype: str | None = None) -> jax.Array:
    """fp32 log p(target) (B, T) of every target of one micro-batch of (B, T) arrays
    (``packing.KEYS``; unweighted: padding's too); ``remat``, ``adapters``, ``adapter``: as
    ``_body``'s. ``loss_chunk``: the output projection and softmax over vocabulary chunks of
    that many rows (``chunked_ce.py``), never holding the (B, T, V) logits; 0: the plain
    path, as None (``chunked_ce.chunk_for``: chunking is opt-in); ``loss_dot_dtype``: the chunks'
    matmul operands ("bfloat16"; None: the weights' dtype)."""
    chunk = chunked_ce.chunk_for(loss_chunk)
    out_BTX = _body(params, batch, config, remat, adapters, adapter, head=not chunk)
    if chunk:  # out: the final hidden states (B, T, D); the head is frozen under LoRA
        w, layout, b = model.output_head(params, config)
        B, T, D = out_BTX.shape
        logp_N = chunked_ce.chunked_logp(out_BTX.reshape(B * T, D), w, b, batch["targets"].reshape(B * T),
                                         w_layout=layout, chunk=chunk, weight_grad=adapter is None,
                                         dot_dtype=loss_dot_dtype)
        return logp_N.reshape(B, T)
    return logits_logp(out_BTX, batch["targets"])


def logits_logp(logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
    """The plain path's log p(target) (B, T) from fp32 logits (B, T, V): (x - max)[target] -
    log sum exp(x - max), as log_softmax computes it; the one-hot product picks the target
    exactly, and its gradient stays elementwise (take_along_axis's would be a scatter)."""
    shifted_BTV = logits_BTV - jax.lax.stop_gradient(jnp.max(logits_BTV, axis=-1, keepdims=True))
    onehot_BTV = jax.nn.one_hot(targets_BT, logits_BTV.shape[-1], dtype=jnp.float32)
    return jnp.sum(shifted_BTV * onehot_BTV, axis=-1) - jnp.log(jnp.sum(jnp.exp(shifted_BTV), axis=-1))


def token_loss(params, batch: Mapping[str, jax.Array], config: ModelConfig, remat: bool = False,
               adapters: Any = None, adapter: lora.LoraSpec | None = None, *, loss_chunk: int | None = None,
               loss_tokens: int | None = None, loss_dot_dtype: str | None = None):
    """(sum of fp32 next-token NLL over the weighted targets, number of them) for one
    micro-batch (``token_logp``'s arguments): ``make_update``'s default objective.
    ``loss_tokens`` (not None): the output layer over chunks of that many tokens with its
    gradients computed in the forward pass (``fused_ce.py``; 0: as many as
    ``fused_ce.LOGITS_BUDGET`` allows); ``loss_chunk`` is then unused. ``loss_dot_dtype``: the
    chunked output layer's matmul operands ("bfloat16"; None: the weights' dtype)."""
    w_BT = batch["weights"].astype(jnp.float32)
    tokens = fused_ce.tokens_for(loss_tokens, config.vocab)
    if not tokens:
        logp_BT = token_logp(params, batch, config, remat, adapters, adapter, loss_chunk=loss_chunk,
                             loss_dot_dtype=loss_dot_dtype)
        return -jnp.sum(logp_BT * w_BT), jnp.sum(w_BT)
    h_BTD = _body(params, batch, config, remat, adapters, adapter, head=False)
    w, layout, b = model.output_head(params, config)  # the head is frozen under LoRA
    total = fused_ce.weighted_logp_sum(h_BTD, w, b, batch["targets"], w_BT, tokens=tokens, w_layout=layout,
                                       weight_grad=adapter is None, dot_dtype=loss_dot_dtype)
    return -total, jnp.sum(w_BT)
