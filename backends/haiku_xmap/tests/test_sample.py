"""Sampling: greedy == repeated full forward, seeds, batch-mate and padding
independence, top-p, end-of-text and padded-vocabulary handling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from star_haiku_xmap.model import network as model
from star_haiku_xmap.sampling import static as sample
from star_haiku_xmap.model.config import GPTJConfig

CFG = GPTJConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64, vocab=72)
EOS = 70
N = 10
PROMPTS = [[5, 9, 2], [1, 2, 3, 4, 5, 6, 7, 8, 9], [33], [40, 41, 42, 43, 44, 45]]


@pytest.fixture(scope="module")
def params():
    p = model.init_params(CFG, 0)
    # Sharpen the random model so greedy choices are not near-ties.
    p["lm_head"]["w"] = p["lm_head"]["w"] * 4
    p["lm_head"]["b"] = p["lm_head"]["b"].at[EOS].set(-50.0)  # keep rows running to N tokens
    return p


def _gen(params, prompts, seeds, temperature=0.0, top_p=1.0, length=None, valid_vocab=None):
    tokens, mask = sample.left_pad(prompts, pad_id=0, length=length)
    out = sample.generate(params, tokens, mask, sample.keys_from_seeds(seeds), temperature, top_p, config=CFG,
                          max_new_tokens=N, eos_id=EOS, valid_vocab=valid_vocab)
    return np.asarray(out)


def test_greedy_equals_argmax_of_repeated_full_forward(params):
    out = _gen(params, PROMPTS, [0] * 4)
    assert out.shape == (4, N)
    for row, prompt in zip(out, PROMPTS):
        seq = list(prompt)
        for _ in range(N):
            seq.append(int(jnp.argmax(model.forward(params, jnp.asarray([seq]), CFG)[0, -1])))
        assert list(row) == seq[len(prompt):]
    assert len({tuple(r) for r in out}) > 1  # not a degenerate constant model
    np.testing.assert_array_equal(out, _gen(params, PROMPTS, [1, 2, 3, 4]))  # greedy ignores seeds


def test_greedy_padding_invariance(params):
    alone = _gen(params, [PROMPTS[2]], [0])
    in_batch = _gen(params, [PROMPTS[1], PROMPTS[2], PROMPTS[3]], [0, 0, 0], length=16)
    np.testing.assert_array_equal(alone[0], in_batch[1])


def test_seeds_decide_sampled_rows_alone(params):
    a = _gen(params, PROMPTS, [11, 12, 13, 14], temperature=1.0, top_p=0.95)
    b = _gen(params, PROMPTS, [11, 12, 13, 14], temperature=1.0, top_p=0.95)
    np.testing.assert_array_equal(a, b)
    c = _gen(params, PROMPTS, [21, 22, 23, 24], temperature=1.0, top_p=0.95)
    assert not np.array_equal(a, c)
    # Row 2 with seed 13 gives the same text alone, with other batch mates, other padding.
    alone = _gen(params, [PROMPTS[2]], [13], temperature=1.0, top_p=0.95)
    mates = _gen(params, [PROMPTS[3], PROMPTS[2]], [99, 13], temperature=1.0, top_p=0.95, length=20)
    np.testing.assert_array_equal(alone[0], a[2])
    np.testing.assert_array_equal(mates[1], a[2])


def test_tiny_top_p_is_greedy(params):
    np.testing.assert_array_equal(_gen(params, PROMPTS, [5, 6, 7, 8], temperature=1.0, top_p=1e-6),
                                  _gen(params, PROMPTS, [0] * 4))


def test_top_p_keeps_the_nucleus_with_renormalised_probabilities():
    logits = jnp.log(jnp.array([0.15, 0.5, 0.05, 0.3]))
    B = 4000
    keys = sample.keys_from_seeds(range(B))
    toks = np.asarray(sample.sample_logits(jnp.tile(logits, (B, 1)), keys, 0, 1.0, 0.7))
    assert set(toks.tolist()) == {1, 3}  # 0.5 + 0.3 reaches 0.7; 0.15 and 0.05 are cut
    assert abs(np.mean(toks == 1) - 0.5 / 0.8) < 0.03
    toks = np.asarray(sample.sample_logits(jnp.tile(logits, (B, 1)), keys, 0, 1.0, 1.0))
    assert abs(np.mean(toks == 2) - 0.05) < 0.015
    # Temperature sharpens before the nucleus is taken (HF order).
    toks = np.asarray(sample.sample_logits(jnp.tile(logits, (B, 1)), keys, 0, 0.25, 0.9))
    assert set(toks.tolist()) == {1, 3} and np.mean(toks == 1) > 0.85


def test_top_p_one_keeps_every_token_without_the_nucleus_sort():
    """top_p = 1 draws from the whole tempered distribution, as HF (no TopPLogitsWarper then):
    the same tokens as a categorical draw over every scaled logit with the row's folded key,
    including the tail that the nucleus's fp32 cumulative sum could round away."""
    logits_BV = jax.random.normal(jax.random.PRNGKey(0), (64, 5000)) * 4.0
    keys = sample.keys_from_seeds(range(64))
    toks = np.asarray(sample.sample_logits(logits_BV, keys, 3, 0.7, 1.0))
    rows = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, 3)
    want = np.asarray(jax.vmap(jax.random.categorical)(rows, logits_BV / 0.7))
    np.testing.assert_array_equal(toks, want)
    # A top_p just under 1 still takes the nucleus path (a traced value: one program for both).
    cut = np.asarray(sample.sample_logits(logits_BV, keys, 3, 0.7, 0.5))
    assert not np.array_equal(cut, toks)


def test_end_of_text_fills_the_rest(params):
    p = dict(params)
    p["lm_head"] = {"w": params["lm_head"]["w"], "b": params["lm_head"]["b"].at[EOS].set(0.0)}
    out = _gen(p, PROMPTS, [1, 2, 3, 4], temperature=1.5)
    for row in out:
        hits = np.flatnonzero(row == EOS)
        if hits.size:
            assert (row[hits[0]:] == EOS).all()
    p["lm_head"] = {"w": params["lm_head"]["w"], "b": params["lm_head"]["b"].at[EOS].set(100.0)}
    assert (_gen(p, PROMPTS, [0] * 4) == EOS).all()
    assert sample.trim([3, 4, EOS, 5], EOS) == [3, 4]


def test_padded_vocabulary_rows_are_never_produced(params):
    p = dict(params)
    p["lm_head"] = {"w": params["lm_head"]["w"], "b": params["lm_head"]["b"].at[71].set(100.0)}
    assert (_gen(p, PROMPTS, [0] * 4) == 71).all()
    masked = _gen(p, PROMPTS, [0] * 4, valid_vocab=71)
    assert (masked < 71).all()
    assert (_gen(p, PROMPTS, [3] * 4, temperature=1.0, valid_vocab=71) < 71).all()


def test_keys_and_left_pad_helpers():
    keys = sample.keys_from_seeds([0, 1, 2**32, -1, 2**40 + 7])
    data = np.asarray(jax.random.key_data(keys)).reshape(5, -1)
    assert len({tuple(r) for r in data}) == 5
    tokens, mask = sample.left_pad([[1, 2], [3]], pad_id=9, length=4)
    np.testing.assert_array_equal(tokens, [[9, 9, 1, 2], [9, 9, 9, 3]])
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1], [0, 0, 0, 1]])
    with pytest.raises(ValueError):
        sample.left_pad([[1, 2, 3]], pad_id=0, length=2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_first_argmax_is_jnp_argmax(dtype):
    """Greedy decoding's argmax (two plain reductions) picks what ``jnp.argmax`` picks: the first
    of tied maxima, the first NaN of a row that has one (before or after an inf), the first of
    an all -inf or all-equal row."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 300)).astype(np.float32)
    x[:10] = np.round(x[:10])  # many ties
    x[10, [5, 7]] = 9
    x[11, :] = -np.inf
    x[12, [10, 20]] = np.nan
    x[13, [3, 100]] = np.inf
    x[14, :] = 0.0
    x[15, [50, 60]] = [np.inf, np.nan]
    x[16, [50, 60]] = [np.nan, np.inf]
    x[17, -1] = 50
    arr = jnp.asarray(x, dtype)
    got = np.asarray(jax.jit(sample.first_argmax)(arr))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(arr, axis=-1)))
    assert list(got[[10, 12, 15, 16, 17]]) == [5, 10, 60, 50, 299]
