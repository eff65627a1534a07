"""Upper bounds for ``gptj_throughput.py --ceiling``: the backend's generation and
train step with the attention left out, at the same shape, dtype and mesh.

- generation: the real prefill, then greedy decode steps that run every matmul
  of a step (q/k/v/out, fc_in, fc_out, LM head, as (B, D) x (D, *) dots) and the
  LayerNorms and gelu, but no attention, rotary or KV cache;
- training: forward, backward and the clipped AdamW step over the same layers
  for every token of the batch.

Attention only adds work, so these figures bound what any attention kernel,
cache layout or schedule could reach here with XLA's matmuls. The attention
context is replaced by q + k + v (elementwise, so no projection is dead code).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, PartitionSpec as P

from star_haiku_xmap.model import layers
from star_haiku_xmap.model import network as model
from star_haiku_xmap.runtime import sharding
from star_haiku_xmap.train import trainer as train
from star_haiku_xmap.model.config import GPTJConfig


def _layers(p, x_ND, config: GPTJConfig):
    """Logits (N, V) fp32 of N independent tokens through every layer's matmuls."""
    for i in range(config.n_layer):
        h_ND = layers.layer_norm(x_ND, p[f"h_{i}/ln"]["scale"], p[f"h_{i}/ln"]["offset"], config.ln_eps)
        ctx_ND = sum(h_ND @ p[f"h_{i}/attn/{n}"]["w"] for n in "qkv")
        ff_NF = jax.nn.gelu(h_ND @ p[f"h_{i}/mlp/fc_in"]["w"] + p[f"h_{i}/mlp/fc_in"]["b"], approximate=True)
        x_ND = x_ND + ctx_ND @ p[f"h_{i}/attn/out"]["w"] + ff_NF @ p[f"h_{i}/mlp/fc_out"]["w"] + p[f"h_{i}/mlp/fc_out"]["b"]
    x_ND = layers.layer_norm(x_ND, p["ln_f"]["scale"], p["ln_f"]["offset"], config.ln_eps)
    return (x_ND @ p["lm_head"]["w"] + p["lm_head"]["b"]).astype(jnp.float32)


def _embed(params, tokens, config: GPTJConfig):
    return params["wte"]["embeddings"][tokens.reshape(-1)].astype(model.dtype_of(config))


def _generate_rows(params, tokens_BT, mask_BT, *, config: GPTJConfig, max_new_tokens: int):
    logits_BV, _, _ = model.prefill(params, tokens_BT, mask_BT, config, tokens_BT.shape[1])

    def body(i, s):
        logits_BV, out_BN = s
        tok_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
        out_BN = jax.lax.dynamic_update_slice(out_BN, tok_B[:, None], (0, i))
        return _layers(params, _embed(params, tok_B, config), config), out_BN

    out_BN = jnp.zeros((tokens_BT.shape[0], max_new_tokens), jnp.int32)
    return jax.lax.fori_loop(0, max_new_tokens, body, (logits_BV, out_BN))[1]


@functools.partial(jax.jit, static_argnames=("config", "max_new_tokens", "mesh"))
def dense_generate(params, tokens_BT, mask_BT, *, config: GPTJConfig, max_new_tokens: int, mesh: Mesh):
    """(B, max_new_tokens) greedy tokens of the attention-free decode, each dp
    shard running its own loop as ``sample.generate`` does."""
    rows = functools.partial(_generate_rows, config=config, max_new_tokens=max_new_tokens)
    if mesh.shape["dp"] == 1:
        return rows(params, tokens_BT, mask_BT)
    return jax.shard_map(rows, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=P("dp"),
                         axis_names={"dp"}, check_vma=False)(params, tokens_BT, mask_BT)


def _loss(params, tokens_BT, config: GPTJConfig):
    """Mean next-token cross-entropy over every position (as the benchmark's batch)."""
    B, T = tokens_BT.shape
    logits_BTV = _layers(params, _embed(params, tokens_BT, config), config).reshape(B, T, -1)
    return optax.softmax_cross_entropy_with_integer_labels(logits_BTV[:, :-1], tokens_BT[:, 1:]).mean()


def make_dense_update(config: GPTJConfig, tx: optax.GradientTransformation, mesh: Mesh, state: train.TrainState):
    """``update(state, tokens (B, T)) -> (state, loss)``, jit'd and sharded as the
    backend's ``train.make_update`` (state by the rule table, the batch over dp)."""
    def update(state: train.TrainState, tokens_BT):
        loss, grads = jax.value_and_grad(_loss)(state.params, tokens_BT, config)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return train.TrainState(optax.apply_updates(state.params, updates), opt_state, state.step + 1), loss

    state_sh = sharding.tree_shardings(state, mesh)
    return jax.jit(update, in_shardings=(state_sh, sharding.batch_sharding(mesh)),
                   out_shardings=(state_sh, sharding.replicated(mesh)), donate_argnums=0)
