"""The output layers that never hold a step's (tokens x vocabulary) logits, against the plain
path (full logits), within fp32 rounding:

- vocabulary chunks (``train/chunked_ce.py``, ``[model] loss_chunk``): log p(target) and every
  gradient, for a vocabulary that is not a multiple of the chunk, through the real step
  (``make_update``: packed rows, padding weights 0, gradient accumulation), remat, tied
  embeddings, LoRA and the DPO objective; small vocabularies keep the plain path by default;
- token chunks with the gradients computed in the forward pass (``train/fused_ce.py``,
  ``[model] loss_tokens``): the weighted sum of log p(target) and every gradient, for chunks
  that do not divide the rows, through the same step, remat, tied embeddings and LoRA; an
  undifferentiated call computes no gradient; bf16 operands stay within bf16 rounding."""

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
from star_haiku_xmap.train import chunked_ce, fused_ce, packing, packplan, preference
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


@pytest.mark.parametrize("layer", [{"loss_chunk": CHUNK}, {"loss_tokens": 9}], ids=["chunked", "fused"])
def test_lora_adapters_get_the_plain_gradients(layer):
    cfg = GPTJ
    base = model.init_params(cfg, 0)
    spec = lora.check_table({"kind": "lora", "rank": 4, "alpha": 8}, cfg, "training.adapter")
    ad = lora.init_adapters(cfg, spec, jax.random.key(1))
    noise = lambda x: 0.1 * jax.random.normal(jax.random.key(x.size), x.shape)  # noqa: E731
    ad = jax.tree.map(lambda x: x + noise(x), ad)  # B != 0: the adapters act on the loss
    mb = {k: v[0] for k, v in _packed_step(cfg).items()}
    grads = [jax.jit(jax.value_and_grad(lambda a, kw=kw: train.token_loss(base, mb, cfg, False, a, spec, **kw)[0]))(ad)
             for kw in ({}, layer)]
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


# ----------------------------------------------------------------------------- fused_ce


def _plain_sum(h_BTD, w, b, t_BT, wt_BT, layout):
    logits = (h_BTD @ w if layout == "DV" else h_BTD @ w.T) + (0.0 if b is None else b)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), t_BT[..., None], axis=-1)[..., 0]
    return jnp.sum(logp * wt_BT)


@pytest.mark.parametrize("layout,bias,tokens", [("DV", True, 6), ("VD", False, 6), ("DV", True, 1000),
                                                ("DV", False, 1)])
def test_fused_the_weighted_sum_and_its_gradients_equal_log_softmax(layout, bias, tokens):
    B, T, D, V = 3, 7, 8, 50  # tokens 6 over 3 rows: chunks of 2 positions, the last one half padding
    k = jax.random.split(jax.random.key(0), 5)
    h = jax.random.normal(k[0], (B, T, D))
    w = jax.random.normal(k[1], (D, V) if layout == "DV" else (V, D))
    b = jax.random.normal(k[2], (V,)) if bias else None
    t = jax.random.randint(k[3], (B, T), 0, V).at[0, :3].set(jnp.asarray([0, V - 1, 17]))
    wt = (jax.random.uniform(k[4], (B, T)) > 0.3).astype(jnp.float32) * 1.5
    fused = lambda h, w, b, wt: fused_ce.weighted_logp_sum(h, w, b, t, wt, tokens=tokens, w_layout=layout)
    plain = lambda h, w, b, wt: _plain_sum(h, w, b, t, wt, layout)
    np.testing.assert_allclose(fused(h, w, b, wt), plain(h, w, b, wt), rtol=1e-5)
    argnums = (0, 1, 2, 3) if bias else (0, 1, 3)
    scale = 0.7  # a loss cotangent other than 1: the backward pass scales what the forward kept
    got = jax.grad(lambda *a: scale * fused(*a), argnums)(h, w, b, wt)
    want = jax.grad(lambda *a: scale * plain(*a), argnums)(h, w, b, wt)
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)
    # a frozen head: the same hidden-state gradient, nothing for the weights
    frozen = jax.grad(lambda h, w: fused_ce.weighted_logp_sum(h, w, b, t, wt, tokens=tokens, w_layout=layout,
                                                              weight_grad=False), (0, 1))(h, w)
    np.testing.assert_allclose(frozen[0], want[0] / scale, rtol=1e-5, atol=1e-5)
    assert not np.any(np.asarray(frozen[1]))


def test_fused_the_checks_see_a_wrong_chunk():
    """The comparison above catches a chunking slip: a padding position that kept its weight,
    or a chunk's rows read from the wrong place, moves the sum far beyond rounding."""
    B, T, D, V = 2, 5, 8, 30
    k = jax.random.split(jax.random.key(1), 3)
    h, w = jax.random.normal(k[0], (B, T, D)), jax.random.normal(k[1], (D, V))
    t = jax.random.randint(k[2], (B, T), 0, V)
    wt = jnp.ones((B, T))
    good = fused_ce.weighted_logp_sum(h, w, None, t, wt, tokens=4)
    assert float(good) == pytest.approx(float(_plain_sum(h, w, None, t, wt, "DV")), rel=1e-5)
    shifted = fused_ce.weighted_logp_sum(jnp.roll(h, 1, axis=1), w, None, t, wt, tokens=4)
    assert abs(float(good - shifted)) > 1e-2


def test_fused_an_undifferentiated_call_computes_no_gradient():
    B, T, D, V = 2, 6, 8, 40
    args = (jnp.ones((B, T, D)), jnp.ones((D, V)), jnp.zeros((V,)), jnp.zeros((B, T), jnp.int32), jnp.ones((B, T)))
    text = jax.jit(lambda *a: fused_ce.weighted_logp_sum(*a, tokens=4)).lower(*args).as_text()
    assert text.count("dot_general") == 1  # the logits alone: no dh, dW or db matmul


def test_fused_tokens_for():
    assert fused_ce.tokens_for(None, 50400) == 0  # off
    assert fused_ce.tokens_for(128, 50400) == 128
    assert fused_ce.tokens_for(0, 50400) == fused_ce.LOGITS_BUDGET // 50400
    assert fused_ce.tokens_for(0, 1 << 30) == 1
    with pytest.raises(ValueError, match="loss_tokens"):
        fused_ce.tokens_for(-1, 10)


@pytest.mark.parametrize("cfg,remat,tokens", [(GPTJ, False, 0), (GPTJ, False, 7), (TIED, True, 5)],
                         ids=["gptj-budget", "gptj-7", "tied-remat"])
def test_fused_the_training_step_is_the_plain_one(cfg, remat, tokens):
    params = model.init_params(cfg, 0)
    batch = _packed_step(cfg)
    plain, m_plain = _sgd_step(cfg, params, batch, 0, remat=remat)
    fused, m_fused = _sgd_step(cfg, params, batch, 0, remat=remat, loss_tokens=tokens)
    assert float(m_fused["loss"]) == pytest.approx(float(m_plain["loss"]), rel=1e-6)
    assert float(m_fused["tokens"]) == float(m_plain["tokens"])
    assert float(m_fused["grad_norm"]) == pytest.approx(float(m_plain["grad_norm"]), rel=1e-5)
    _assert_close_trees(fused.params, plain.params)


def test_fused_bf16_operands_stay_within_bf16_rounding():
    B, T, D, V = 2, 8, 32, 300
    k = jax.random.split(jax.random.key(2), 3)
    h, w = jax.random.normal(k[0], (B, T, D)), 0.2 * jax.random.normal(k[1], (D, V))
    t, wt = jax.random.randint(k[2], (B, T), 0, V), jnp.ones((B, T))
    f = lambda dd: jax.value_and_grad(lambda h, w: fused_ce.weighted_logp_sum(h, w, None, t, wt, tokens=8,
                                                                                dot_dtype=dd), (0, 1))(h, w)
    (l32, g32), (l16, g16) = f(None), f("bfloat16")
    assert float(l16) == pytest.approx(float(l32), rel=2e-2)
    for a, e in zip(g16, g32):
        assert float(jnp.max(jnp.abs(a - e))) <= 2e-2 * float(jnp.max(jnp.abs(e)))
        assert float(jnp.max(jnp.abs(a - e))) > 0  # bf16 operands really were used


def test_the_backend_options_reach_the_step(tmp_path):
    """``[model] loss_tokens`` and ``loss_dot_dtype`` through the backend (options -> TrainConfig ->
    the step): the plain path's losses within fp32 rounding, and within bf16 rounding (but not
    equal) on bf16 operands."""
    from star_engine.api import TrainExample, TrainSpec
    from star_haiku_xmap import plugin

    small = dict(preset="tiny", n_layer=1, d_model=32, n_head=2, d_head=16, d_ff=64, rotary_dim=8, n_ctx=64,
                 seq_len=48)
    examples = [TrainExample(f"Q: {i}\nA:", " " + "ab" * (i % 5 + 1) + "\nQ") for i in range(10)]
    spec = TrainSpec(steps=3, batch_size=4, grad_accum=1, seed=2, optimizer={"lr": 1e-2, "warmup_steps": 0})
    losses = {}
    for name, extra in (("plain", {}), ("fused", {"loss_tokens": 7}),
                        ("bf16", {"loss_tokens": 7, "loss_dot_dtype": "bfloat16"})):
        backend = plugin.HaikuXmapBackend.from_table(**small, **extra)
        base = backend.base(tmp_path / name, seed=0)
        losses[name] = backend.train(base, tmp_path / name / "m", examples, spec).losses
    np.testing.assert_allclose(losses["fused"], losses["plain"], rtol=1e-5)
    np.testing.assert_allclose(losses["bf16"], losses["plain"], rtol=2e-2)
    assert losses["bf16"] != losses["plain"]
