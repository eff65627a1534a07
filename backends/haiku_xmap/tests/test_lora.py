"""LoRA adapters (``lora.py``, ``lora_stage.py``): fresh adapters are the identity, a
step trains the adapters alone, the merged model computes what the unmerged one does,
a LoRA checkpoint holds its adapters and its base's id and loads over no other base,
and a killed LoRA stage resumes bit-identical; every architecture the backend runs."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from star_engine.api import GenRequest, GenSpec, TrainExample, TrainSpec
from star_engine.errors import UserError
from star_haiku_xmap import plugin
from star_haiku_xmap.model import lora
from star_haiku_xmap.model import network as model
from star_haiku_xmap.train import resume
from star_haiku_xmap.train import trainer as train
from star_haiku_xmap.model.config import preset
from star_haiku_xmap.checkpoint.format import read_manifest
from star_haiku_xmap.tokenizer import ByteTokenizer
from star_testkit import Killed, killer
from star_haiku_xmap.options import AdamW

TOK = ByteTokenizer()
CONFIGS = {  # GPT-J, Llama, Qwen2 (q/k/v biases, tied embeddings), Mistral (sliding window)
    "gptj": preset("tiny", n_layer=2, n_ctx=64),
    "llama": preset("llama-tiny", n_ctx=64),
    "qwen2": preset("llama-tiny", n_ctx=64, qkv_bias=True, tie_embeddings=True),
    "mistral": preset("llama-tiny", n_ctx=64, sliding_window=8),
}
TOKENS = np.random.default_rng(0).integers(0, 256, (2, 24)).astype(np.int32)
ENC = [train.encode_example(TOK, f"{i}+{i}=", f"{2 * i}", 32) for i in range(16)]
TRAIN = dict(steps=4, batch_size=4, grad_accum=2, seed=3, optimizer={"lr": 1e-2, "warmup_steps": 0}, seq_len=32,
             pad_id=TOK.pad_id)


def _spec(cfg, **kw):
    return lora.check_table({"kind": "lora", "rank": 4, "alpha": 8, **kw}, cfg, "training.adapter")


def _leaves(tree):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("arch", CONFIGS)
def test_fresh_adapters_are_the_identity(arch):
    cfg = CONFIGS[arch]
    base = model.init_params(cfg, 0)
    spec = _spec(cfg)
    ad = lora.init_adapters(cfg, spec, jax.random.key(1))
    assert len(ad) == cfg.n_layer * len(lora.TARGETS["gptj" if arch == "gptj" else "llama"])
    assert all(not np.any(np.asarray(a["lora_b"])) and np.any(np.asarray(a["lora_a"])) for a in ad.values())
    np.testing.assert_array_equal(np.asarray(lora.forward(base, ad, TOKENS, cfg, spec)),
                                  np.asarray(model.forward(base, TOKENS, cfg)))


@pytest.mark.parametrize("arch", CONFIGS)
def test_a_step_trains_the_adapters_alone_and_merging_computes_the_same(arch):
    cfg = CONFIGS[arch]
    base = model.init_params(cfg, 0)
    before = _leaves(base)
    spec = _spec(cfg, targets=["q_proj", "v_proj", "fc_out" if arch == "gptj" else "down_proj"])
    trained, losses, _ = train.train(base, cfg, ENC, train.TrainConfig(adapter=spec, **TRAIN))
    after = _leaves(base)
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    assert losses[-1] < losses[0]
    assert set(trained) == set(lora.module_paths(cfg, spec))
    assert all(np.any(np.asarray(a["lora_b"])) for a in trained.values())  # B left zero: trained
    unmerged = np.asarray(lora.forward(base, trained, TOKENS, cfg, spec))
    merged = np.asarray(model.forward(lora.merge(base, trained, spec), TOKENS, cfg))
    assert np.abs(unmerged - np.asarray(model.forward(base, TOKENS, cfg))).max() > 1e-2  # it moved
    np.testing.assert_allclose(merged, unmerged, atol=1e-5, rtol=0)


def test_a_bf16_base_stays_bf16_and_the_adapters_and_their_moments_are_fp32():
    cfg = CONFIGS["llama"].replace(dtype="bfloat16")
    base = model.init_params(cfg, 0)
    spec = _spec(cfg)
    tx = AdamW.from_table({"lr": 1e-3}).build(10)
    ad = train.fresh_adapters(cfg, spec, 0)
    state = train.init_state(ad, tx)
    update = train.make_update(cfg, tx, adapter=spec)
    state, m = update(state, jax.tree.map(jnp.asarray, train.packing_batches(ENC, steps=1, batch_size=4,
                      grad_accum=1, seed=0, seq_len=32, pad_id=0, config=cfg).__next__()), base)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(base))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.opt_state) if x.ndim)
    assert np.isfinite(float(m["loss"]))


@pytest.mark.parametrize("table, message", [
    ({"kind": "lora", "rank": 4, "targets": ["q_porj"]}, "training.adapter.targets: 'q_porj' is not a projection "
                                                         "of this llama model; did you mean 'q_proj'?"),
    ({"kind": "lora", "rank": 4, "targets": ["fc_in"]}, "'fc_in' is not a projection of this llama model"),
    ({"kind": "lora", "rank": 33}, "training.adapter.rank: 33 is above q_proj's smaller side"),
    ({"kind": "lora", "rank": 0}, "training.adapter.rank: must be >= 1"),
    ({"kind": "dora", "rank": 4}, "training.adapter.kind: must be one of lora"),
    ({"kind": "lora", "rnak": 4}, "unknown key 'training.adapter.rnak' (did you mean 'rank'?)"),
    ({"kind": "lora", "alpha": -1}, "training.adapter.alpha: must be > 0"),
    ({"kind": "lora", "alpha": float("inf")}, "training.adapter.alpha: must be a finite number, got inf"),
    ({"kind": "lora", "targets": []}, "training.adapter.targets: must not be empty"),
])
def test_adapter_tables_are_checked_against_the_model(table, message):
    cfg = preset("llama-tiny", d_head=32, n_head=1, n_kv_head=1, d_model=32)  # q: 32 x 32
    with pytest.raises(UserError) as e:
        lora.check_table(table, cfg, "training.adapter")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_defaults_are_every_projection_rank_16_alpha_twice_the_rank():
    spec = lora.check_table({"kind": "lora"}, CONFIGS["gptj"], "k")
    assert (spec.rank, spec.alpha, spec.scale) == (16, 32.0, 2.0)
    assert spec.targets == tuple(lora.TARGETS["gptj"])
    assert lora.check_table({"kind": "lora", "rank": 16, "rslora": True}, CONFIGS["gptj"], "k").scale == 32 / 4


# ----------------------------------------------------------------------------- the backend's stage

SMALL = dict(preset="tiny", n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64,
             seq_len=48)
EXAMPLES = [TrainExample(f"Q: {i} + {i}\nA:", f" {2 * i} because {i} and {i}\nQ") for i in range(12)]
ADAPTER = {"kind": "lora", "rank": 4, "alpha": 8}
SPEC = TrainSpec(steps=7, batch_size=2, grad_accum=2, seed=5, optimizer={"lr": 1e-2, "warmup_steps": 2},
                 adapter=ADAPTER)


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_minutes=0)
    base = b.base(root, seed=0)
    return root, base, b.train(base, root / "model", EXAMPLES, SPEC)


def test_the_checkpoint_holds_the_adapters_and_its_base(stage):
    root, base, res = stage
    m = read_manifest(res.checkpoint)
    extra = m["extra"]
    assert extra["kind"] == "lora" and extra["lora"]["rank"] == 4 and extra["steps"] == 7
    b = plugin.HaikuXmapBackend.from_table(**SMALL)
    assert extra["base"] == b.checkpoint_id(base) and extra["init"] == b.checkpoint_id(base)
    assert {leaf["path"][1] for leaf in m["leaves"]} == {"lora_a", "lora_b"}
    assert all(leaf["dtype"] == "float32" for leaf in m["leaves"])
    out = b.generate(res.checkpoint, [GenRequest("Q: 3 + 3\nA:", 0)], GenSpec(6, 0.0, 1.0, (), 1))
    assert len(out) == 1


def test_killed_lora_stage_resumes_bit_identical(stage, tmp_path):
    root, base, ref = stage
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_steps=2, train_checkpoint_minutes=0)
    out = tmp_path / "model"
    with pytest.raises(Killed):
        b.train(base, out, EXAMPLES, SPEC, progress=killer(5, []))
    snap = resume.snapshot_dir(out)
    assert read_manifest(snap)["extra"]["step"] == 4 and not out.exists()
    calls: list = []
    res = b.train(base, out, EXAMPLES, SPEC, progress=calls.append)
    assert calls[0] == 4 and sum(calls) == SPEC.steps
    assert res.losses == ref.losses and res.tokens == ref.tokens
    from star_haiku_xmap.checkpoint.format import load_checkpoint

    got, _ = load_checkpoint(res.checkpoint)
    want, _ = load_checkpoint(ref.checkpoint)
    assert _leaves(got).keys() == _leaves(want).keys()
    assert all(np.array_equal(a, _leaves(want)[k]) for k, a in _leaves(got).items())


def test_continuing_adapters_and_refusing_another_base(stage, tmp_path):
    root, base, first = stage
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_minutes=0)
    again = b.train(first.checkpoint, tmp_path / "next", EXAMPLES, SPEC)  # restart_from_base = false
    m = read_manifest(again.checkpoint)["extra"]
    assert m["init"] == first.checkpoint_id and m["base"] == b.checkpoint_id(base)
    with pytest.raises(UserError, match="differs from the adapters it continues"):
        b.train(first.checkpoint, tmp_path / "other", EXAMPLES,
                dataclasses.replace(SPEC, adapter={**ADAPTER, "rank": 2}))
    # The base replaced by another model: the adapters refuse it.
    other = plugin.HaikuXmapBackend.from_table(**SMALL).base(tmp_path / "x", seed=1)
    moved = tmp_path / "run" / "iterations" / "001"
    shutil.copytree(first.checkpoint, moved / "model")
    rel = read_manifest(first.checkpoint)["extra"]["base_path"]
    target = (moved / "model" / rel).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(other, target)
    with pytest.raises(UserError, match="adapters load only over their own base"):
        b.generate(str(moved / "model"), [GenRequest("Q:", 0)], GenSpec(2, 0.0, 1.0, (), 1))


_MESH_SCRIPT = r"""
import json, numpy as np, jax
from star_haiku_xmap import lora, model, sharding, train
from star_haiku_xmap.model.config import preset
from star_haiku_xmap.tokenizer import ByteTokenizer
tok = ByteTokenizer()
cfg = preset("llama-tiny", n_ctx=64)
spec = lora.check_table({"kind": "lora", "rank": 4}, cfg, "k")
enc = [train.encode_example(tok, f"{i}+{i}=", f"{2 * i}", 32) for i in range(16)]
kw = dict(steps=3, batch_size=4, grad_accum=1, seed=3, optimizer={"lr": 1e-2, "warmup_steps": 0}, seq_len=32,
          pad_id=tok.pad_id, adapter=spec)
base = model.init_params(cfg, 0)
one, l1, _ = train.train(base, cfg, enc, train.TrainConfig(**kw))
mesh = sharding.make_mesh({"dp": 2, "mp": 2})
zero, l2, _ = train.train(base, cfg, enc, train.TrainConfig(zero=1, **kw), mesh=mesh)
a = jax.tree.leaves(jax.tree.map(np.asarray, one)); b = jax.tree.leaves(jax.tree.map(np.asarray, zero))
print("RESULT " + json.dumps({"losses": float(np.max(np.abs(np.array(l1) - np.array(l2)))),
                             "adapters": float(max(np.abs(x - y).max() for x, y in zip(a, b)))}))
"""


@pytest.mark.slow  # kept out of the default run for its time (~15 minutes); CI's slow step runs it
def test_lora_on_a_2x2_mesh_with_zero1_matches_one_device(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert got["losses"] < 1e-5 and got["adapters"] < 1e-5, got


def test_the_core_hands_the_backend_its_declared_adapter_and_optimizer(tmp_path):
    """The ``[training.adapter]`` and ``[training.optimizer]`` tables are checked once, at load,
    against the backend's declarations, and the objects travel to the job (issue #40)."""
    from star_engine.config.load import load_experiment
    from star_haiku_xmap.model.lora_options import LoraOptions
    from star_haiku_xmap.options import AdamW

    toml = tmp_path / "exp.toml"
    toml.write_text('[experiment]\nname = "x"\niterations = 1\n[task]\ndataset = "arithmetic"\n'
                    '[model]\nbackend = "haiku_xmap"\npreset = "tiny"\n'
                    '[training]\nadapter = { kind = "lora", rank = 4 }\noptimizer = { lr = 1e-4 }\n')
    cfg = load_experiment(toml)
    assert cfg.training.adapter == LoraOptions(kind="lora", rank=4) and cfg.base_training.adapter == {}
    spec = cfg.training.train_spec(2, 0)
    assert spec.adapter is cfg.training.adapter and spec.optimizer == AdamW(lr=1e-4)
    assert cfg.as_dict()["training"]["adapter"] == {"kind": "lora", "rank": 4, "alpha": None, "targets": None,
                                                    "rslora": False}  # config.json: what trains
    toml.write_text(toml.read_text().replace("rank = 4", "rank = 0"))
    with pytest.raises(UserError, match=r"^" + str(toml).replace(".", r"\.") + r": training\.adapter\.rank"):
        load_experiment(toml)
