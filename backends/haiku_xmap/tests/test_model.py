"""GPT-J model: parameter names/shapes/counts (and the Llama-style decoder's), the
Haiku modules that create them, parity with an independent NumPy GPT-J (HF's
formulas), KV-cache decoding, padding invariance, bf16."""

from __future__ import annotations

import math

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from star_haiku_xmap.model import gptj
from star_haiku_xmap.model import layers
from star_haiku_xmap.model import llama
from star_haiku_xmap.model import network as model
from star_haiku_xmap.model.config import PRESETS, GPTJConfig, LlamaConfig
from star_haiku_xmap.model.network import param_count

CFG = GPTJConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64, vocab=72)


@pytest.fixture(scope="module")
def params():
    p = model.init_params(CFG, 0)
    # Non-zero biases/LayerNorm params so that parity checks exercise them.
    leaves, tree = jax.tree.flatten(p)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(tree, leaves)


def test_param_names_and_shapes():
    c = CFG
    shapes = jax.tree.map(lambda x: x.shape, model.init_params(c, 0))
    HK = c.n_head * c.d_head
    want = {"wte": {"embeddings": (c.vocab, c.d_model)}, "ln_f": {"scale": (c.d_model,), "offset": (c.d_model,)},
            "lm_head": {"w": (c.d_model, c.vocab), "b": (c.vocab,)}}
    for i in range(c.n_layer):
        want[f"h_{i}/ln"] = {"scale": (c.d_model,), "offset": (c.d_model,)}
        for n in "qkv":
            want[f"h_{i}/attn/{n}"] = {"w": (c.d_model, HK)}
        want[f"h_{i}/attn/out"] = {"w": (HK, c.d_model)}
        want[f"h_{i}/mlp/fc_in"] = {"w": (c.d_model, c.d_ff), "b": (c.d_ff,)}
        want[f"h_{i}/mlp/fc_out"] = {"w": (c.d_ff, c.d_model), "b": (c.d_model,)}
    assert shapes == want


LLAMA = LlamaConfig(n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_head=16, d_ff=96, n_ctx=64, vocab=80)


@pytest.mark.parametrize("qkv_bias, tie", [(False, False), (True, True)])
def test_llama_param_names_and_shapes(qkv_bias, tie):
    c = LLAMA.replace(qkv_bias=qkv_bias, tie_embeddings=tie)
    shapes = jax.tree.map(lambda x: x.shape, model.init_params(c, 0))
    D, HK, GK = c.d_model, c.n_head * c.d_head, c.n_kv_head * c.d_head
    want = {"wte": {"embeddings": (c.vocab, D)}, "ln_f": {"scale": (D,)}}
    if not tie:
        want["lm_head"] = {"w": (D, c.vocab)}
    for i in range(c.n_layer):
        want[f"h_{i}/ln_attn"] = want[f"h_{i}/ln_mlp"] = {"scale": (D,)}
        for n, width in (("q", HK), ("k", GK), ("v", GK)):
            want[f"h_{i}/attn/{n}"] = {"w": (D, width), "b": (width,)} if qkv_bias else {"w": (D, width)}
        want[f"h_{i}/attn/out"] = {"w": (HK, D)}
        want[f"h_{i}/mlp/gate"] = want[f"h_{i}/mlp/up"] = {"w": (D, c.d_ff)}
        want[f"h_{i}/mlp/down"] = {"w": (c.d_ff, D)}
    assert shapes == want


def _shared(B: int, T: int, rotary_dim: int) -> layers.Shared:
    sin, cos = gptj._rotary_sin_cos(jnp.zeros((B, T), jnp.int32), rotary_dim)
    allowed_BTS = jnp.ones((B, T, T), bool)
    return layers.Shared(B, T, sin.transpose(0, 2, 1, 3), cos.transpose(0, 2, 1, 3), allowed_BTS, 0, False, 0)


@pytest.mark.parametrize("arch", [gptj, llama])
def test_modules_create_their_own_parameters(arch):
    # The network is Haiku modules that create the parameters they use: a layer
    # transformed on its own makes exactly its part of the model's tree.
    c = CFG if arch is gptj else LLAMA
    for cls in (arch.Attention, arch.MLP, arch.Block, layers.Linear, layers.Embed, layers.LayerNorm, layers.RMSNorm):
        assert issubclass(cls, hk.Module)
    full = jax.tree.map(jnp.shape, model.init_params(c, 0))
    B, T = 2, 3
    x_ND = jnp.zeros((B * T, c.d_model), model.dtype_of(c))
    sh = _shared(B, T, c.rotary_dim)

    def alone(f, *args):
        return jax.tree.map(jnp.shape, hk.transform(f).init(jax.random.key(0), *args))

    block = alone(lambda x: arch.Block(c, name="h_1")(x, sh, None), x_ND)
    assert block == {k: v for k, v in full.items() if k.startswith("h_1/")}
    mlp = alone(lambda x: arch.MLP(c)(x), x_ND)
    assert mlp == {k[len("h_1/"):]: v for k, v in full.items() if k.startswith("h_1/mlp/")}
    out, k_BHSK, v_BHSK = hk.transform(lambda x: arch.Block(c, name="h_1")(x, sh, None)).apply(
        model.init_params(c, 0), None, x_ND)
    kv_heads = getattr(c, "n_kv_head", c.n_head)
    assert out.shape == x_ND.shape and k_BHSK.shape == v_BHSK.shape == (B, kv_heads, T, c.d_head)


def test_param_count_gptj_6b():
    c = PRESETS["gptj-6b"]
    assert param_count(c) == 6_050_882_784  # unique parameters, as HF counts them
    assert param_count(c, mtj_shards=8) == 6_053_381_344  # the released mesh-transformer-jax figure
    assert param_count(c, mtj_shards=1) == 6_050_882_784 + c.d_model  # one embedding bias


def test_param_count_matches_formula():
    for c in (CFG, PRESETS["tiny"], PRESETS["small"]):
        D, F, V, HK = c.d_model, c.d_ff, c.vocab, c.n_head * c.d_head
        per_layer = 2 * D + 3 * D * HK + HK * D + D * F + F + F * D + D
        assert param_count(c) == V * D + c.n_layer * per_layer + 2 * D + D * V + V


def test_config_dict_roundtrip_and_validation():
    assert GPTJConfig.from_dict(CFG.to_dict()) == CFG
    with pytest.raises(ValueError, match="unknown"):
        GPTJConfig.from_dict({**CFG.to_dict(), "n_embd": 3})
    with pytest.raises(ValueError, match="rotary_dim"):
        CFG.replace(rotary_dim=CFG.d_head + 2)
    with pytest.raises(ValueError, match="dtype"):
        CFG.replace(dtype="float16")


# ----------------------------------------------------------------------------- NumPy reference


def _np_reference(params, tokens, c: GPTJConfig):
    """GPT-J written independently from HF's modeling_gptj formulas, float64."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    T = len(tokens)

    def ln(x, q):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + c.ln_eps) * q["scale"] + q["offset"]

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    inv_freq = 1.0 / 10000 ** (np.arange(0, c.rotary_dim, 2) / c.rotary_dim)
    ang = np.arange(T)[:, None] * inv_freq[None]  # (T, rd/2)
    sin, cos = np.repeat(np.sin(ang), 2, -1)[:, None], np.repeat(np.cos(ang), 2, -1)[:, None]

    def rot(x):  # (T, H, K)
        r = x[..., :c.rotary_dim]
        r2 = np.stack([-r[..., 1::2], r[..., ::2]], -1).reshape(r.shape)
        return np.concatenate([r * cos + r2 * sin, x[..., c.rotary_dim:]], -1)

    x = p["wte"]["embeddings"][tokens]
    causal = np.tril(np.ones((T, T), bool))
    for i in range(c.n_layer):
        h = ln(x, p[f"h_{i}/ln"])
        q, k, v = ((h @ p[f"h_{i}/attn/{n}"]["w"]).reshape(T, c.n_head, c.d_head) for n in "qkv")
        q, k = rot(q), rot(k)
        s = np.einsum("thk,shk->hts", q, k) / math.sqrt(c.d_head)
        s = np.where(causal, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        attn = np.einsum("hts,shk->thk", a, v).reshape(T, -1) @ p[f"h_{i}/attn/out"]["w"]
        mlp = gelu_new(h @ p[f"h_{i}/mlp/fc_in"]["w"] + p[f"h_{i}/mlp/fc_in"]["b"])
        mlp = mlp @ p[f"h_{i}/mlp/fc_out"]["w"] + p[f"h_{i}/mlp/fc_out"]["b"]
        x = x + attn + mlp
    return ln(x, p["ln_f"]) @ p["lm_head"]["w"] + p["lm_head"]["b"]


def test_forward_matches_numpy_reference(params):
    tokens = np.random.default_rng(0).integers(0, CFG.vocab, 20)
    got = model.forward(params, tokens[None], CFG)
    assert got.dtype == jnp.float32 and got.shape == (1, 20, CFG.vocab)
    np.testing.assert_allclose(np.asarray(got[0]), _np_reference(params, tokens, CFG), atol=2e-4, rtol=1e-4)


def test_rotary_is_interleaved_not_half_split(params):
    # Swapping to the GPT-NeoX half-split layout changes the logits: the test above
    # would catch a layout mix-up, and here we check the rotation itself on one pair.
    sin, cos = gptj._rotary_sin_cos(jnp.array([[3]]), 4)
    x = jnp.arange(1.0, 9.0).reshape(1, 1, 1, 8)
    y = gptj._apply_rotary(x, sin, cos, 4)[0, 0, 0]
    a0, a1 = 3.0, 3.0 / 100.0  # angles of pairs (0,1) and (2,3): inv_freq = 1, 1/10000^(2/4)
    want = [1 * math.cos(a0) - 2 * math.sin(a0), 2 * math.cos(a0) + 1 * math.sin(a0),
            3 * math.cos(a1) - 4 * math.sin(a1), 4 * math.cos(a1) + 3 * math.sin(a1), 5, 6, 7, 8]
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- cache / padding


def test_kv_cache_decode_matches_full_forward(params):
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab, (3, 14)), jnp.int32)
    mask = jnp.asarray(np.arange(14)[None] >= np.array([0, 5, 9])[:, None])  # left padding 0, 5, 9
    full = model.forward(params, tokens, CFG, mask=mask)
    last, cache, key_mask = model.prefill(params, tokens[:, :10], mask[:, :10], CFG, max_len=20)
    np.testing.assert_allclose(last, full[:, 9], atol=1e-5)
    positions = model.default_positions(mask)
    for s in range(10, 14):
        step_logits, cache, key_mask = model.decode_step(params, tokens[:, s], positions[:, s], s, cache,
                                                         key_mask, CFG)
        np.testing.assert_allclose(step_logits, full[:, s], atol=1e-5)
    assert cache.k_LBSHK.shape == (CFG.n_layer, 3, 20, CFG.n_head, CFG.d_head)


def test_left_padding_is_invisible(params):
    rng = np.random.default_rng(2)
    row = rng.integers(0, CFG.vocab, 7)
    alone = model.forward(params, row[None], CFG)
    padded = np.concatenate([rng.integers(0, CFG.vocab, 5), row])  # garbage under the padding
    mask = np.arange(12) >= 5
    in_batch = model.forward(params, padded[None], CFG, mask=mask[None])
    np.testing.assert_allclose(in_batch[0, 5:], alone[0], atol=1e-5)


def test_bfloat16_params_and_fp32_logits(params):
    c16 = CFG.replace(dtype="bfloat16")
    p16 = model.init_params(c16, 0)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))
    p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    tokens = np.random.default_rng(3).integers(0, CFG.vocab, (2, 9))
    lo = model.forward(p16, tokens, c16)
    hi = model.forward(params, tokens, CFG)
    assert lo.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(lo - hi))) < 0.15 * float(jnp.max(jnp.abs(hi)))
    assert np.isfinite(np.asarray(lo)).all()
