"""The backend's training options end to end: packing / loss from the TrainSpec,
fp32 master weights in the fine-tuned checkpoint (and a continued run starting from
exactly them), per-layer rematerialisation, and the errors a user can make."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from star_engine.api import GenRequest, GenSpec, TrainExample, TrainSpec
from star_engine.errors import UserError
from star_haiku_xmap import plugin
from star_haiku_xmap.checkpoint.format import load_checkpoint, read_manifest

SMALL = dict(preset="tiny", n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64,
             seq_len=48)
EXAMPLES = [TrainExample(f"Q: {a}+{b}\nA:", f" {a + b}\n") for a in range(6) for b in range(4)]
SPEC = TrainSpec(steps=4, batch_size=4, grad_accum=2, seed=1, optimizer={"lr": 1e-3, "warmup_steps": 0})


def _leaves(path):
    params, _ = load_checkpoint(path)
    return {f"{m}/{k}": np.asarray(v) for m, leaves in params.items() for k, v in leaves.items()}


def test_bf16_checkpoint_stores_fp32_masters_and_continues_from_them(tmp_path):
    backend = plugin.HaikuXmapBackend.from_table(**SMALL, dtype="bfloat16")
    base = backend.base(tmp_path, seed=0)
    res = backend.train(base, tmp_path / "it1", EXAMPLES, SPEC)
    m = read_manifest(res.checkpoint)
    assert m["model_config"]["dtype"] == "float32" and m["extra"]["compute_dtype"] == "bfloat16"
    assert (m["extra"]["packing"], m["extra"]["loss"]) == ("segments", "completion")
    first = _leaves(res.checkpoint)
    assert all(v.dtype == np.float32 for v in first.values())
    # the fp32 weights are not bf16 values: the small updates are in them
    q = first["h_0/attn/q/w"]
    assert (q != q.astype(jax.numpy.bfloat16).astype(np.float32)).mean() > 0.5
    # generation runs in the compute dtype
    out = backend.generate(res.checkpoint, [GenRequest("Q: 1+1\nA:", 0)],
                           GenSpec(max_new_tokens=4, temperature=0.0, top_p=1.0, stop=(), batch_size=1))
    assert len(out) == 1 and backend.weights.cached_dtype == "bfloat16"
    # restart_from_base = false: the next fine-tune starts from exactly those fp32 weights
    again = backend.train(res.checkpoint, tmp_path / "it2", EXAMPLES, dataclasses.replace(SPEC, steps=0))
    for k, v in _leaves(again.checkpoint).items():
        np.testing.assert_array_equal(v, first[k], err_msg=k)


@pytest.mark.slow
def test_bf16_accumulator_trains_the_same_steps(tmp_path):
    plain = plugin.HaikuXmapBackend.from_table(**SMALL)
    base = plain.base(tmp_path, seed=0)
    ref = plain.train(base, tmp_path / "plain", EXAMPLES, SPEC)
    acc16 = plugin.HaikuXmapBackend.from_table(**SMALL, grad_accum_dtype="bfloat16", remat=True)
    np.testing.assert_allclose(acc16.train(base, tmp_path / "acc16", EXAMPLES, SPEC).losses, ref.losses, rtol=2e-2)
    assert acc16.describe()["grad_accum_dtype"] == "bfloat16" and acc16.describe()["remat"] is True


def test_packing_and_loss_reach_the_step(tmp_path):
    backend = plugin.HaikuXmapBackend.from_table(**SMALL)
    base = backend.base(tmp_path, seed=0)
    one = dataclasses.replace(SPEC, steps=1)
    n = {loss: backend.train(base, tmp_path / loss, EXAMPLES, dataclasses.replace(one, loss=loss)).tokens
         for loss in ("completion", "all")}
    assert 0 < n["completion"] < n["all"]
    stream = backend.train(base, tmp_path / "stream", EXAMPLES * 4,
                           dataclasses.replace(one, packing="stream", loss="all", batch_size=1))
    assert stream.tokens == 2 * 1 * 48  # grad_accum x batch x seq_len targets
    assert read_manifest(stream.checkpoint)["extra"]["packing"] == "stream"


def test_training_mistakes_are_user_errors(tmp_path):
    backend = plugin.HaikuXmapBackend.from_table(**SMALL)
    base = backend.base(tmp_path, seed=0)
    # packing and loss are among what the core guarantees of a TrainSpec (star_engine.config.settings
    # declares them); what depends on the examples is the backend's:
    with pytest.raises(UserError, match="training.packing: stream packing needs more than seq_len"):
        backend.train(base, tmp_path / "x", EXAMPLES[:2], dataclasses.replace(SPEC, packing="stream"))
    assert not (tmp_path / "x").exists()
    with pytest.raises(UserError, match="model.master_dtype"):
        plugin.HaikuXmapBackend.from_table(**SMALL, master_dtype="bfloat16")  # under float32 compute
    with pytest.raises(UserError, match="model.master_dtype"):
        plugin.HaikuXmapBackend.from_table(**SMALL, master_dtype="float16")
    with pytest.raises(UserError, match="model.grad_accum_dtype"):
        plugin.HaikuXmapBackend.from_table(**SMALL, grad_accum_dtype="int8")
    with pytest.raises(UserError, match="model.remat"):
        plugin.HaikuXmapBackend.from_table(**SMALL, remat="yes")


def test_typed_optimizer_and_adapter_objects_are_taken_as_tables_are():
    # The core may hand the backend's own declared objects (``optimizer_table``, ``adapter_tables``)
    # instead of tables: an AdamW is used as it is, a table becomes the same AdamW; a LoraOptions
    # is checked against the model as its table is, with the same keys.
    from star_haiku_xmap.model import lora
    from star_haiku_xmap.model.lora_options import LoraOptions
    from star_haiku_xmap.options import AdamW

    backend = plugin.HaikuXmapBackend.from_table(**SMALL)
    adamw = AdamW(lr=1e-3, warmup_steps=0)
    assert backend.train_config(dataclasses.replace(SPEC, optimizer=adamw)).optimizer is adamw
    assert backend.train_config(SPEC).optimizer == adamw
    assert backend.adapter_tables == {"lora": LoraOptions} and backend.adapter_kinds == ("lora",)
    table = {"kind": "lora", "rank": 4, "targets": ["q_proj", "v_proj"]}
    typed = LoraOptions.from_table(table, "training.adapter")
    assert LoraOptions.from_table(typed) is typed
    assert lora.check_table(typed, backend.config, "k") == lora.check_table(table, backend.config, "k")
    with pytest.raises(UserError, match=r"training\.adapter\.targets: 'q_porj' is not a projection"):
        lora.adapter_spec(LoraOptions(kind="lora", targets=("q_porj",)), backend.config, "training.adapter")
    with pytest.raises(UserError, match=r"training\.adapter\.rank: must be >= 1"):
        LoraOptions.from_table({"kind": "lora", "rank": 0}, "training.adapter")
