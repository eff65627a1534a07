"""Verifiers (``preference.py``): the DPO loss and its gradient against a hand computation,
``score`` against hand-summed log-probabilities (end-of-text included, whatever the batch
size and padding), a DPO stage that separates chosen from rejected, leaves its init alone
and is deterministic, its LoRA form, a killed stage resuming bit-identical, and the
``verifier`` keys of the refusals."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from star_engine.api import PreferencePair, PreferenceSpec, TrainExample, TrainSpec
from star_engine.errors import UserError
from star_haiku_xmap import plugin
from star_haiku_xmap.model import network as model
from star_haiku_xmap.train import preference
from star_haiku_xmap.train import resume
from star_haiku_xmap.checkpoint.format import load_checkpoint, read_manifest
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.tokenizer import ByteTokenizer
from star_testkit import Killed, killer

CFG = GPTJConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64, vocab=264)
TOK = ByteTokenizer()
SMALL = dict(preset="tiny", n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64,
             seq_len=48)
PAIRS = [PreferencePair(f"Q: {i} + {i}\nA:", f" {2 * i}\n", f" {2 * i + 1}\n") for i in range(8)]
SPEC = PreferenceSpec(steps=6, batch_size=2, grad_accum=2, seed=5, optimizer={"lr": 1e-3, "warmup_steps": 0},
                      beta=0.5)
ADAPTER = {"kind": "lora", "rank": 4, "alpha": 8}


def hand_logp(params, cfg, prompt: str, completion: str) -> tuple[float, int]:
    """(log p(completion + end-of-text | prompt) summed in float64 from the model's logits of
    the whole unpadded sequence, number of terms)."""
    p, c = TOK.encode(prompt), TOK.encode(completion) + [TOK.eos_id]
    ids = np.asarray(p + c, np.int32)
    logits = np.asarray(model.forward(params, ids[None], cfg)[0], np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    terms = [logp[t - 1, ids[t]] for t in range(len(p), len(ids))]
    return float(sum(terms)), len(terms)


def _arrays(path) -> dict[str, np.ndarray]:
    tree, _ = load_checkpoint(path)
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def _implicit_margins(b, verifier, init, pairs, beta) -> np.ndarray:
    """beta * [(log p(c) - log p_ref(c)) - (log p(r) - log p_ref(r))] per pair, from ``score``."""
    ex = [TrainExample(q.prompt, x) for q in pairs for x in (q.chosen, q.rejected)]
    d = (np.asarray(b.score(verifier, ex, 4)) - np.asarray(b.score(init, ex, 4))).reshape(-1, 2)
    return beta * (d[:, 0] - d[:, 1])


# ----------------------------------------------------------------------------- the loss


def test_dpo_loss_and_gradient_match_the_closed_form():
    policy, ref = model.init_params(CFG, 0), model.init_params(CFG, 1)
    pairs, beta = PAIRS[:3], 0.7
    seqs = preference.encode_pairs(TOK, pairs, 32)
    hand = np.asarray([hand_logp(params, CFG, q.prompt, x)[0] for params in (policy, ref)
                       for q in pairs for x in (q.chosen, q.rejected)]).reshape(2, -1)
    ref_N = preference.sequence_logps(ref, seqs, rows=4, max_len=32, pad_id=TOK.pad_id, config=CFG)
    np.testing.assert_allclose(ref_N, hand[1], rtol=1e-5, atol=1e-4)
    # One step of 3 pairs in micro-batches of 2 (the second padded with an empty pair).
    (batch,) = preference.dpo_batches(seqs, ref_N, [np.arange(3)], batch_size=2, grad_accum=2, max_len=32,
                                      pad_id=TOK.pad_id)
    assert batch["tokens"].shape[:2] == (2, 4) and batch["ref"].shape == (2, 4, 1)
    assert not batch["weights"][1, 2:].any()
    z = beta * ((hand[0, 0::2] - hand[1, 0::2]) - (hand[0, 1::2] - hand[1, 1::2]))
    want = float(np.mean(np.log1p(np.exp(-z))))  # -log sigmoid(z)
    mbs = [{k: jnp.asarray(v[a]) for k, v in batch.items()} for a in range(2)]
    obj = lambda p, mb: preference.dpo_objective(p, mb, CFG, beta=beta)  # noqa: E731
    sums = [obj(policy, mb) for mb in mbs]
    assert [float(n) for _, n in sums] == [2.0, 1.0]
    assert sum(float(s) for s, _ in sums) / 3 == pytest.approx(want, rel=1e-5)
    # dL/dlog p(c) = -beta sigma(-z) / N, dL/dlog p(r) = +beta sigma(-z) / N.
    logp_B = jnp.asarray(hand[0], jnp.float32)
    g = jax.grad(lambda lp: preference.dpo_loss(lp, jnp.asarray(hand[1], jnp.float32), jnp.ones(3), beta)[0] / 3)(
        logp_B)
    s = 1.0 / (1.0 + np.exp(z))
    np.testing.assert_allclose(np.asarray(g), np.stack([-beta * s / 3, beta * s / 3], 1).reshape(-1), rtol=1e-5)
    # The parameter gradient is the chain rule through each sequence's log-probability ...
    mb = mbs[0]
    grad = jax.grad(lambda p: obj(p, mb)[0])(policy)
    logp2 = np.asarray(preference.seq_logp(policy, mb, CFG))[:4]
    z2 = beta * ((logp2[0::2] - ref_N[0:4:2]) - (logp2[1::2] - ref_N[1:4:2]))
    coef = np.stack([-beta / (1 + np.exp(z2)), beta / (1 + np.exp(z2))], 1).reshape(-1)
    # sum_b (dL/dlog p_b) d log p_b / dparams, the closed-form coefficients fixed
    chain = jax.grad(lambda p: jnp.dot(jnp.asarray(coef, jnp.float32), preference.seq_logp(p, mb, CFG)[:4]))(policy)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(chain)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4 * np.abs(b).max())  # sums that cancel
    # ... and a finite difference of the whole loss along the gradient agrees.
    norm2 = sum(float(jnp.sum(x * x)) for x in jax.tree.leaves(grad))
    eps = 1e-3 / math.sqrt(norm2)
    move = lambda sign: jax.tree.map(lambda p, d: p + sign * eps * d, policy, grad)  # noqa: E731
    fd = (float(obj(move(1), mb)[0]) - float(obj(move(-1), mb)[0])) / (2 * eps)
    assert fd == pytest.approx(norm2, rel=2e-2)


def test_pair_plan_is_seeded_and_cycles_one_permutation():
    a = preference.pair_plan(5, steps=4, per_step=3, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, preference.pair_plan(5, steps=4, per_step=3, seed=2)))
    flat = np.concatenate(a)
    assert sorted(flat[:5]) == list(range(5)) and np.array_equal(flat[5:10], flat[:5])
    assert not np.array_equal(flat, np.concatenate(preference.pair_plan(5, steps=4, per_step=3, seed=3)))


# ----------------------------------------------------------------------------- score


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    root = tmp_path_factory.mktemp("verifier")
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_minutes=0)
    base = b.base(root, seed=0)
    before = _arrays(base)
    res = b.train_preferences(base, root / "verifier", PAIRS, SPEC)
    return b, root, base, before, res


def test_score_is_the_hand_summed_log_probability(stage):
    b, _, base, _, _ = stage
    params = b.load_params(base)
    long_prompt = "".join(f"Q{i};" for i in range(40))  # 160 bytes: keeps its end
    examples = [TrainExample("Q: 1 + 1\nA:", " 2\n"), TrainExample("ab", "c"),
                TrainExample("Q: 12 + 30\nA:", " 42 because 12 and 30 make 42\n"), TrainExample(long_prompt, " 7")]
    calls: list = []
    got = b.score(base, examples, 2, progress=calls.append)
    assert sum(calls) == 4
    for ex, g in zip(examples[:3], got):
        want, n = hand_logp(params, b.config, ex.prompt, ex.completion)
        assert n == len(TOK.encode(ex.completion)) + 1  # end-of-text included
        assert g == pytest.approx(want, rel=1e-5, abs=1e-4)
    n_ctx = b.config.n_ctx  # n_ctx input tokens: the prompt's last n_ctx - 2 bytes, " 7", end-of-text
    assert got[3] == pytest.approx(hand_logp(params, b.config, long_prompt[-(n_ctx - 2):], " 7")[0], rel=1e-5, abs=1e-4)
    # Whatever the batch size, padding and company.
    for size in (1, 3, 8):
        np.testing.assert_allclose(b.score(base, examples, size), got, rtol=1e-5, atol=1e-5)
    alone = b.score(base, examples[1:2], 1)[0]
    assert alone == pytest.approx(got[1], rel=1e-5, abs=1e-5)
    assert b.score(base, [], 4) == []


# ----------------------------------------------------------------------------- DPO stage


def test_dpo_stage_separates_chosen_from_rejected(stage):
    b, root, base, before, res = stage
    assert res.steps == SPEC.steps and len(res.losses) == SPEC.steps
    # Step 1: the policy is the reference, z = 0, loss log 2 (the policy's log-probabilities are
    # the reference's, computed by score's path).
    assert res.losses[0] == pytest.approx(math.log(2), abs=1e-5)
    assert res.losses[-1] < res.losses[0]
    plan = preference.pair_plan(len(PAIRS), steps=SPEC.steps, per_step=4, seed=SPEC.seed)
    assert res.tokens == sum(len(TOK.encode(x)) + 1 for i in np.concatenate(plan)
                          for x in (PAIRS[i].chosen, PAIRS[i].rejected))
    margins = _implicit_margins(b, res.checkpoint, base, PAIRS, SPEC.beta)  # 0 at the start
    assert (margins > 1.0).all()
    m = read_manifest(res.checkpoint)["extra"]
    assert m["kind"] == "verifier" and m["stage"] == "verifier" and m["init"] == b.checkpoint_id(base)
    assert (m["beta"], m["steps"], m["seed"], m["pairs"]) == (0.5, 6, 5, 8)
    after = _arrays(base)  # the init (the reference) untouched
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    # Same inputs, same checkpoint; another seed, another.
    b2 = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_minutes=0)
    again = b2.train_preferences(base, root / "again", PAIRS, SPEC)
    assert again.checkpoint_id == res.checkpoint_id and again.losses == res.losses
    other = b2.train_preferences(base, root / "other", PAIRS, dataclasses.replace(SPEC, seed=6))
    assert other.checkpoint_id != res.checkpoint_id


def test_lora_verifier_trains_and_stores_the_adapters_alone(stage):
    _, root, base, _, _ = stage
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_minutes=0)
    spec = dataclasses.replace(SPEC, adapter=ADAPTER, optimizer={"lr": 3e-3, "warmup_steps": 0})
    res = b.train_preferences(base, root / "lora", PAIRS, spec)
    m = read_manifest(res.checkpoint)
    assert m["extra"]["kind"] == "lora" and m["extra"]["stage"] == "verifier"
    assert m["extra"]["base"] == m["extra"]["init"] == b.checkpoint_id(base)
    assert {leaf["path"][1] for leaf in m["leaves"]} == {"lora_a", "lora_b"}
    assert res.losses[0] == pytest.approx(math.log(2), abs=1e-5)
    assert all(x > y for x, y in zip(res.losses, res.losses[1:]))
    assert (_implicit_margins(b, res.checkpoint, base, PAIRS, SPEC.beta) > 0.2).all()
    # A verifier over a LoRA init: its reference is the merged init.
    over = b.train_preferences(res.checkpoint, root / "lora2", PAIRS[:4],
                               dataclasses.replace(spec, steps=2))
    assert over.losses[0] == pytest.approx(math.log(2), abs=1e-5)
    assert read_manifest(over.checkpoint)["extra"]["base"] == res.checkpoint_id
    assert len(b.score(over.checkpoint, [TrainExample("Q:", " 1")], 1)) == 1


def test_killed_stage_resumes_bit_identical(stage, tmp_path):
    _, _, base, _, ref = stage
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_steps=2, train_checkpoint_minutes=0)
    out = tmp_path / "verifier"
    with pytest.raises(Killed):
        b.train_preferences(base, out, PAIRS, SPEC, progress=killer(3, []))
    snap = resume.snapshot_dir(out)
    assert read_manifest(snap)["extra"]["step"] == 2 and not out.exists()
    # Another beta or other pairs never resume this snapshot (deleted, started over).
    key = read_manifest(snap)["extra"]["key"]
    assert key["objective"] == {"kind": "dpo", "beta": 0.5}
    calls: list = []
    res = b.train_preferences(base, out, PAIRS, SPEC, progress=calls.append)
    assert calls[0] == 2 and sum(calls) == SPEC.steps
    assert res.checkpoint_id == ref.checkpoint_id and res.losses == ref.losses and res.tokens == ref.tokens
    for pairs, spec in ((PAIRS, dataclasses.replace(SPEC, beta=0.25)), (PAIRS[:7], SPEC)):
        out = tmp_path / f"v{len(pairs)}"
        with pytest.raises(Killed):
            b.train_preferences(base, out, PAIRS, SPEC, progress=killer(3, []))
        calls = []
        b.train_preferences(base, out, pairs, spec, progress=calls.append)
        assert calls[0] == 1  # from step 0


# ----------------------------------------------------------------------------- refusals


def test_refusals_name_the_verifier_keys(tmp_path):
    b = plugin.HaikuXmapBackend.from_table(**SMALL)
    base = b.base(tmp_path, seed=0)
    with pytest.raises(UserError, match="verifier: 6 steps requested but there are no preference pairs") as e:
        b.train_preferences(base, tmp_path / "v", [], SPEC)
    assert e.value.key == "verifier"
    with pytest.raises(UserError, match="verifier: pair 1: its rejected completion of 61 tokens") as e:
        b.train_preferences(base, tmp_path / "v", [PAIRS[0], PreferencePair("Q", "a", "x" * 60)], SPEC)
    assert e.value.key == "verifier"
    with pytest.raises(UserError, match="verifier.optimizer.lr: must be > 0"):
        b.train_preferences(base, tmp_path / "v", PAIRS, dataclasses.replace(SPEC, optimizer={"lr": -1.0}))
    with pytest.raises(UserError, match="verifier.adapter.rank"):
        b.train_preferences(base, tmp_path / "v", PAIRS, dataclasses.replace(SPEC, adapter={"kind": "lora",
                                                                                               "rank": 0}))
    with pytest.raises(UserError, match="verifier: scored example 0") as e:
        b.score(base, [TrainExample("Q", "y" * 70)], 2)
    assert e.value.key == "verifier" and not (tmp_path / "v").exists()
    # The core's verifier TrainSpec, checked by validate_run under its own key.
    ok = TrainSpec(0, 8, 1, 0, {}, packing="none", adapter=ADAPTER)
    b.validate_run({}, {"verifier": ok})
    for adapter, message in [({**ADAPTER, "rank": 1000}, "verifier.adapter.rank: 1000 is above"),
                             ({**ADAPTER, "targets": ["q"]}, "verifier.adapter.targets: 'q' is not"),
                             ({**ADAPTER, "ranks": 2}, "unknown key 'verifier.adapter.ranks'")]:
        with pytest.raises(UserError, match=message):
            b.validate_run({}, {"verifier": dataclasses.replace(ok, adapter=adapter)})


# ----------------------------------------------------------------------------- mesh


_MESH_SCRIPT = r"""
import json, tempfile
from pathlib import Path
import numpy as np
from star_engine.api import PreferencePair, PreferenceSpec, TrainExample
from star_haiku_xmap import plugin
small = dict(preset="tiny", n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64, seq_len=48,
             train_checkpoint_minutes=0)
pairs = [PreferencePair(f"Q: {i} + {i}\nA:", f" {2 * i}\n", f" {2 * i + 1}\n") for i in range(8)]
spec = PreferenceSpec(steps=3, batch_size=3, grad_accum=2, seed=5, optimizer={"lr": 1e-3, "warmup_steps": 0},
                      beta=0.5)
examples = [TrainExample(p.prompt, c) for p in pairs for c in (p.chosen, p.rejected)]
root, got = Path(tempfile.mkdtemp()), {}
for name, layout in (("one", {"mesh": {"dp": 4, "mp": 1}}), ("zero", {"mesh": {"dp": 2, "mp": 2}, "zero": 1})):
    b = plugin.HaikuXmapBackend.from_table(**small, **layout)
    base = b.base(root / name, seed=0)
    res = b.train_preferences(base, root / name / "v", pairs, spec)
    got[name] = (np.array(res.losses), np.array(b.score(res.checkpoint, examples, 3)), res.tokens)
(l1, s1, t1), (l2, s2, t2) = got["one"], got["zero"]
print("RESULT " + json.dumps({"losses": float(np.abs(l1 - l2).max()), "scores": float(np.abs(s1 - s2).max()),
                             "tokens": t1 == t2}))
"""


def test_dpo_on_a_2x2_mesh_with_zero1_matches_dp4(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert got["losses"] < 1e-5 and got["scores"] < 1e-4 and got["tokens"], got
