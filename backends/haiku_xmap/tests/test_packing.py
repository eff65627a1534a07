"""Packed training (``packing = "segments"``): the packed step is the padded step
without the padding (same loss and gradients), no example sees another, positions
restart per example, the plan packs tightly into a few shapes; the original's
stream packing; which tokens carry loss."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from star_haiku_xmap.options import AdamW

from star_haiku_xmap.model import network as model
from star_haiku_xmap.train import packing
from star_haiku_xmap.train import packplan
from star_haiku_xmap.train import trainer as train
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.tokenizer import ByteTokenizer

CFG = GPTJConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=128, vocab=264)
TOK = ByteTokenizer()
DIMS = train.dims(CFG)


def _examples(n: int, seed: int, longest: int = 60) -> list[packing.Encoded]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p, c = int(rng.integers(1, longest // 2)), int(rng.integers(1, longest // 2))
        out.append(train.encode_example(TOK, "".join(rng.choice(list("abcdefgh"), p)),
                                        "".join(rng.choice(list("0123456789"), c)), 128))
    return out


def _step_grads(params, batch, cfg=CFG):
    """(per-token mean loss, its gradient) over all micro-batches of a step, as the update computes them."""
    def total(p, batch):
        sums, counts = zip(*(train.token_loss(p, {k: v[a] for k, v in batch.items()}, cfg)
                             for a in range(batch["tokens"].shape[0])))
        return sum(sums) / sum(counts)
    return jax.jit(jax.value_and_grad(total))(params, batch)


@pytest.mark.parametrize("grad_accum,batch_size", [(1, 12), (3, 4)])
def test_packed_step_equals_padded_step(grad_accum, batch_size):
    params = model.init_params(CFG, 0)
    enc = _examples(12, seed=grad_accum)
    step = packplan.plan_packed([len(e.ids) for e in enc], steps=1, batch_size=batch_size, grad_accum=grad_accum,
                                seed=0, seq_len=128, dp=1, dims=DIMS)[0]
    padded = packing.collate_padded(enc, step.idx, grad_accum=grad_accum, batch_size=batch_size, seq_len=128,
                                    pad_id=TOK.pad_id)
    packed = packing.collate_packed(enc, step, grad_accum=grad_accum, pad_id=TOK.pad_id)
    assert packed["segments"].max() >= 2  # several examples do share rows
    assert packed["tokens"].size < padded["tokens"].size
    assert packed["weights"].sum() == padded["weights"].sum()
    loss_a, g_a = _step_grads(params, padded)
    loss_b, g_b = _step_grads(params, packed)
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_a), jax.tree.leaves(g_b)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6 * float(np.abs(a).max()),
                                   err_msg=jax.tree_util.keystr(path))
    # The jit'd update (scan over micro-batches, clipping, AdamW): the same step.
    tx = AdamW.from_table({"lr": 1e-3, "warmup_steps": 0}).build(1)
    update = train.make_update(CFG, tx)
    s_a, m_a = update(train.init_state(jax.tree.map(jnp.copy, params), tx), padded)
    s_b, m_b = update(train.init_state(jax.tree.map(jnp.copy, params), tx), packed)
    np.testing.assert_allclose(float(m_b["loss"]), float(m_a["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m_b["grad_norm"]), float(m_a["grad_norm"]), rtol=1e-5)
    assert float(m_a["tokens"]) == float(m_b["tokens"])


def test_training_packed_is_deterministic_and_learns():
    params = model.init_params(CFG, 1)
    enc = _examples(24, seed=5)
    kw = dict(steps=4, batch_size=4, grad_accum=2, seed=3, optimizer={"lr": 3e-3, "warmup_steps": 0}, seq_len=128, pad_id=0)
    p_seg, l_seg, n_seg = train.train(params, CFG, enc, train.TrainConfig(packing="segments", **kw))
    p_again, l_again, n_again = train.train(params, CFG, enc, train.TrainConfig(packing="segments", **kw))
    assert l_seg == l_again and n_seg == n_again and l_seg[-1] < l_seg[0]
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p_seg), jax.tree.leaves(p_again)))
    # 6 steps of 8 = two epochs of seeded permutations: every example exactly twice
    plan = packplan.plan_packed([len(e.ids) for e in enc], steps=6, batch_size=4, grad_accum=2, seed=3,
                                seq_len=128, dp=1, dims=DIMS)
    assert np.bincount(np.concatenate([s.idx for s in plan]), minlength=24).tolist() == [2] * 24


def _row(exs: list[packing.Encoded]) -> dict[str, np.ndarray]:
    """One row holding ``exs`` in order (the packer's own layout)."""
    T = sum(len(e.ids) for e in exs) + 5
    b = packing.empty_batch(1, 1, T, TOK.pad_id)
    offset = 0
    for s, e in enumerate(exs):
        packing._place(b, 0, 0, offset, s + 1, e, "completion")
        offset += len(e.ids)
    return {k: jnp.asarray(v[0]) for k, v in b.items()}


def _logits(params, row):
    return np.asarray(model.forward(params, row["tokens"], CFG, positions_BT=row["positions"],
                                    segments=row["segments"]))


def test_no_example_attends_to_another():
    params = model.init_params(CFG, 2)
    a, b, c = _examples(3, seed=7)
    row = _row([a, b, c])
    seg = np.asarray(row["segments"][0])
    base = _logits(params, row)
    # Change every token of the middle example: the other two see nothing of it.
    tokens = np.asarray(row["tokens"]).copy()
    tokens[0, seg == 2] = (tokens[0, seg == 2] + 17) % 256
    other = _logits(params, {**row, "tokens": jnp.asarray(tokens)})
    for s in (1, 3):
        np.testing.assert_allclose(other[0, seg == s], base[0, seg == s], rtol=0, atol=1e-6)
    assert np.abs(other[0, seg == 2] - base[0, seg == 2]).max() > 1e-2  # ... while its own logits change
    # and the loss of each example is its own
    one = {k: v for k, v in _row([a]).items()}
    la, _ = train.token_loss(params, one, CFG)
    w = np.asarray(row["weights"][0]) & (seg == 1)
    lr, _ = train.token_loss(params, {**row, "weights": jnp.asarray(w[None])}, CFG)
    np.testing.assert_allclose(float(lr), float(la), rtol=1e-5)


def test_positions_restart_per_example():
    params = model.init_params(CFG, 3)
    a, b = _examples(2, seed=9)
    row = _row([a, b])
    seg = np.asarray(row["segments"][0])
    assert list(np.asarray(row["positions"][0, seg == 2])) == list(range(len(b.ids)))
    alone = _logits(params, _row([b]))[0, :len(b.ids)]
    np.testing.assert_allclose(_logits(params, row)[0, seg == 2], alone, rtol=1e-5, atol=1e-5)
    # A plain causal mask over the row would not give that.
    plain = np.asarray(model.forward(params, row["tokens"], CFG, positions_BT=row["positions"],
                                     mask=row["segments"] > 0))
    assert np.abs(plain[0, seg == 2] - alone).max() > 1e-3


@pytest.mark.parametrize("dp", [1, 2])
@pytest.mark.parametrize("grad_accum,batch_size", [(1, 16), (2, 8), (4, 1)])
def test_plan_packs_tightly_into_few_shapes(dp, grad_accum, batch_size):
    enc = _examples(200, seed=11, longest=120)
    lengths = [len(e.ids) for e in enc]
    seq_len = 256
    plan = packplan.plan_packed(lengths, steps=40, batch_size=batch_size, grad_accum=grad_accum, seed=4,
                                seq_len=seq_len, dp=dp, dims=DIMS)
    again = packplan.plan_packed(lengths, steps=40, batch_size=batch_size, grad_accum=grad_accum, seed=4,
                                 seq_len=seq_len, dp=dp, dims=DIMS)
    assert [(s.idx.tolist(), s.R, s.T, s.rows) for s in plan] == [(s.idx.tolist(), s.R, s.T, s.rows) for s in again]
    shapes = {(s.R, s.T) for s in plan}
    assert len(shapes) <= packplan.MAX_SHAPES
    for step, batch in zip(plan, packing.step_batches(enc, steps=40, batch_size=batch_size, grad_accum=grad_accum,
                                                      seed=4, seq_len=seq_len, pad_id=0, dp=dp, dims=DIMS)):
        A, R, T = batch["tokens"].shape
        assert (A, R, T) == (grad_accum, step.R, step.T) and R % dp == 0 and T in packplan.row_lengths(seq_len)
        assert R <= -(-batch_size // dp) * dp  # never more rows than one example per row
        seg = batch["segments"]
        # every example of the step appears exactly once, whole, in one row
        pieces = sorted(int((seg[a, r] == s).sum()) for a in range(A) for r in range(R)
                        for s in range(1, seg[a, r].max() + 1))
        assert len(step.idx) == batch_size * grad_accum and pieces == sorted(lengths[i] for i in step.idx)
        # Tight: no two rows could have been merged into one (first fit's guarantee).
        fill = sorted(int(x) for x in (seg > 0).sum(axis=2).ravel() if x)
        assert len(fill) < 2 or fill[0] + fill[1] > T
    # the steps of a window hold its spread of lengths, so their token counts are close
    totals = [sum(lengths[i] for i in s.idx) for s in plan]
    padded = [sum(lengths[i] for i in idx) for idx in packplan.plan_steps(lengths, steps=40, seed=4,
                                                                            per_step=batch_size * grad_accum)]
    assert np.std(totals) < np.std(padded)


def test_shapes_are_few_and_each_pays_for_its_compile():
    dims = (4, 128, 512, 264)
    T = packplan.row_lengths(512)
    need = np.zeros((100, len(T)), np.int64)  # rows each step needs at T = 256 and 512 (no other T fits)
    need[:50, T.index(256)], need[:50, T.index(512)] = 16, 8
    need[50:, T.index(256)], need[50:, T.index(512)] = 8, 4
    # every step fits (16, 256), the cheapest single shape; (8, 256) then halves the work of half the steps
    assert packplan.choose_shapes(need, T, 1, dims) == [(16, 256), (8, 256)]
    # a shape that would save less than its compile is not added
    few = need[48:52]
    assert len(packplan.choose_shapes(few, T, 1, dims)) == 1
    assert packplan.row_lengths(512)[:3] == [16, 32, 64] and packplan.row_lengths(100) == [16, 32, 64, 100]
    assert packplan.first_fit_decreasing([5, 3, 7, 2, 4], 8) == [[2], [0, 1], [4, 3]]
    with pytest.raises(ValueError, match="does not fit"):
        packplan.first_fit_decreasing([9], 8)


# ----------------------------------------------------------------------------- stream


def _original_tfrecord_order(docs: list[list[int]], seq: int) -> list[list[int]]:
    """create_finetune_tfrecords.py (ezelikman/STaR@6ffd3c4) on already-tokenised
    documents: random.seed(10), shuffle the documents, arrays_to_sequences,
    chunk_and_finalize (drop the trailing sequence, shuffle the rest)."""
    random.seed(10)
    docs = list(docs)
    random.shuffle(docs)
    accum, seqs = [], []
    for d in docs:
        accum.extend(d)
        if len(accum) > seq:
            chunks = [accum[i:i + seq] for i in range(0, len(accum), seq)]
            seqs.extend(chunks[:-1])
            accum = chunks[-1]
    if accum:
        seqs.append(accum)
    full = seqs[:-1]
    random.shuffle(full)
    return full


def test_stream_reproduces_the_original_chunks():
    enc = _examples(60, seed=13)
    for seq_len in (63, 64, 100):
        chunks, flags = packing.stream_chunks(enc, seq_len, "completion")
        want = _original_tfrecord_order([list(e.ids) for e in enc], seq_len + 1)
        assert [list(c) for c in chunks] == want
        # completion flags follow the tokens they belong to
        total = sum(len(e.ids) for e in enc)
        assert len(chunks) == (total - 1) // (seq_len + 1) and flags.shape == chunks.shape
        assert 0 < flags.mean() < 1
    assert packing.stream_chunks(enc, 63, "all")[1].all()


def test_stream_steps_cycle_as_the_original_loader():
    enc = _examples(60, seed=13)
    chunks, flags = packing.stream_chunks(enc, 63, "all")
    n = len(chunks)
    steps = list(packing.step_batches(enc, steps=2 * (n // 4) + 1, batch_size=2, grad_accum=2, seed=0, seq_len=63,
                                      pad_id=0, packing="stream", loss="all"))
    first = np.concatenate([b["tokens"].reshape(4, 63) for b in steps[:n // 4]])
    np.testing.assert_array_equal(first, chunks[:n // 4 * 4, :-1])  # in order, remainder of the pass dropped
    for a, b in zip(steps, steps[n // 4:]):  # the next pass repeats the same order
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
    b = steps[0]
    assert b["tokens"].shape == (2, 2, 63)
    np.testing.assert_array_equal(b["targets"][0, 1], chunks[1, 1:])
    assert b["weights"].all() and (b["segments"] == 1).all()  # plain causal: one segment per chunk
    np.testing.assert_array_equal(b["positions"][1, 0], np.arange(63))
    with pytest.raises(ValueError, match="stream packing needs more than"):
        packing.step_batches(enc[:1], steps=1, batch_size=1, grad_accum=1, seed=0, seq_len=63, pad_id=0,
                             packing="stream")


def test_stream_examples_see_earlier_examples_and_train():
    """In a chunk, later examples attend to earlier ones (as the original); training
    on the stream lowers the loss; completion loss counts completion targets only."""
    enc = _examples(40, seed=17)
    kw = dict(steps=6, batch_size=2, grad_accum=2, seed=0, optimizer={"lr": 3e-3, "warmup_steps": 0}, seq_len=63, pad_id=0,
              packing="stream")
    _, losses, n_all = train.train(model.init_params(CFG, 0), CFG, enc, train.TrainConfig(loss="all", **kw))
    _, _, n_comp = train.train(model.init_params(CFG, 0), CFG, enc, train.TrainConfig(loss="completion", **kw))
    assert losses[-1] < losses[0] and n_comp < n_all == 6 * 4 * 63
    b = next(iter(packing.step_batches(enc, steps=1, batch_size=1, grad_accum=1, seed=0, seq_len=63, pad_id=0,
                                       packing="stream")))
    row = {k: jnp.asarray(v[0]) for k, v in b.items()}
    params = model.init_params(CFG, 0)
    full = _logits(params, row)
    tokens = np.asarray(row["tokens"]).copy()
    tokens[0, :5] = (tokens[0, :5] + 1) % 256
    assert np.abs(_logits(params, {**row, "tokens": jnp.asarray(tokens)})[0, -1] - full[0, -1]).max() > 1e-4
