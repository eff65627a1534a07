"""The ``haiku_xmap`` backend through its plugin: registration, options, base
checkpoints, train -> generate round trip, determinism, stop strings."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pluggy
import pytest

import star_engine.hooks
from star_engine.api import Backend, GenRequest, GenSpec, TrainExample, TrainSpec
from star_engine.errors import UserError
from star_haiku_xmap import plugin

SMALL = dict(preset="tiny", n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64,
             seq_len=48)
EXAMPLES = [TrainExample("Q: hi\nA:", " hello world\nQ"), TrainExample("Q: yo\nA:", " bye now\nQ")]
SPEC = TrainSpec(steps=40, batch_size=4, grad_accum=1, seed=3,
                 optimizer={"lr": 1e-2, "warmup_steps": 5, "schedule": "linear", "end_lr": 1e-3})


@pytest.fixture(scope="module")
def backend():
    return plugin.HaikuXmapBackend.from_table(**SMALL)


@pytest.fixture(scope="module")
def trained(backend, tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    base = backend.base(root, seed=0)
    return base, backend.train(base, root / "iter_1" / "model", EXAMPLES, SPEC)


def test_registered_through_the_hook_and_entry_point():
    pm = pluggy.PluginManager("star_engine")
    pm.add_hookspecs(star_engine.hooks)
    pm.register(plugin)
    pm.check_pending()
    found = {}
    pm.hook.register_backends(register=lambda name, factory: found.setdefault(name, factory))
    assert found == {"haiku_xmap": plugin.HaikuXmapBackend}
    eps = {ep.name: ep.value for ep in entry_points(group="star_engine")}
    assert eps.get("haiku_xmap") == "star_haiku_xmap.plugin"


def test_bad_options_name_the_option(tmp_path):
    cases = [(dict(preset="huge"), "model.preset"), (dict(dtype="float16"), "model.dtype"),
             (dict(mesh={"dp": -1, "mp": -1}), "model.mesh"), (dict(seq_len=65), "model.seq_len"),
             (dict(tokenizer="hf"), "model.tokenizer_file"), (dict(vocab=200), "model.vocab"),
             (dict(rotary_dim=20), "rotary_dim"), (dict(tokenizer="bpe"), "model.tokenizer"),
             (dict(cpu_devices=0), "model.cpu_devices"), (dict(cpu_devices=True), "model.cpu_devices"),
             (dict(cpu_devices="2"), "model.cpu_devices"), (dict(generation="dynamic"), "model.generation"),
             (dict(generation_chunk=0), "model.generation_chunk"),
             (dict(generation_chunk=2.5), "model.generation_chunk"),
             (dict(share_prefix="yes"), "model.share_prefix"), (dict(train_mesh={"dp": -1, "mp": 1}), "model.train_mesh"),
             (dict(train_mesh={"dp": 1}), "model.train_mesh"), (dict(train_mesh={"dp": 1, "tp": 1}), "model.train_mesh"),
             (dict(loss_tokens=-1), "model.loss_tokens"), (dict(loss_dot_dtype="bfloat16"), "model.loss_dot_dtype"),
             (dict(loss_tokens=0, loss_dot_dtype="float16"), "model.loss_dot_dtype")]
    for options, name in cases:
        with pytest.raises(UserError, match=name) as e:
            plugin.HaikuXmapBackend.from_table(**{**SMALL, **options})
        assert e.value.key == (name if name.startswith("model.") else f"model.{name}"), e.value
    # What depends on the devices is the runtime's: refused when the run starts it, before it writes.
    backend = plugin.HaikuXmapBackend.from_table(**SMALL, mesh={"dp": -1, "mp": 3})
    with pytest.raises(UserError, match=r"model.mesh: mesh: \d+ devices are not divisible by 3") as e:
        backend.start()
    assert e.value.key == "model.mesh"


def test_cpu_devices_cannot_change_once_jax_has_started():
    import jax

    n = len(jax.devices("cpu"))  # jax is running in this process from here on
    with pytest.raises(UserError, match=f"model.cpu_devices: jax already started in this process with {n}"):
        plugin.HaikuXmapBackend.from_table(**SMALL, cpu_devices=n + 1).start()
    assert plugin.HaikuXmapBackend.from_table(**SMALL, cpu_devices=n).mesh.shape["dp"] == n


_CPU_DEVICES_SCRIPT = r"""
import json, sys, tempfile
from star_engine.api import GenRequest, GenSpec
from star_haiku_xmap import plugin
options = json.loads(sys.argv[1])
backend = plugin.HaikuXmapBackend.from_table(**options)
base = backend.base(tempfile.mkdtemp(), seed=0)
reqs = [GenRequest(prompt="Q: " + "ab" * i, seed=i) for i in range(5)]
texts = [backend.generate(base, reqs, GenSpec(10, t, 0.9, (), 4)) for t in (0.0, 1.0)]
print("RESULT " + json.dumps({"mesh": backend.describe()["mesh"], "texts": texts}))
"""


def _run_fresh(script: str, arg: str, timeout: int) -> str:
    """The text after "RESULT " that ``script`` prints, run in a new process
    whose CPU device count only ``model.cpu_devices`` sets (no XLA_FLAGS)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-c", script, arg], capture_output=True, text=True, timeout=timeout,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT "):]


def test_cpu_devices_split_generation_over_cores_with_the_same_text():
    results = [json.loads(_run_fresh(_CPU_DEVICES_SCRIPT, json.dumps({**SMALL, "cpu_devices": n}), 300))
               for n in (1, 2)]
    assert [r["mesh"] for r in results] == [{"dp": 1, "mp": 1}, {"dp": 2, "mp": 1}]
    assert results[0]["texts"] == results[1]["texts"]
    assert len(set(results[0]["texts"][1])) > 1  # sampled rows differ: not a degenerate model


_TRAIN_MESH_SCRIPT = r"""
import json, sys, tempfile
from star_engine.api import GenRequest, GenSpec, TrainExample, TrainSpec
from star_haiku_xmap import plugin
options = json.loads(sys.argv[1])
backend = plugin.HaikuXmapBackend.from_table(**options)
root = tempfile.mkdtemp()
examples = [TrainExample(f"Q: {i}\nA:", " " + "xy" * (i % 7 + 1) + "\nQ") for i in range(12)]
spec = TrainSpec(steps=6, batch_size=4, grad_accum=1, seed=1, optimizer={"lr": 1e-2, "warmup_steps": 0})
result = backend.train(backend.base(root, seed=0), root + "/m", examples, spec)
text = backend.generate(result.checkpoint, [GenRequest(prompt="Q: 3\nA:", seed=0)], GenSpec(8, 0.0, 1.0, (), 1))
d = backend.describe()
print("RESULT " + json.dumps({"mesh": d["mesh"], "train_mesh": d["train_mesh"], "losses": result.losses,
                              "text": text}))
"""


def test_train_mesh_trains_as_a_process_of_that_many_devices():
    """``[model] train_mesh = {dp = 1, mp = 1}`` in a 2-device process trains on one device:
    the losses of a 1-device process, bit for bit, while generation keeps both devices (the
    trained weights come back onto the run's mesh); a sub-mesh larger than the mesh is refused."""
    runs = {name: json.loads(_run_fresh(_TRAIN_MESH_SCRIPT, json.dumps({**SMALL, **extra}), 300))
            for name, extra in (("one", {"cpu_devices": 1}), ("sub", {"cpu_devices": 2,
                                                                      "train_mesh": {"dp": 1, "mp": 1}}),
                                ("two", {"cpu_devices": 2}))}
    assert runs["sub"]["mesh"] == {"dp": 2, "mp": 1} and runs["sub"]["train_mesh"] == {"dp": 1, "mp": 1}
    assert runs["two"]["train_mesh"] == {"dp": 2, "mp": 1}
    assert runs["sub"]["losses"] == runs["one"]["losses"]
    assert runs["sub"]["losses"] != runs["two"]["losses"]  # the batch split over 2 devices sums otherwise
    assert runs["sub"]["text"] == runs["one"]["text"]
    backend = plugin.HaikuXmapBackend.from_table(**SMALL, train_mesh={"dp": 64, "mp": 1})
    with pytest.raises(UserError, match="model.train_mesh: dp x mp = 64 devices") as e:
        backend.start()
    assert e.value.key == "model.train_mesh"


_CPU_TRAIN_SCRIPT = r"""
import random, sys, tempfile
from star_engine.api import TrainExample, TrainSpec
from star_haiku_xmap import plugin
backend = plugin.HaikuXmapBackend.from_table(preset="tiny", n_layer=1, cpu_devices=2)
rng = random.Random(0)
examples = [TrainExample(f"Q: {rng.randint(0, 10 ** rng.randint(1, 5))}\nA:", " " + "x" * rng.randint(5, 200) + "\n")
            for _ in range(300)]
root = tempfile.mkdtemp()
result = backend.train(backend.base(root, seed=0), root + "/m", examples,
                       TrainSpec(steps=int(sys.argv[1]), batch_size=16, grad_accum=1, seed=0, optimizer={"lr": 1e-3, "warmup_steps": 0}))
print("RESULT", result.losses[0], result.losses[-1])
"""


@pytest.mark.slow
def test_training_on_two_cpu_devices_does_not_deadlock():
    # Consecutive steps whose all-reduces overlapped hung XLA:CPU's in-process
    # rendezvous within a few hundred steps (sharding.needs_serial_steps).
    first, last = map(float, _run_fresh(_CPU_TRAIN_SCRIPT, "400", 600).split())
    assert last < first / 2, (first, last)


def test_base_is_seeded_and_idempotent(backend, tmp_path):
    a = backend.base(tmp_path / "a", seed=0)
    assert Path(a) == tmp_path / "a" / "base_init"
    ida = backend.checkpoint_id(a)
    assert backend.base(tmp_path / "a", seed=0) == a and backend.checkpoint_id(a) == ida
    assert backend.checkpoint_id(backend.base(tmp_path / "b", seed=0)) == ida
    assert backend.checkpoint_id(backend.base(tmp_path / "c", seed=1)) != ida
    assert ida == hashlib.sha256((Path(a) / "manifest.msgpack").read_bytes()).hexdigest()


def test_train_result_and_checkpoint(backend, trained):
    base, result = trained
    for name in ("base", "checkpoint_id", "train", "generate", "describe"):  # the Backend protocol
        want = inspect.signature(getattr(Backend, name)).parameters
        assert list(inspect.signature(getattr(backend, name)).parameters) == list(want)[1:]
    assert Path(result.checkpoint).is_dir() and result.steps == 40 and len(result.losses) == 40
    assert result.checkpoint_id == backend.checkpoint_id(result.checkpoint) != backend.checkpoint_id(base)
    # Loss tokens: completion + end-of-text, 4 rows per step.
    per_row = {len(e.completion.encode()) + 1 for e in EXAMPLES}
    assert 40 * 4 * min(per_row) <= result.tokens <= 40 * 4 * max(per_row)
    assert result.losses[-1] < 0.2 * result.losses[0]
    leftovers = [p.name for p in Path(result.checkpoint).parent.iterdir() if p.name != "model"]
    assert leftovers == []  # the atomic write left no temporary directory behind


def test_generate_learned_text_cut_at_stop(backend, trained):
    _, result = trained
    reqs = [GenRequest("Q: hi\nA:", seed=1), GenRequest("Q: yo\nA:", seed=2), GenRequest("Q: hi\nA:", seed=3)]
    seen = []
    spec = GenSpec(max_new_tokens=16, temperature=0.0, top_p=1.0, stop=("\n",), batch_size=2)
    texts = backend.generate(result.checkpoint, reqs, spec, progress=seen.append)
    assert texts == [" hello world", " bye now", " hello world"] and sum(seen) == 3
    texts = backend.generate(result.checkpoint, reqs, GenSpec(16, 0.0, 1.0, (" w", "now"), 1))
    assert texts == [" hello", " bye ", " hello"]


def test_sampling_depends_on_seed_only(backend, trained):
    base, _ = trained  # the random init: sampled text varies a lot with the seed
    spec = GenSpec(max_new_tokens=12, temperature=1.0, top_p=0.9, stop=(), batch_size=3)
    reqs = [GenRequest("abc", seed=s) for s in (1, 2, 3)] + [GenRequest("a much longer prompt", seed=1)]
    a = backend.generate(base, reqs, spec)
    b = backend.generate(base, list(reversed(reqs)), GenSpec(12, 1.0, 0.9, (), 2))[::-1]
    assert a == b and a[0] != a[1]


def test_continuous_and_static_generation_give_the_same_text(backend, trained):
    base, _ = trained
    static = plugin.HaikuXmapBackend.from_table(**SMALL, generation="static")
    assert backend.options.generation == "continuous" and backend.describe()["generation"] == "continuous"
    reqs = [GenRequest("x" * (i % 7) + "Q: " + "ab" * i, seed=i) for i in range(11)] + [GenRequest("abc", 5)] * 3
    for spec in (GenSpec(20, 0.0, 1.0, (), 4), GenSpec(20, 1.0, 0.9, (), 4), GenSpec(20, 1.0, 0.9, ("a", "\n"), 4)):
        texts = backend.generate(base, reqs, spec)
        assert texts == static.generate(base, reqs, spec)
        assert len(set(texts)) > 5
    assert len({len(t) for t in texts}) > 3  # the stop strings end rows at different lengths


@pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "c++") is None, reason="no C++ compiler")
def test_ragged_decode_attention_gives_the_same_text(backend, trained):
    base, _ = trained
    ragged = plugin.HaikuXmapBackend.from_table(**SMALL, decode_attention="ragged")
    ragged.validate_run({}, {})  # builds the kernel
    assert ragged.describe()["decode_attention"] == "ragged" and backend.describe()["decode_attention"] == "dense"
    reqs = [GenRequest("x" * (i % 7) + "Q: " + "ab" * i, seed=i) for i in range(11)] + [GenRequest("abc", 5)] * 3
    for spec in (GenSpec(20, 0.0, 1.0, (), 4), GenSpec(20, 1.0, 0.9, ("a", "\n"), 4)):
        assert ragged.generate(base, reqs, spec) == backend.generate(base, reqs, spec)


def test_retraining_is_bit_identical(backend, trained, tmp_path):
    base, result = trained
    again = backend.train(base, tmp_path / "again", EXAMPLES, SPEC)
    assert again.checkpoint_id == result.checkpoint_id and again.losses == result.losses
    other = backend.train(base, tmp_path / "other", EXAMPLES, TrainSpec(40, 4, 1, 4, SPEC.optimizer))
    assert other.checkpoint_id != result.checkpoint_id


def test_too_long_completion_is_a_user_error(backend, trained, tmp_path):
    base, _ = trained
    with pytest.raises(UserError, match="training example 1"):
        backend.train(base, tmp_path / "x", [EXAMPLES[0], TrainExample("Q:", "z" * 60)], SPEC)
    with pytest.raises(UserError, match="optimizer"):
        backend.train(base, tmp_path / "y", EXAMPLES, TrainSpec(1, 1, 1, 0, {"lr": 1e-3, "momentum": 0.9}))


def test_configured_checkpoint_is_the_base(trained, tmp_path):
    _, result = trained
    b = plugin.HaikuXmapBackend.from_table(checkpoint_path=result.checkpoint, seq_len=48)
    assert b.base(tmp_path, seed=0) == result.checkpoint
    assert b.config.n_layer == 1 and b.config.d_model == 64
    spec = GenSpec(16, 0.0, 1.0, ("\n",), 1)
    assert b.generate(result.checkpoint, [GenRequest("Q: yo\nA:", 0)], spec) == [" bye now"]
    with pytest.raises(UserError, match="model.n_layer"):
        plugin.HaikuXmapBackend.from_table(checkpoint_path=result.checkpoint, n_layer=2)
    d = b.describe()
    json.dumps(d)
    assert d["backend"] == "haiku_xmap" and d["model"]["n_layer"] == 1 and d["mesh"]["mp"] == 1


def test_check_export_hf_names_the_engine_key_for_a_model_it_cannot_export(monkeypatch):
    """What a server engine asks before a run: the tiny byte model exports; a model whose
    architecture has no Hugging Face export is refused in one line naming generation.engine."""
    from star_engine import UserError
    from star_haiku_xmap.convert import hf_export
    from star_haiku_xmap.plugin import HaikuXmapBackend

    backend = HaikuXmapBackend.from_table(preset="tiny", tokenizer="byte")
    backend.check_export_hf()
    monkeypatch.setattr(hf_export, "KNOWN", ("llama",))
    with pytest.raises(UserError, match="architecture 'gptj' has no Hugging Face export") as e:
        backend.check_export_hf()
    assert e.value.key == "generation.engine"
