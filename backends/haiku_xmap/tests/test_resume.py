"""Training snapshots (``resume.py``): a fine-tuning stage killed midway continues
from its last snapshot and ends with the uninterrupted stage's exact parameters,
losses and checkpoint id; a snapshot of another stage, or a damaged one, is
deleted and the stage starts over; the snapshot goes once the checkpoint is loaded."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from star_engine.api import GenRequest, GenSpec, TrainExample, TrainSpec
from star_engine.errors import UserError
from star_haiku_xmap import plugin
from star_haiku_xmap.train import resume
from star_haiku_xmap.checkpoint.format import load_checkpoint, read_manifest
from star_testkit import Killed, killer

SMALL = dict(preset="tiny", n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64,
             seq_len=48)
EXAMPLES = [TrainExample(f"Q: {i} + {i}\nA:", f" {2 * i} because {i} and {i}\nQ") for i in range(12)]
SPEC = TrainSpec(steps=9, batch_size=2, grad_accum=2, seed=5,
                 optimizer={"lr": 1e-2, "warmup_steps": 2, "schedule": "cosine", "end_lr": 1e-3})


def arrays(path) -> dict[str, np.ndarray]:
    params, _ = load_checkpoint(path)
    return {f"{m}/{n}": np.asarray(v) for m, leaves in params.items() for n, v in leaves.items()}


def assert_same(a, b) -> None:
    x, y = arrays(a), arrays(b)
    assert x.keys() == y.keys()
    for k in x:
        assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted stage with snapshots off."""
    root = tmp_path_factory.mktemp("ref")
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_minutes=0)
    base = b.base(root, seed=0)
    res = b.train(base, root / "model", EXAMPLES, SPEC)
    assert not resume.snapshot_dir(root / "model").exists()
    return base, res


def test_killed_stage_resumes_bit_identical(reference, tmp_path):
    base, ref = reference
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_steps=2, train_checkpoint_minutes=0)
    out = tmp_path / "model"
    calls: list = []
    with pytest.raises(Killed):
        b.train(base, out, EXAMPLES, SPEC, progress=killer(5, calls))
    snap = resume.snapshot_dir(out)
    m = read_manifest(snap)
    assert m["extra"]["step"] == 4 and len(m["extra"]["losses"]) == 4 and not out.exists()
    assert any(leaf["path"][:2] == ["opt_state", "1"] for leaf in m["leaves"])  # Adam's moments are in it
    calls = []
    res = b.train(base, out, EXAMPLES, SPEC, progress=calls.append)
    assert calls[0] == 4 and sum(calls) == SPEC.steps and len(calls) == 1 + SPEC.steps - 4  # steps 5..9 only
    assert_same(ref.checkpoint, res.checkpoint)
    assert res.checkpoint_id == ref.checkpoint_id
    assert (res.losses, res.tokens, res.steps) == (ref.losses, ref.tokens, ref.steps)
    # The snapshot outlives the checkpoint until the run has recorded the stage
    # (checkpoint_recorded): a kill before that retrains from the snapshot, not from step 0.
    assert read_manifest(snap)["extra"]["step"] == 8
    shutil.rmtree(out)  # the run's retry of an unrecorded stage: its checkpoint is removed
    calls = []
    again = b.train(base, out, EXAMPLES, SPEC, progress=calls.append)
    assert calls[0] == 8 and again.checkpoint_id == ref.checkpoint_id and again.losses == ref.losses
    b.generate(again.checkpoint, [GenRequest("ab", 0)], GenSpec(2, 0.0, 1.0, (), 1))
    assert snap.exists()  # loading the checkpoint has no say in the snapshot's life
    b.checkpoint_recorded(again.checkpoint)
    assert not snap.exists()  # the run has recorded the stage


def test_time_trigger_and_a_second_kill(reference, tmp_path):
    """Snapshots by time only (every step here), killed twice, still the reference."""
    base, ref = reference
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_minutes=1e-9)
    out = tmp_path / "model"
    for after in (3, 7):
        with pytest.raises(Killed):
            b.train(base, out, EXAMPLES, SPEC, progress=killer(after, []))
        assert read_manifest(resume.snapshot_dir(out))["extra"]["step"] == after
    res = b.train(base, out, EXAMPLES, SPEC)
    assert res.checkpoint_id == ref.checkpoint_id and res.losses == ref.losses


def test_snapshot_of_another_stage_or_damaged_is_deleted(reference, tmp_path):
    base, ref = reference
    b = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_steps=3, train_checkpoint_minutes=0)
    out = tmp_path / "model"
    snap = resume.snapshot_dir(out)
    other = dataclasses.replace(SPEC, seed=SPEC.seed + 1)
    with pytest.raises(Killed):
        b.train(base, out, EXAMPLES, other, progress=killer(4, []))
    assert read_manifest(snap)["extra"]["step"] == 3
    # another seed's snapshot: deleted, the stage starts from step 0 (first progress call is one step)
    calls: list = []
    with pytest.raises(Killed):
        b.train(base, out, EXAMPLES, SPEC, progress=killer(7, calls))
    assert calls[:2] == [1, 1] and read_manifest(snap)["extra"]["step"] == 6
    # a flipped byte in one part: the snapshot fails its sha256, is deleted, and the stage starts over
    part = sorted(snap.glob("*.zst"))[-1]
    data = bytearray(part.read_bytes())
    data[-1] ^= 1
    part.write_bytes(bytes(data))
    calls = []
    res = b.train(base, out, EXAMPLES, SPEC, progress=calls.append)
    assert calls == [1] * SPEC.steps
    assert res.checkpoint_id == ref.checkpoint_id
    assert read_manifest(snap)["extra"]["step"] == 6  # this run's own snapshot, kept until the checkpoint is loaded


def test_the_output_layer_and_the_training_mesh_are_in_the_key(reference, tmp_path):
    """A snapshot taken with ``loss_tokens`` or ``train_mesh`` set is not another setting's: a
    stage killed under one and rerun under another starts over (its steps would differ)."""
    base, _ = reference
    out = tmp_path / "model"
    snap = resume.snapshot_dir(out)
    fused = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_steps=3, train_checkpoint_minutes=0,
                                               loss_tokens=8, train_mesh={"dp": 1, "mp": 1})
    with pytest.raises(Killed):
        fused.train(base, out, EXAMPLES, SPEC, progress=killer(4, []))
    key = read_manifest(snap)["extra"]["key"]
    assert key["loss_tokens"] == 8 and key["train_mesh"] == [1, 1] and "loss_dot_dtype" not in key
    plain = plugin.HaikuXmapBackend.from_table(**SMALL, train_checkpoint_steps=3, train_checkpoint_minutes=0)
    calls: list = []
    with pytest.raises(Killed):
        plain.train(base, out, EXAMPLES, SPEC, progress=killer(2, calls))
    assert calls[:1] == [1]  # from step 0: the fused stage's snapshot was not this one's


def test_options_and_triggers(tmp_path):
    for options, key in [({"train_checkpoint_steps": -1}, "model.train_checkpoint_steps"),
                         ({"train_checkpoint_steps": 2.0}, "model.train_checkpoint_steps"),
                         ({"train_checkpoint_minutes": -1}, "model.train_checkpoint_minutes"),
                         ({"train_checkpoint_minutes": float("nan")}, "model.train_checkpoint_minutes"),
                         ({"train_checkpoint_minutes": "10"}, "model.train_checkpoint_minutes")]:
        with pytest.raises(UserError, match=key):
            plugin.HaikuXmapBackend.from_table(**SMALL, **options)
    assert resume.default_minutes(6_000_000_000) == 30 and resume.default_minutes(10_000) == 10
    kw = dict(model_config={}, tokenizer={})
    by_steps = resume.Snapshots(tmp_path, {}, steps=10, every_steps=3, every_minutes=0, **kw)
    assert [s for s in range(1, 11) if by_steps.due(s)] == [3, 6, 9]
    by_time = resume.Snapshots(tmp_path, {}, steps=10, every_steps=0, every_minutes=1e-4, **kw)
    assert not by_time.due(1)
    time.sleep(0.01)
    assert by_time.due(1) and not by_time.due(10)  # never after the last step: the checkpoint follows
    assert not any(resume.Snapshots(tmp_path, {}, steps=10, every_steps=0, every_minutes=0, **kw).due(s)
                   for s in range(1, 11))


_MESH_SCRIPT = r"""
import json, sys, tempfile
from pathlib import Path
import numpy as np
from star_engine.api import GenRequest, GenSpec, TrainExample, TrainSpec
from star_haiku_xmap import plugin, resume
from star_haiku_xmap.checkpoint.format import load_checkpoint, read_manifest

small = dict(preset="tiny", n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64,
             seq_len=48, mesh={"dp": 2, "mp": 2}, zero=1, dtype="bfloat16")
examples = [TrainExample(f"Q: {i} * 3\nA:", f" {3 * i} since {i} thrice\nQ") for i in range(16)]
spec = TrainSpec(steps=6, batch_size=2, grad_accum=2, seed=1, optimizer={"lr": 1e-2, "warmup_steps": 1})
root = Path(tempfile.mkdtemp())
ref_b = plugin.HaikuXmapBackend.from_table(**small, train_checkpoint_minutes=0)
base = ref_b.base(root, seed=0)
ref = ref_b.train(base, root / "ref", examples, spec)
b = plugin.HaikuXmapBackend.from_table(**small, train_checkpoint_steps=2, train_checkpoint_minutes=0)
done = []
def progress(n):
    done.append(n)
    if sum(done) >= 3:
        raise KeyboardInterrupt
try:
    b.train(base, root / "m", examples, spec, progress=progress)
except KeyboardInterrupt:
    pass
m = read_manifest(resume.snapshot_dir(root / "m"))
res = b.train(base, root / "m", examples, spec)
a, _ = load_checkpoint(ref.checkpoint)
c, _ = load_checkpoint(res.checkpoint)
same = all(np.array_equal(np.asarray(a[k][n]), np.asarray(c[k][n])) for k in a for n in a[k])
print("RESULT " + json.dumps({"step": m["extra"]["step"], "version": m["version"], "same": same,
                              "ids": ref.checkpoint_id == res.checkpoint_id, "losses": ref.losses == res.losses}))
"""


def test_resume_on_a_2x2_mesh_with_zero1_and_bf16(tmp_path):
    """mp-split snapshot parts and ZeRO-1 shardings (fp32 masters split over dp) reload exactly."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
    assert got == {"step": 2, "version": 2, "same": True, "ids": True, "losses": True}
