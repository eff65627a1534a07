"""The ragged decode kernel (kernels/ragged.py, model.decode_attention = "ragged"): the dense
attention's values within fp32 rounding over any mask, grouped-query heads and a shared prefix;
continuous generation's tokens unchanged; built once, atomically; its options checked at load."""

from __future__ import annotations

import os
import shutil
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from star_engine import UserError
from star_haiku_xmap.kernels import ragged
from star_haiku_xmap.model import layers, network as model
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.options import ModelOptions, resolve
from star_haiku_xmap.sampling import continuous, static as sample

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "c++") is None, reason="no C++ compiler")


def _dense(q_BHK, k_BGSK, v_BGSK, allowed_BS, prefix=None, prefix_allowed_BP=None):
    """The dense path the kernel replaces (layers.gqa_attention / prefix_attention), one query a row."""
    B, H, K = q_BHK.shape
    G = k_BGSK.shape[1]
    q = q_BHK[:, :, None] if G == H else q_BHK.reshape(B, G, H // G, 1, K)
    if prefix is None:
        out = layers.gqa_attention(q, k_BGSK, v_BGSK, allowed_BS[:, None], K)
    else:
        out = layers.prefix_attention(q, prefix[0], prefix[1], k_BGSK, v_BGSK, prefix_allowed_BP[:, None],
                                      allowed_BS[:, None], K)
    return out.reshape(B, H, K)


@pytest.mark.parametrize("H, G, K, P", [(4, 4, 16, 0), (8, 2, 32, 0), (4, 4, 16, 24), (6, 3, 20, 9), (12, 12, 16, 5),
                                        (4, 2, 64, 0), (4, 4, 128, 3), (2, 1, 256, 0)])
def test_the_kernel_is_the_dense_attention_over_any_mask(H, G, K, P):
    rng = np.random.default_rng(H * 100 + K + P)
    B, S = 7, 40
    q = jnp.asarray(rng.standard_normal((B, H, K)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((B, G, S, K)), jnp.float32) for _ in range(2))
    lengths = np.array([1, 40, 17, 3, 29, 40, 8])
    allowed = np.arange(S)[None] < lengths[:, None]
    allowed[2, :5] = False  # a sliding window: the oldest keys out
    allowed[4, 10:14] = False  # left padding in the middle of the slots
    prefix = pallow = None
    if P:
        prefix = tuple(jnp.asarray(rng.standard_normal((1, G, P, K)), jnp.float32) for _ in range(2))
        pallow = np.ones((B, P), bool)
        pallow[1, :P // 2] = False
    got = ragged.ragged_decode_attention(q, k, v, jnp.asarray(allowed), prefix, None if pallow is None else jnp.asarray(pallow))
    want = _dense(q, k, v, jnp.asarray(allowed), prefix, None if pallow is None else jnp.asarray(pallow))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=2e-6)
    # The slots past each row's last allowed key are never read: garbage there changes nothing.
    junk = np.where(np.arange(S)[None, None, :, None] >= lengths[:, None, None, None], np.nan, 0.0)
    again = ragged.ragged_decode_attention(q, k + junk, v + junk, jnp.asarray(allowed), prefix,
                                           None if pallow is None else jnp.asarray(pallow))
    np.testing.assert_array_equal(np.asarray(again), np.asarray(got))


@pytest.mark.parametrize("H, K, P", [(12, 16, 0), (8, 32, 17), (3, 64, 0)])
def test_heads_summed_side_by_side_are_each_head_alone_bit_for_bit(H, K, P):
    rng = np.random.default_rng(H + K)
    B, S = 5, 70
    q = jnp.asarray(rng.standard_normal((B, H, K)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((B, H, S, K)), jnp.float32) for _ in range(2))
    allowed = jnp.asarray(np.arange(S)[None] < np.array([70, 1, 33, 0, 48])[:, None])
    prefix = tuple(jnp.asarray(rng.standard_normal((1, H, P, K)), jnp.float32) for _ in range(2)) if P else None
    pallow = jnp.ones((B, P), bool) if P else None
    every = np.asarray(ragged.ragged_decode_attention(q, k, v, allowed, prefix, pallow))
    for h in range(H):
        one = prefix and tuple(x[:, h:h + 1] for x in prefix)
        alone = ragged.ragged_decode_attention(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], allowed, one, pallow)
        np.testing.assert_array_equal(np.asarray(alone)[:, 0], every[:, h])


def test_a_row_allowed_no_key_gets_zeros():
    q = jnp.ones((2, 2, 8), jnp.float32)
    k = v = jnp.ones((2, 2, 5, 8), jnp.float32)
    allowed = jnp.asarray([[True] * 5, [False] * 5])
    out = np.asarray(ragged.ragged_decode_attention(q, k, v, allowed))
    assert np.all(out[1] == 0) and np.allclose(out[0], 1.0)


CFG = GPTJConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=96, vocab=72)


@pytest.fixture(scope="module")
def params():
    p = model.init_params(CFG, 0)
    p["lm_head"]["w"] = p["lm_head"]["w"] * 4  # sharpen: greedy choices are not near-ties
    p["lm_head"]["b"] = p["lm_head"]["b"].at[70].set(2.5)  # some rows end early with end-of-text
    return p


@pytest.mark.parametrize("temperature, top_p, shared", [(0.0, 1.0, False), (1.0, 0.8, False), (0.0, 1.0, True)])
def test_continuous_generation_makes_the_same_tokens(params, temperature, top_p, shared):
    rng = np.random.default_rng(3)
    head = list(map(int, rng.integers(1, 64, 66 if shared else 0)))  # a shared few-shot prefix (64 of it)
    prompts = [head + list(map(int, rng.integers(1, 64, n))) for n in (3, 11, 1, 7, 9, 2, 5, 12)]
    budgets = [5, 16, 9, 14, 3, 18, 11, 7] if shared else [5, 40, 9, 30, 3, 44, 17, 25]
    seeds = list(range(8))
    out = {}
    for kind in ("dense", "ragged"):
        decode = sample.DecodeConfig(temperature=temperature, top_p=top_p, eos_id=70, pad_id=0, slots=3, chunk=4,
                                     attention=kind)
        stats: dict = {}
        out[kind] = continuous.generate(params, prompts, seeds, budgets, config=CFG, decode=decode, stats=stats)
        assert (stats["prefix_tokens"] > 0) == shared
    assert out["ragged"] == out["dense"]
    assert sum(map(len, out["dense"])) > 30


def test_decode_rows_logits_match_and_programs_differ(params):
    cache = model.init_cache(CFG, 3, 32)
    rng = np.random.default_rng(0)
    cache = model.KVCache(*(tuple(jnp.asarray(rng.standard_normal(x.shape), jnp.float32) for x in xs) for xs in cache))
    tok, length = jnp.asarray([5, 6, 7]), jnp.asarray([0, 9, 30])
    dense = jax.jit(model.decode_rows, static_argnames=("config", "attention"))
    a, ca = dense(params, tok, length, cache, CFG, attention="dense")
    b, cb = dense(params, tok, length, cache, CFG, attention="ragged")
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    for x, y in ((ca.k[0], cb.k[0]), (ca.v[0], cb.v[0])):  # the first layer's new keys and values alike
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(ca.k + ca.v, cb.k + cb.v):  # the next layers' from its output: within rounding
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)
    text = dense.lower(params, tok, length, cache, CFG, attention="ragged").as_text()
    assert ragged.TARGET in text and ragged.TARGET not in dense.lower(params, tok, length, cache, CFG).as_text()
    with pytest.raises(ValueError, match="decode attention"):
        with layers.decode_attention("sparse"):
            pass


def test_the_library_is_built_once_and_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv(ragged.CACHE_ENV, str(tmp_path / "k"))
    ragged.library.cache_clear()
    try:
        first = ragged.library()
        assert first.parent == tmp_path / "k" and first.suffix == ".so"
        assert [p.name for p in (tmp_path / "k").iterdir()] == [first.name]  # no temporary left
        mtime = first.stat().st_mtime_ns
        ragged.library.cache_clear()
        assert ragged.library() == first and first.stat().st_mtime_ns == mtime  # reused, not rebuilt
        # A compiler that fails: one line naming the option, and nothing left in the cache folder.
        bad = tmp_path / "cxx"
        bad.write_text("#!/bin/sh\necho 'cxx: error: out of disk' >&2\nexit 1\n")
        bad.chmod(bad.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("CXX", str(bad))
        monkeypatch.setenv(ragged.CACHE_ENV, str(tmp_path / "k2"))
        ragged.library.cache_clear()
        with pytest.raises(UserError, match=r"model.decode_attention: the ragged kernel did not compile.*out of disk"):
            ragged.library()
        assert list((tmp_path / "k2").iterdir()) == []
        monkeypatch.setenv("CXX", "no-such-compiler-here")
        ragged.library.cache_clear()
        with pytest.raises(UserError, match="no C\\+\\+ compiler was found"):
            ragged.library()
    finally:
        ragged.library.cache_clear()


def test_options_refuse_what_the_kernel_cannot_run():
    with pytest.raises(UserError, match="model.decode_attention: 'ragged' reads float32 caches"):
        resolve(ModelOptions.from_table({"decode_attention": "ragged", "dtype": "bfloat16"}))
    with pytest.raises(UserError, match="model.decode_attention: 'ragged' .* needs mp = 1"):
        resolve(ModelOptions.from_table({"decode_attention": "ragged", "mesh": {"dp": 1, "mp": 2}}))
    with pytest.raises(UserError, match="model.decode_attention"):
        ModelOptions.from_table({"decode_attention": "sparse"})
    assert resolve(ModelOptions.from_table({"decode_attention": "ragged"})).config.dtype == "float32"
