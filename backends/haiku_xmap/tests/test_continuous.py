"""Continuous batching (continuous.py): the same tokens as the static path for
greedy and sampled rows, whatever the slot or batch mates; refills, stop checks
between chunks, one prefill for k samples of a prompt; sharded == unsharded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from star_haiku_xmap.model import network as model
from star_haiku_xmap.sampling import continuous, static as sample
from star_haiku_xmap.model.config import GPTJConfig

CFG = GPTJConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=96, vocab=72)
EOS = 70
PAD = 0


LENGTHS = (3, 40, 1, 17, 9, 25, 30, 12, 33, 2, 21, 6, 38, 14)


def _requests(lengths=LENGTHS):
    """Prompts of 1-40 tokens (several length buckets) with budgets of 1-28 new
    tokens, in no particular order; requests 5-7 and 11-12 repeat a prompt (k
    samples of one question, each with its own seed)."""
    rng = np.random.default_rng(7)
    prompts = [list(map(int, rng.integers(1, 64, n))) for n in lengths]
    prompts[6] = prompts[7] = prompts[5]
    prompts[12] = prompts[11]
    budgets = [5, 28, 1, 12, 27, 3, 20, 8, 14, 25, 2, 16, 9, 22]
    return prompts, list(range(100, 100 + len(prompts))), budgets


@pytest.fixture(scope="module")
def params():
    p = model.init_params(CFG, 0)
    p["lm_head"]["w"] = p["lm_head"]["w"] * 4  # sharpen: greedy choices are not near-ties
    p["lm_head"]["b"] = p["lm_head"]["b"].at[EOS].set(2.5)  # some rows end early with end-of-text
    return p


def _run(fn, params, temperature, top_p, slots=4, **kw):
    prompts, seeds, budgets = kw.pop("requests", _requests())
    decode = sample.DecodeConfig(temperature=temperature, top_p=top_p, eos_id=EOS, pad_id=PAD, slots=slots,
                                 **{k: kw.pop(k) for k in ("chunk", "refill", "share_prefix") if k in kw})
    return fn(params, prompts, seeds, budgets, config=CFG, decode=decode, **kw)


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 0.8)])
def test_continuous_equals_static_and_rows_alone(params, temperature, top_p):
    stats = {}
    cont = _run(continuous.generate, params, temperature, top_p, chunk=4, stats=stats)
    static = _run(sample.generate_batches, params, temperature, top_p)
    assert cont == static
    _, _, budgets = _requests()
    lengths = [len(t) for t in cont]
    assert any(n < b for n, b in zip(lengths, budgets)), "no row ended with end-of-text"
    assert sum(n == b for n, b in zip(lengths, budgets)) >= 3, "no row ran to its budget"
    assert stats["chunks"] > 3 and stats["prefill_calls"] > 2, stats  # 14 requests through 4 slots
    if temperature:  # the k samples of a prompt differ: each slot has its own key
        assert len({tuple(cont[i]) for i in (5, 6, 7)}) > 1


def test_slot_count_and_chunk_length_do_not_change_the_tokens(params):
    # Other slots, other batch mates, other refill times: the same tokens.
    a = _run(continuous.generate, params, 1.0, 0.8, slots=4, chunk=4)
    b = _run(continuous.generate, params, 1.0, 0.8, slots=2, chunk=5, refill=1)
    assert a == b


def test_slots_are_refilled_so_decoding_takes_fewer_steps_than_static_batches(params):
    # End-of-text never matches (-1): every row makes exactly its budget of tokens.
    prompts = [[5 + i, 9, 11 + i] for i in range(12)]
    budgets = [2, 30, 3, 29, 2, 30, 4, 28, 2, 30, 3, 29]
    seeds = list(range(12))
    stats = {}
    out = continuous.generate(params, prompts, seeds, budgets, config=CFG,
        decode=sample.DecodeConfig(temperature=0.0, top_p=1.0, eos_id=-1, pad_id=PAD, slots=4, chunk=8, refill=1), stats=stats)
    assert [len(t) for t in out] == budgets
    # Static batches of 4 (all prompts are 3 tokens long) each run to their longest row: 3 x 30 steps.
    static_steps = sum(max(budgets[s:s + 4]) for s in range(0, 12, 4))
    assert stats["decode_steps"] <= 0.75 * static_steps, (stats, static_steps)
    assert stats["decode_steps"] >= -(-sum(budgets) // 4)  # no fewer than the slots can emit
    assert stats["prefill_calls"] >= 3  # the first fill, then refills as rows end
    same = sample.generate_batches(params, prompts, seeds, budgets, config=CFG,
        decode=sample.DecodeConfig(temperature=0.0, top_p=1.0, eos_id=-1, pad_id=PAD, slots=4))
    assert out == same


def test_stop_checks_between_chunks_free_the_slot(params):
    prompts, seeds, budgets = _requests()
    budgets = [28] * len(prompts)
    plain = {}
    full = _run(continuous.generate, params, 1.0, 0.8, requests=(prompts, seeds, budgets), chunk=4, stats=plain)
    # A token that ends rows at many different steps (and is missing from some rows).
    firsts = lambda v: {row.index(v) for row in full if v in row}
    stop_token = max((v for v in range(CFG.vocab) if sum(v in row for row in full) < len(full)),
                     key=lambda v: len(firsts(v)))
    assert len(firsts(stop_token)) >= 4
    stopped = {}
    calls = []

    def stop(i, ids):
        calls.append(i)
        return stop_token in ids

    out = _run(continuous.generate, params, 1.0, 0.8, requests=(prompts, seeds, budgets), chunk=4, stop=stop,
               stats=stopped)
    cut = lambda row: row[:row.index(stop_token)] if stop_token in row else row
    assert [cut(r) for r in out] == [cut(r) for r in full]
    for row, whole in zip(out, full):
        if stop_token in whole:  # ended within the chunk after the stop token, not at end-of-text or budget
            assert len(row) - row.index(stop_token) <= 4 and whole[:len(row)] == row
    assert stopped["decode_steps"] < plain["decode_steps"]
    assert len(calls) > len(prompts)  # checked after every chunk, not once at the end


def test_k_samples_of_a_prompt_share_one_prefill(params):
    prompts = [[3, 4, 5, 6]] * 3 + [[7, 8, 9]] * 3 + [[10, 11]] * 2
    seeds = list(range(8))
    budgets = [6] * 8
    stats = {}
    out = continuous.generate(params, prompts, seeds, budgets, config=CFG,
        decode=sample.DecodeConfig(temperature=1.0, top_p=0.9, eos_id=-1, pad_id=PAD, slots=8), stats=stats)
    assert stats["prefill_calls"] == 1 and stats["prefill_rows"] == 4  # 3 distinct prompts, bucketed to 4 rows
    same = sample.generate_batches(params, prompts, seeds, budgets, config=CFG,
        decode=sample.DecodeConfig(temperature=1.0, top_p=0.9, eos_id=-1, pad_id=PAD, slots=8))
    assert out == same
    assert len({tuple(t) for t in out[:3]}) > 1


def _prefixed(shared=70, own=(1, 12, 3, 7, 9, 2, 5, 11, 4, 6), budget=12):
    """Prompts that start with the same ``shared`` tokens (a few-shot prompt), then
    1-12 tokens of their own; two repeat a prompt (k samples)."""
    rng = np.random.default_rng(3)
    head = list(map(int, rng.integers(1, 64, shared)))
    prompts = [head + list(map(int, rng.integers(1, 64, n))) for n in own]
    prompts[4] = prompts[3]
    budgets = [min(budget, CFG.n_ctx - len(p)) for p in prompts]
    return prompts, list(range(200, 200 + len(prompts))), budgets


def test_shared_prefix_length():
    head = list(range(1, 101))
    assert continuous.shared_prefix([head + [7], head + [8, 9]]) == 96  # 100 shared, cut to 32s
    assert continuous.shared_prefix([head[:70] + [7], head[:70] + [8]]) == 64
    assert continuous.shared_prefix([head[:63] + [7], head[:63] + [8]]) == 0  # under the minimum
    assert continuous.shared_prefix([head + [7]]) == 0  # one prompt: nothing to share
    # Each prompt keeps one token of its own (its first logits): a prompt that is all prefix caps it.
    assert continuous.shared_prefix([head[:65], head[:65] + [1]]) == 64
    assert continuous.shared_prefix([head[:64], head[:64] + [1]]) == 0
    assert continuous.shared_prefix([head + [7], head + [8]], grain=10, minimum=10) == 100


def test_prefill_after_a_prefix_equals_a_whole_prefill(params):
    prompts, _, _ = _prefixed()
    tokens, mask = sample.left_pad(prompts, PAD)
    whole, _, _ = model.prefill(params, tokens, mask, CFG, tokens.shape[1])
    kv = continuous._prefix_cache(params, prompts[0][:64], CFG, None)
    own, own_mask = sample.left_pad([p[64:] for p in prompts], PAD)
    after, _ = model.prefill_after(params, kv, own, own_mask, CFG)
    np.testing.assert_allclose(np.asarray(after), np.asarray(whole), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 0.8)])
def test_a_shared_prefix_is_prefilled_once_and_changes_no_token(params, temperature, top_p):
    requests = _prefixed()
    shared, alone = {}, {}
    a = _run(continuous.generate, params, temperature, top_p, requests=requests, chunk=4, stats=shared)
    b = _run(continuous.generate, params, temperature, top_p, requests=requests, chunk=4, stats=alone,
             share_prefix=False)
    assert a == b
    assert shared["prefix_tokens"] == 64 and alone["prefix_tokens"] == 0
    # The same tokens whatever the slots and batch mates (the prefix is the call's, not the batch's).
    assert _run(continuous.generate, params, temperature, top_p, requests=requests, slots=2, chunk=5, refill=1) == a


def test_bad_requests_are_rejected(params):
    with pytest.raises(ValueError, match="request 1"):
        continuous.generate(params, [[1], []], [0, 1], [2, 2], config=CFG,
        decode=sample.DecodeConfig(temperature=0.0, top_p=1.0, eos_id=EOS, pad_id=PAD))
    with pytest.raises(ValueError, match="n_ctx=96"):
        continuous.generate(params, [[1] * 90], [0], [7], config=CFG,
        decode=sample.DecodeConfig(temperature=0.0, top_p=1.0, eos_id=EOS, pad_id=PAD))
    assert continuous.generate(params, [[1, 2]], [0], [0], config=CFG,
        decode=sample.DecodeConfig(temperature=0.0, top_p=1.0, eos_id=EOS, pad_id=PAD)) == [[]]


def test_buckets():
    assert continuous.length_buckets(100) == [16, 24, 32, 48, 64, 96, 100]
    assert [continuous.count_bucket(n, 2) for n in (1, 2, 3, 5, 8)] == [2, 2, 4, 8, 8]
    assert continuous.count_bucket(3, 3) == 6
    assert continuous.prefill_sizes(32, 2) == [8, 16, 32]
    assert continuous.prefill_sizes(48, 4) == [12, 24, 48]
    assert continuous.prefill_sizes(8, 1) == [2, 4, 8]
    assert continuous.prefill_sizes(2, 2) == [2]
    for m, d in ((64, 2), (6, 2), (1, 1), (16, 8)):
        sizes = continuous.prefill_sizes(m, d)
        assert sizes[-1] == m and all(r % d == 0 for r in sizes) and sizes == sorted(set(sizes))


def test_a_refill_runs_in_the_fewest_prefill_rows_that_hold_it(params):
    # 40 slots, refills of 4: prefill calls of 2, 4 or 8 rows. The first 40 prompts fill the slots
    # in 5 calls of 8; the 20 whose rows end after 2 tokens are replaced in calls of 8, 8 and 4 (not
    # 8, 8, 8), the 4 that end after 5 in one call of 4 (not 8): 64 rows for 64 prompts, and the
    # tokens are those of static batches.
    prompts = [[5 + i % 50, 9, 11 + i % 7] for i in range(64)]
    budgets = [2] * 20 + [5] * 4 + [12] * 40
    seeds = list(range(64))
    stats = {}
    decode = sample.DecodeConfig(temperature=0.0, top_p=1.0, eos_id=-1, pad_id=PAD, slots=40, chunk=2, refill=4)
    out = continuous.generate(params, prompts, seeds, budgets, config=CFG, decode=decode, stats=stats)
    assert [len(t) for t in out] == budgets
    assert out == sample.generate_batches(params, prompts, seeds, budgets, config=CFG, decode=decode)
    assert stats["prefill_rows"] == 64 and stats["prefill_calls"] == 9, stats


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 0.8)])
def test_the_tail_is_compacted_into_fewer_slots_and_no_token_changes(params, temperature, top_p):
    """Once no prompt waits, the live rows move into fewer slots (8 -> 4 -> 2 -> 1): the
    tokens are those of the static path, and a row that ends exactly at its budget in
    the chunk before a compaction keeps all its tokens."""
    prompts, seeds, budgets = _requests()
    budgets = [28, 4, 8, 20, 1, 12, 16, 24, 28, 4, 8, 12, 16, 20]  # multiples of the chunk: rows end at its end
    stats = {}
    cont = _run(continuous.generate, params, temperature, top_p, slots=8, chunk=4,
                requests=(prompts, seeds, budgets), stats=stats)
    assert cont == _run(sample.generate_batches, params, temperature, top_p, requests=(prompts, seeds, budgets))
    assert stats["compactions"] >= 2 and stats["slots"] == 8, stats
    assert sum(len(t) == b for t, b in zip(cont, budgets)) >= 3


_SHARDED = r"""
import json, sys
import jax, numpy as np
sys.path.insert(0, sys.argv[1])
import test_continuous as t
from star_haiku_xmap import sharding
from star_haiku_xmap.sampling import continuous
assert jax.device_count() == 8
params = t.model.init_params(t.CFG, 0)
params["lm_head"]["w"] = params["lm_head"]["w"] * 4
params["lm_head"]["b"] = params["lm_head"]["b"].at[t.EOS].set(2.5)
cpu0 = jax.devices()[0]
# Prompts of 2-16 tokens (one prefill bucket: fewer compiles), budgets of 1-28; then
# prompts sharing a 64-token prefix (prefilled once).
settings = [(0.0, 1.0, t._requests([2, 16, 1, 9, 5, 13, 4, 16, 11, 3, 8, 6, 15, 7])),
            (1.0, 0.8, t._requests([2, 16, 1, 9, 5, 13, 4, 16, 11, 3, 8, 6, 15, 7])),
            (1.0, 0.8, t._prefixed())]
ref = [t._run(continuous.generate, jax.device_put(params, cpu0), T, p, requests=r) for T, p, r in settings]
out = {}
for dp, mp in (map(int, m.split("x")) for m in sys.argv[2].split(",")):
    mesh = sharding.make_mesh({"dp": dp, "mp": mp})
    p = sharding.shard_tree(params, mesh)
    out[f"{dp}x{mp}"] = [t._run(continuous.generate, p, T, tp, mesh=mesh, slots=8, chunk=4, requests=r) == want
                         for (T, tp, r), want in zip(settings, ref)]
print("RESULT " + json.dumps(out))
"""


# both axes on one mesh in the default run; the 1-axis meshes in the slow step
@pytest.mark.parametrize("meshes", ["2x4", pytest.param("1x8,8x1", marks=pytest.mark.slow)])
def test_sharded_equals_unsharded_on_8_devices(meshes):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SHARDED, os.path.dirname(__file__), meshes], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
    assert result == {m: [True, True, True] for m in meshes.split(",")}, result
