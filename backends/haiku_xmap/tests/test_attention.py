"""Training and prefill attention through ``jax.nn.dot_product_attention`` (``layers.fused_attention``,
chosen by ``STAR_HAIKU_XMAP_ATTENTION``; cuDNN's on a GPU) computes what the reference attention
does, with every mask the models need: causal, packed segments, sliding window, left padding,
grouped-query heads; forward, gradients and a prefill into the cache. On a CPU the default stays
the reference, so every CPU result is unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from star_engine import UserError

from star_haiku_xmap.model import layers
from star_haiku_xmap.model import network as model
from star_haiku_xmap.train import trainer as train
from star_haiku_xmap.model.config import preset

CONFIGS = {  # two layers: the second reads the first's attention output
    "gptj": preset("tiny", n_layer=2, n_ctx=320),
    "llama": preset("llama-tiny", n_layer=2, n_ctx=320),
    "qwen2": preset("llama-tiny", n_layer=2, n_ctx=320, qkv_bias=True, tie_embeddings=True),
    "mistral": preset("llama-tiny", n_layer=2, n_ctx=320, sliding_window=5),
}
B, T = 2, 64
RNG = np.random.default_rng(0)


def _inputs(T: int):
    tokens = RNG.integers(0, 256, (B, T)).astype(np.int32)
    segments = np.ones((B, T), np.int32)
    segments[0, T // 3:] = 2
    segments[1, T - T // 8:] = 0  # padding at the end of a packed row
    positions = np.stack([np.concatenate([np.arange(T // 3), np.arange(T - T // 3)]), np.arange(T)]).astype(np.int32)
    mask = np.ones((B, T), bool)
    mask[1, :9] = False  # left padding
    return tokens, segments, positions, mask


TOKENS, SEGMENTS, POSITIONS, MASK = _inputs(T)


def _with(kind: str, monkeypatch, fn):
    monkeypatch.setenv(layers.ATTENTION_ENV, kind)
    jax.clear_caches()  # the kind is read when a step is traced
    try:
        return jax.tree.map(np.asarray, jax.jit(fn)())  # one program, as a step compiles it
    finally:
        jax.clear_caches()


@pytest.mark.parametrize("arch, case", [(a, c) for a in CONFIGS for c in ("causal", "segments", "left_padding")]
                         + [("gptj", "long"), ("mistral", "long")])
def test_forward_matches_the_reference(arch, case, monkeypatch):
    """"long": 272 tokens, over twice the reference's causal query block, so that its blocked
    path is compared too (packed segments)."""
    cfg = CONFIGS[arch]
    params = model.init_params(cfg, 0)
    tokens, segments, positions, mask = _inputs(272) if case == "long" else (TOKENS, SEGMENTS, POSITIONS, MASK)
    kw, valid = {"causal": ({}, np.ones(tokens.shape, bool)),
                 "segments": ({"segments": segments, "positions_BT": positions}, segments > 0),
                 "long": ({"segments": segments, "positions_BT": positions}, segments > 0),
                 "left_padding": ({"mask": mask}, mask)}[case]
    ref = _with("reference", monkeypatch, lambda: model.apply_forward(params, tokens, cfg, **kw))
    got = _with("xla", monkeypatch, lambda: model.apply_forward(params, tokens, cfg, **kw))
    np.testing.assert_allclose(got[valid], ref[valid], atol=2e-5, rtol=0)
    assert np.isfinite(got).all()  # padding queries (no key allowed) are finite too


@pytest.mark.parametrize("arch", ["gptj", "mistral"])
def test_gradients_match_the_reference(arch, monkeypatch):
    cfg = CONFIGS[arch]
    params = model.init_params(cfg, 0)
    batch = {"tokens": TOKENS, "positions": POSITIONS, "segments": SEGMENTS,
             "targets": np.roll(TOKENS, -1, axis=1), "weights": SEGMENTS > 0}

    def grads():
        return jax.grad(lambda p: train.token_loss(p, batch, cfg)[0])(params)

    ref = _with("reference", monkeypatch, grads)
    got = _with("xla", monkeypatch, grads)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, atol=1e-5 * max(1.0, float(np.abs(b).max())), rtol=0)


@pytest.mark.parametrize("arch", ["gptj", "llama"])
def test_prefill_into_the_cache_matches_the_reference(arch, monkeypatch):
    cfg = CONFIGS[arch]
    params = model.init_params(cfg, 0)
    prompt, mask = TOKENS[:, :40], MASK[:, :40]  # left padding

    def prefill():
        logits, cache, key_mask = model.prefill(params, prompt, mask, cfg, 64)
        return logits, cache.k, cache.v, key_mask

    ref = _with("reference", monkeypatch, prefill)
    got = _with("xla", monkeypatch, prefill)
    np.testing.assert_allclose(got[0], ref[0], atol=2e-5, rtol=0)
    np.testing.assert_array_equal(got[3], ref[3])
    slots = ref[3]  # (B, S): the slots that hold real tokens; a padding slot is never read
    for a, b in zip(jax.tree.leaves(got[1:3]), jax.tree.leaves(ref[1:3])):  # (B, G, S, K) per layer
        np.testing.assert_allclose(a.transpose(0, 2, 1, 3)[slots], b.transpose(0, 2, 1, 3)[slots], atol=2e-5, rtol=0)


def test_the_cpu_default_is_the_reference_and_cudnn_falls_back(monkeypatch):
    monkeypatch.delenv(layers.ATTENTION_ENV, raising=False)
    assert layers.attention_kind() == "reference"  # CPU results unchanged
    monkeypatch.setenv(layers.ATTENTION_ENV, "flash")
    with pytest.raises(UserError, match="STAR_HAIKU_XMAP_ATTENTION"):  # validate names it too
        layers.attention_kind()
    q = jnp.asarray(RNG.standard_normal((1, 4, 8, 16)), jnp.float32)
    kv = jnp.asarray(RNG.standard_normal((1, 2, 8, 16)), jnp.float32)
    allowed = jnp.tril(jnp.ones((8, 8), bool))[None]
    # No cuDNN here (a CPU, fp32): the XLA implementation answers, with the same numbers.
    np.testing.assert_array_equal(np.asarray(layers.fused_attention(q, kv, kv, allowed, "cudnn")),
                                  np.asarray(layers.fused_attention(q, kv, kv, allowed, "xla")))
