"""Training: schedules, masked loss, truncation, batching, gradient accumulation,
determinism, and a tiny model learning to reverse strings it never saw."""

from __future__ import annotations

import dataclasses

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from star_engine.errors import UserError
from star_haiku_xmap.model import network as model
from star_haiku_xmap.train import packing
from star_haiku_xmap.train import trainer as train
from star_haiku_xmap.sampling import static as sample
from star_haiku_xmap.model.config import PRESETS, GPTJConfig
from star_haiku_xmap.tokenizer import ByteTokenizer
from star_haiku_xmap.options import AdamW

CFG = GPTJConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64, vocab=264)
TOK = ByteTokenizer()


# ----------------------------------------------------------------------------- optimizer


def test_schedules_warmup_then_anneal():
    base = {"lr": 1.0, "warmup_steps": 10, "end_lr": 0.1}
    for kind in ("constant", "linear", "cosine"):
        s = AdamW(**base, schedule=kind).schedule_fn(total_steps=110)
        assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(0.5)
        assert float(s(10)) == pytest.approx(1.0)
    const = AdamW(**base, schedule="constant").schedule_fn(110)
    lin = AdamW(**base, schedule="linear").schedule_fn(110)
    cos = AdamW(**base, schedule="cosine").schedule_fn(110)
    assert float(const(100)) == pytest.approx(1.0)
    assert float(lin(60)) == pytest.approx(0.55) and float(lin(110)) == pytest.approx(0.1)
    assert float(cos(60)) == pytest.approx(0.55) and float(cos(110)) == pytest.approx(0.1)
    assert float(cos(30)) > float(lin(30))  # cosine stays high early


def test_the_optimizer_table_is_one_object_with_one_set_of_defaults():
    """One table (``options.AdamW``), one set of defaults: the paper's, whoever asks (the core
    loading an experiment, or a caller building a ``TrainConfig``); it builds its optimizer."""
    assert dataclasses.asdict(AdamW.from_table({})) == {
        "lr": 1e-6, "warmup_steps": 100, "schedule": "constant", "end_lr": 1e-6, "weight_decay": 0.0,
        "clip_norm": 1.0, "b1": 0.9, "b2": 0.999}
    assert AdamW.from_table({"lr": 1e-3}).end_lr == 1e-6
    same = AdamW(lr=1e-3)
    assert AdamW.from_table(same) is same  # an object is not checked twice
    for bad, message in (({"learning_rate": 1e-3}, "unknown key 'optimizer.learning_rate'; allowed in [optimizer]: lr,"),
                         ({"schedule": "step"}, "optimizer.schedule: must be one of constant, linear, cosine"),
                         ({"warmup_steps": 1.5}, "optimizer.warmup_steps: expected an integer"),
                         ({"b2": 1.0}, "optimizer.b2: must be in [0, 1)"),
                         ({"lr": 0.0}, "optimizer.lr: must be > 0"),
                         ({"clip_norm": float("nan")}, "optimizer.clip_norm: must be a finite number")):
        with pytest.raises(UserError, match=re.escape(message)):
            AdamW.from_table(bad)
    with pytest.raises(UserError, match="training.optimizer.b1"):
        AdamW.from_table({"b1": -0.1}, "training.optimizer")
    job = train.TrainConfig(steps=1, batch_size=1, grad_accum=1, seed=0, optimizer={"lr": 1e-3, "warmup_steps": 0},
                            seq_len=8, pad_id=0)
    assert job.optimizer == AdamW(lr=1e-3, warmup_steps=0)  # a hand-written table becomes the object, checked once
    tx = job.optimizer.build(10)
    state = tx.init({"w": jnp.ones((2, 2)), "b": jnp.ones(2)})
    grads = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    updates, _ = tx.update(grads, state, {"w": jnp.ones((2, 2)), "b": jnp.ones(2)})
    assert float(jnp.abs(updates["w"]).max()) > 0 and float(jnp.abs(updates["b"]).max()) > 0


# ----------------------------------------------------------------------------- loss / data


def _micro(batch, a=0):
    return {k: jnp.asarray(v[a]) for k, v in batch.items()}


def test_masked_loss_counts_completion_tokens_only():
    params = model.init_params(CFG, 0)
    e = train.encode_example(TOK, "Q: 12+3\nA:", " 15", seq_len=64)
    assert e.n_prompt == len("Q: 12+3\nA:") and list(e.ids[e.n_prompt:]) == TOK.encode(" 15") + [TOK.eos_id]
    b = packing.collate_padded([e], np.array([0]), grad_accum=1, batch_size=1, seq_len=64, pad_id=TOK.pad_id)
    mb = _micro(b)
    assert mb["tokens"].shape == (1, 16)
    total, n = train.token_loss(params, mb, CFG)
    logp = jax.nn.log_softmax(model.forward(params, mb["tokens"], CFG, mask=mb["segments"] > 0)[0], -1)
    ids = list(e.ids)
    want = -sum(float(logp[t - 1, ids[t]]) for t in range(e.n_prompt, len(ids)))
    assert int(n) == len(ids) - e.n_prompt == 4
    assert float(total) == pytest.approx(want, rel=1e-5)
    # Targets inside the prompt or the padding do not matter at all.
    again = float(train.token_loss(params, {**mb, "tokens": mb["tokens"].at[0, len(ids):].set(7)}, CFG)[0])
    assert again == pytest.approx(float(total), rel=1e-6)
    # loss = "all": every token after the first.
    b_all = packing.collate_padded([e], np.array([0]), grad_accum=1, batch_size=1, seq_len=64, pad_id=TOK.pad_id,
                                   loss="all")
    total_all, n_all = train.token_loss(params, _micro(b_all), CFG)
    assert int(n_all) == len(ids) - 1
    assert float(total_all) == pytest.approx(-sum(float(logp[t - 1, ids[t]]) for t in range(1, len(ids))), rel=1e-5)


def test_truncation_keeps_completion_and_rejects_what_cannot_fit():
    e = train.encode_example(TOK, "abcdefghij", "XYZ", seq_len=8)
    assert TOK.decode(e.ids) == "ghijXYZ" and e.n_prompt == 4 and len(e.ids) == 8  # + end-of-text
    with pytest.raises(ValueError, match="does not fit"):
        train.encode_example(TOK, "ab", "0123456789", seq_len=8)


def test_plan_is_seeded_and_bucketed():
    lengths = [5, 40, 7, 33, 9, 60, 6, 35] * 4
    a = train.plan_steps(lengths, steps=6, per_step=4, seed=1)
    b = train.plan_steps(lengths, steps=6, per_step=4, seed=1)
    c = train.plan_steps(lengths, steps=6, per_step=4, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == 6
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert sorted(np.concatenate(train.plan_steps(lengths, steps=8, per_step=4, seed=3))) == list(range(32))
    assert train.bucket_lengths(100) == [16, 32, 64, 100]
    # Sorting within a window groups lengths: most steps pad to a short bucket.
    enc = [train.Encoded(np.zeros(n, np.int32), 1) for n in lengths]
    Ts = [packing.collate_padded(enc, idx, grad_accum=1, batch_size=4, seq_len=64, pad_id=0)["tokens"].shape[2]
          for idx in train.plan_steps(lengths, steps=8, per_step=4, seed=0)]
    assert Ts.count(16) == 4 and Ts.count(64) == 4


def test_collate_pads_rows_for_data_parallelism():
    enc = [train.encode_example(TOK, "ab", "c", 16) for _ in range(3)]
    b = packing.collate_padded(enc, np.arange(3), grad_accum=1, batch_size=3, seq_len=16, pad_id=0, dp=2)
    assert b["tokens"].shape == (1, 4, 16) and not b["segments"][0, 3].any() and not b["weights"][0, 3].any()


def test_gradient_accumulation_is_a_per_token_mean_over_the_whole_step():
    params = model.init_params(CFG, 1)
    enc = [train.encode_example(TOK, "p" * (i + 1), "c" * (3 * i + 1), 32) for i in range(4)]
    tx = AdamW.from_table({"lr": 1e-3, "warmup_steps": 0}).build(1)
    out = {}
    for A, B in ((1, 4), (2, 2)):  # micro-batches of 7 and 19 loss tokens
        batch = packing.collate_padded(enc, np.arange(4), grad_accum=A, batch_size=B, seq_len=32, pad_id=0)
        state = train.init_state(jax.tree.map(jnp.copy, params), tx)
        _, m = train.make_update(CFG, tx)(state, batch)
        out[A] = (float(m["loss"]), float(m["grad_norm"]), float(m["tokens"]))
    assert out[1][2] == out[2][2] == 2 + 5 + 8 + 11
    assert out[2][0] == pytest.approx(out[1][0], rel=1e-5)
    assert out[2][1] == pytest.approx(out[1][1], rel=1e-4)


def test_training_is_bit_identical_and_leaves_inputs_alone():
    params = model.init_params(CFG, 2)
    enc = [train.encode_example(TOK, f"{i}+{i}=", str(2 * i), 32) for i in range(20)]
    kw = dict(steps=3, batch_size=4, grad_accum=2, seed=5, optimizer={"lr": 1e-3, "warmup_steps": 0, "weight_decay": 0.1},
              seq_len=32, pad_id=TOK.pad_id)
    p1, l1, n1 = train.train(params, CFG, enc, train.TrainConfig(**kw))
    p2, l2, n2 = train.train(params, CFG, enc, train.TrainConfig(**kw))  # `params` must still be usable (not donated)
    assert l1 == l2 and n1 == n2 and len(l1) == 3
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)))
    assert not np.array_equal(p1["lm_head"]["w"], params["lm_head"]["w"])


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_the_learning_rate_as_the_steps_argument_trains_the_same_bits_with_one_program(schedule):
    """``train`` feeds the step its learning rate (``step_lr.py``): the weights equal those of
    the schedule computed inside the step, bit for bit, and stages of different lengths lower
    to one program (the schedule's length is no longer in it)."""
    params = model.init_params(CFG, 3)
    enc = [train.encode_example(TOK, f"{i}+{i}=", str(2 * i), 32) for i in range(24)]
    opt = {"lr": 1e-3, "warmup_steps": 3, "schedule": schedule, "end_lr": 1e-4, "weight_decay": 0.1}
    job = train.TrainConfig(steps=9, batch_size=4, grad_accum=1, seed=1, optimizer=opt, seq_len=32, pad_id=TOK.pad_id)
    got, losses, _ = train.train(params, CFG, enc, job)
    tx = job.optimizer.build(job.steps)  # the schedule inside the step, as before
    state = train.init_state(jax.tree.map(jnp.copy, params), tx)
    inside = train.make_update(CFG, tx)
    batches = list(train.packing_batches(enc, steps=9, batch_size=4, grad_accum=1, seed=1, seq_len=32,
                                         pad_id=TOK.pad_id, config=CFG))
    state, metrics, _ = train.run_steps(inside, state, batches)
    assert losses == [float(m) for m in metrics]
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(state.params)))

    def program(steps):
        lr = train.StepLr(job.optimizer.schedule_fn(steps))
        tx = job.optimizer.build(steps, learning_rate=lr)
        update = train.make_update(CFG, tx, step_lr=lr)
        s = train.init_state(jax.tree.map(jnp.copy, params), tx)
        return update.lower(s, batches[0], lr.value_at(s.step)).as_text()

    assert program(9) == program(50)
    assert inside.lower(train.init_state(params, tx), batches[0]).as_text() != \
        train.make_update(CFG, job.optimizer.build(50)).lower(train.init_state(params, tx), batches[0]).as_text()


def test_one_train_takes_the_optimizer_state_options_without_a_mesh():
    """``train`` is the one entry point: bf16 optimizer state works on one device
    too (close to fp32), and ZeRO-1, which splits over a mesh's dp axis, asks for one."""
    enc = [train.encode_example(TOK, f"{i}+{i}=", str(2 * i), 32) for i in range(20)]
    kw = dict(steps=3, batch_size=4, grad_accum=1, seed=5, optimizer={"lr": 1e-3, "warmup_steps": 0}, seq_len=32, pad_id=TOK.pad_id)
    _, l32, _ = train.train(model.init_params(CFG, 2), CFG, enc, train.TrainConfig(**kw))
    _, l16, _ = train.train(model.init_params(CFG, 2), CFG, enc, train.TrainConfig(opt_state_dtype="bfloat16", **kw))
    assert l16[0] == l32[0] and l16 != l32 and np.allclose(l16, l32, rtol=1e-2)
    _, lmix, _ = train.train(model.init_params(CFG, 2), CFG, enc, train.TrainConfig(opt_state_dtype="mixed", **kw))
    assert lmix[0] == l32[0] and np.allclose(lmix, l32, rtol=1e-2)
    with pytest.raises(ValueError, match="needs a mesh"):
        train.train(model.init_params(CFG, 2), CFG, enc, train.TrainConfig(zero=1, **kw))


def test_tiny_model_learns_to_reverse_unseen_strings():
    cfg = PRESETS["tiny"].replace(n_ctx=32)
    words = ["".join(w) for w in itertools.product("abcdefgh", repeat=3)]
    np.random.default_rng(0).shuffle(words)
    held_out, seen = words[:24], words[24:]
    enc = [train.encode_example(TOK, w + ">", w[::-1], 32) for w in seen]
    params, losses, n_tokens = train.train(model.init_params(cfg, 0), cfg, enc, train.TrainConfig(
        steps=200, batch_size=32, grad_accum=1, seed=0, seq_len=32, pad_id=TOK.pad_id,
        optimizer={"lr": 3e-3, "warmup_steps": 20, "schedule": "cosine", "end_lr": 3e-4}))
    assert n_tokens == 200 * 32 * 4
    assert np.mean(losses[-10:]) < 0.02 * np.mean(losses[:5])
    tokens, mask = sample.left_pad([TOK.encode(w + ">") for w in held_out], TOK.pad_id)
    out = sample.generate(params, tokens, mask, sample.keys_from_seeds([0] * 24), 0.0, 1.0, config=cfg,
                          max_new_tokens=6, eos_id=TOK.eos_id, valid_vocab=TOK.vocab_size)
    got = [TOK.decode(sample.trim(row, TOK.eos_id)) for row in np.asarray(out)]
    assert sum(g == w[::-1] for g, w in zip(got, held_out)) >= 22, list(zip(held_out, got))


def test_bfloat16_training_keeps_fp32_masters_and_moments():
    cfg = CFG.replace(dtype="bfloat16")
    enc = [train.encode_example(TOK, "ab", "cd", 16) for _ in range(4)]
    kw = dict(steps=2, batch_size=2, grad_accum=1, seed=0, optimizer={"lr": 1e-3, "warmup_steps": 0}, seq_len=16, pad_id=TOK.pad_id)
    params, losses, _ = train.train(model.init_params(cfg, 0), cfg, enc, train.TrainConfig(**kw))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))  # the master weights
    assert np.isfinite(losses).all() and losses[1] < losses[0]
    tx = AdamW.from_table({"lr": 1e-3, "warmup_steps": 0}).build(1)
    moments = [x for x in jax.tree.leaves(train.init_state(params, tx).opt_state) if x.ndim > 0]
    assert moments and all(x.dtype == jnp.float32 for x in moments)
    p16, losses16, _ = train.train(model.init_params(cfg, 0), cfg, enc, train.TrainConfig(master_dtype="bfloat16", **kw))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))  # bf16 weights, rounded every step
    assert losses16[0] == losses[0]
    with pytest.raises(ValueError, match="master_dtype"):
        train.train(model.init_params(CFG, 0), CFG, enc, train.TrainConfig(master_dtype="bfloat16", **kw))


def test_bf16_compute_applies_updates_of_1e_6_as_fp32_does():
    """lr 1e-6 (the paper's): a bf16 weight of 0.02 has a spacing of ~1.2e-4, so
    storing the weights in bf16 would round almost every update away. With fp32
    master weights, 20 steps under bf16 compute move every matrix as far as the fp32
    model moves it (Adam's steps are ~lr whatever the gradient's rounding)."""
    enc = [train.encode_example(TOK, f"{i} + {i} =", f" {2 * i}.", 32) for i in range(40)]
    kw = dict(steps=20, batch_size=4, grad_accum=2, seed=0, seq_len=32, pad_id=TOK.pad_id,
              optimizer={"lr": 1e-6, "warmup_steps": 0, "clip_norm": 1.0})
    moved = {}
    for dtype in ("float32", "bfloat16"):
        cfg = CFG.replace(dtype=dtype)
        p0 = jax.tree.map(lambda x: x.astype(model.dtype_of(cfg)), model.init_params(CFG, 3))  # noqa: B023
        p_n, _, _ = train.train(p0, cfg, enc, train.TrainConfig(**kw))
        moved[dtype] = {f"{m}/{k}": float(np.linalg.norm(np.asarray(p_n[m][k], np.float32)
                                                          - np.asarray(p0[m][k], np.float32))
                                          / np.linalg.norm(np.asarray(p0[m][k], np.float32)))
                        for m in p0 for k in p0[m] if p0[m][k].ndim == 2}
    for leaf, ref in moved["float32"].items():
        assert ref > 1e-5, (leaf, ref)  # the fp32 model does move
        assert moved["bfloat16"][leaf] == pytest.approx(ref, rel=0.05), (leaf, moved["bfloat16"][leaf], ref)


def test_remat_keeps_block_inputs_only_and_gives_the_same_gradients():
    import contextlib
    import io

    params = model.init_params(CFG, 4)
    enc = [train.encode_example(TOK, "ab" * i, "cd" * i, 32) for i in range(1, 5)]
    mb = _micro(packing.collate_padded(enc, np.arange(4), grad_accum=1, batch_size=4, seq_len=32, pad_id=0))
    grads, saved = {}, {}
    for remat in (False, True):
        f = lambda p: train.token_loss(p, mb, CFG, remat)[0]  # noqa: B023, E731
        grads[remat] = jax.grad(f)(params)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            jax.ad_checkpoint.print_saved_residuals(f, params)
        saved[remat] = [x for x in out.getvalue().splitlines() if " output of " in x]  # activations
    for a, b in zip(jax.tree.leaves(grads[False]), jax.tree.leaves(grads[True])):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
    # without remat every block keeps dozens of activations; with it, its input (4 x 32 x d_model) and little else
    blocks = [x for x in saved[True] if x.startswith(f"f32[{4 * 32},{CFG.d_model}]")]
    assert len(saved[False]) > 10 * CFG.n_layer and len(blocks) == CFG.n_layer
    assert len(saved[True]) <= CFG.n_layer + 6

