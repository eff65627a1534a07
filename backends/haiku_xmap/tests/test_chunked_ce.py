"""The output projection + softmax over vocabulary chunks (``train/chunked_ce.py``,
``[model] loss_chunk``): log p(target) and every gradient equal the plain path's
(full logits) within fp32 rounding, for a vocabulary that is not a multiple of the
chunk, through the real step (``make_update``: packed rows, padding weights 0,
gradient accumulation), remat, tied embeddings, LoRA and the DPO objective; small
vocabularies keep the plain path by default."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from star_haiku_xmap.model import lora
from star_haiku_xmap.model import network as model
from star_haiku_xmap.model.config import GPTJConfig, preset
from star_haiku_xmap.tokenizer import ByteTokenizer
from star_haiku_xmap.train import chunked_ce, packing, packplan, preference
from star_haiku_xmap.train import trainer as train

TOK = ByteTokenizer()
GPTJ = GPTJConfig(n_layer=1, d_model=32, n_head=4, d_head=8, d_ff=64, rotary_dim=4, n_ctx=64, vocab=264)
TIED = preset("llama-tiny", n_layer=1, d_model=32, n_head=4, n_kv_head=2, d_head=8, d_ff=64, n_ctx=64, qkv_bias=True,
             tie_embeddings=True)  # Qwen2-like: the head is wte
CHUNK = 48  # 264 = 5 x 48 + 24: the last chunk is half padding


def _plain_logp(h, w, b, t, layout):
    logits = (h @ w if layout == "DV" else h @ w.T) + (0.0 if b is None else b)
    return jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), t[:, None], axis=1)[:, 0]


@pytest.mark.parametrize("layout,bias,chunk", [("DV", True, 16), ("VD", False, 16), ("DV", False, 64)])
def test_chunked_logp_and_its_gradients_equal_log_softmax(layout, bias, chunk):
    N, D, V = 12, 8, 50  # 50 = 3 x 16 + 2
    k = jax.random.split(jax.random.key(0), 4)
    h = jax.random.normal(k[0], (N, D))
    w = jax.random.normal(k[1], (D, V) if layout == "DV" else (V, D))
    b = jax.random.normal(k[2], (V,)) if bias else None
    t = jnp.asarray([0, 1, V - 1, V - 2, 47, 48, 49, 15, 16, 17, 33, 32], jnp.int32)  # both ends of every chunk
    g = jax.random.normal(k[3], (N,))
    got = chunked_ce.chunked_logp(h, w, b, t, w_layout=layout, chunk=chunk)
    np.testing.assert_allclose(got, _plain_logp(h, w, b, t, layout), rtol=1e-5, atol=1e-6)
    f = lambda fn: lambda h, w, b: jnp.dot(g, fn(h, w, b))  # noqa: E731
    argnums = (0, 1, 2) if bias else (0, 1)
    want = jax.grad(f(lambda h, w, b: _plain_logp(h, w, b, t, layout)), argnums)(h, w, b)
    grads = jax.grad(f(lambda h, w, b: chunked_ce.chunked_logp(h, w, b, t, w_layout=layout, chunk=chunk)),
                     argnums)(h, w, b)
    for a, e in zip(grads, want):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    # weight_grad=False: the same input gradient, none for the (frozen) weights
    frozen = jax.grad(f(lambda h, w, b: chunked_ce.chunked_logp(h, w, b, t, w_layout=layout, chunk=chunk,
                                                                 weight_grad=False)), argnums)(h, w, b)
    np.testing.assert_allclose(frozen[0], want[0], rtol=1e-5, atol=1e-6)
    assert not np.any(np.asarray(frozen[1]))


def test_a_dropped_or_unmasked_last_chunk_is_caught():
    """The checks above see a wrong last chunk: without it, or with its padding rows counted
    (logit 0 instead of -inf), log p moves far beyond rounding."""
    N, D, V, C = 6, 8, 50, 16
    k = jax.random.split(jax.random.key(1), 2)
    h, w = jax.random.normal(k[0], (N, D)), jax.random.normal(k[1], (V, D))
    t = jnp.zeros(N, jnp.int32)
    good = chunked_ce.chunked_logp(h, w, None, t, w_layout="VD", chunk=C)
    dropped = chunked_ce.chunked_logp(h, w[:48], None, t, w_layout="VD", chunk=C)  # what dropping it computes
    unmasked = chunked_ce.chunked_logp(h, jnp.pad(w, ((0, 14), (0, 0))), None, t, w_layout="VD", chunk=C)
    assert np.max(np.abs(np.asarray(good - dropped))) > 1e-3
    assert np.max(np.abs(np.asarray(good - unmasked))) > 1e-3


def test_the_default_keeps_the_plain_path_for_small_vocabularies():
    assert chunked_ce.chunk_for(None) == 0  # opt-in: unset is the plain path at any vocabulary, bit for bit
    assert chunked_ce.chunk_for(chunked_ce.DEFAULT_CHUNK) == chunked_ce.DEFAULT_CHUNK
    assert chunked_ce.chunk_for(0) == 0 and chunked_ce.chunk_for(8) == 8
    with pytest.raises(ValueError, match="loss_chunk"):
        chunked_ce.chunk_for(-1)


def _packed_step(cfg, grad_accum=2):
    rng = np.random.default_rng(0)
    enc = [train.encode_example(TOK, "".join(rng.choice(list("abcdefgh"), int(rng.integers(2, 20)))),
                                "".join(rng.choice(list("0123456789"), int(rng.integers(2, 20)))), 64)
           for _ in range(10)]
    step = packplan.plan_packed([len(e.ids) for e in enc], steps=1, batch_size=5, grad_accum=grad_accum, seed=0,
                                seq_len=64, dp=1, dims=train.dims(cfg))[0]
    batch = packing.collate_packed(enc, step, grad_accum=grad_accum, pad_id=TOK.pad_id)
    assert batch["segments"].max() >= 2 and not batch["weights"].all()  # packed, with weightless padding
    return {k: jnp.asarray(v) for k, v in batch.items()}


def _sgd_step(cfg, params, batch, loss_chunk, **kw):
    """One step of ``make_update`` with plain SGD (lr 1): the new params are params - the
    step's mean gradient, so comparing them compares every gradient."""
    update = train.make_update(cfg, optax.sgd(1.0), loss_chunk=loss_chunk, **kw)
    state = train.init_state(jax.tree.map(jnp.copy, params), optax.sgd(1.0))
    return update(state, batch)


def _assert_close_trees(a, b):
    """Equal within fp32 rounding: 1e-5 relative, or 1e-6 of the tree's largest entry."""
    scale = max(float(np.max(np.abs(np.asarray(y)))) for y in jax.tree.leaves(b))
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6 * scale,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("cfg,remat", [(GPTJ, False), (TIED, True)], ids=["gptj", "tied-remat"])
def test_the_training_step_is_the_plain_one(cfg, remat):
    params = model.init_params(cfg, 0)
    batch = _packed_step(cfg)
    (plain, m_plain), (chunked, m_chunked) = (_sgd_step(cfg, params, batch, c, remat=remat) for c in (0, CHUNK))
    assert float(m_chunked["loss"]) == pytest.approx(float(m_plain["loss"]), rel=1e-6)
    assert float(m_chunked["grad_norm"]) == pytest.approx(float(m_plain["grad_norm"]), rel=1e-5)
    _assert_close_trees(chunked.params, plain.params)


def test_lora_adapters_get_the_plain_gradients():
    cfg = GPTJ
    base = model.init_params(cfg, 0)
    spec = lora.check_table({"kind": "lora", "rank": 4, "alpha": 8}, cfg, "training.adapter")
    ad = lora.init_adapters(cfg, spec, jax.random.key(1))
    noise = lambda x: 0.1 * jax.random.normal(jax.random.key(x.size), x.shape)  # noqa: E731
    ad = jax.tree.map(lambda x: x + noise(x), ad)  # B != 0: the adapters act on the loss
    mb = {k: v[0] for k, v in _packed_step(cfg).items()}
    grads = [jax.jit(jax.value_and_grad(lambda a, c=c: train.token_loss(base, mb, cfg, False, a, spec,
                                                                         loss_chunk=c)[0]))(ad) for c in (0, CHUNK)]
    assert float(grads[1][0]) == pytest.approx(float(grads[0][0]), rel=1e-6)
    _assert_close_trees(grads[1][1], grads[0][1])


def test_the_dpo_objective_is_the_plain_one():
    params = model.init_params(GPTJ, 0)
    mb = {k: v[0] for k, v in _packed_step(GPTJ, grad_accum=1).items()}
    mb["ref"] = jnp.zeros((mb["tokens"].shape[0], 1), jnp.float32)
    obj = functools.partial(preference.dpo_objective, beta=0.5)
    out = [jax.jit(jax.value_and_grad(lambda p, c=c: obj(p, mb, GPTJ, loss_chunk=c)[0]))(params) for c in (0, CHUNK)]
    assert float(out[1][0]) == pytest.approx(float(out[0][0]), rel=1e-6)
    _assert_close_trees(out[1][1], out[0][1])
