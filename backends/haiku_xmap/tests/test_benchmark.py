"""benchmarks/gptj_throughput.py runs end to end at a tiny shape and prints the
JSON line docs/performance.md's speed tables come from (no --peer: torch is optional)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from star_testkit import load_script

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gptj_throughput.py"


def _ceiling_module():
    """benchmarks/ceiling.py (the benchmarks folder is scripts, not a package)."""
    return load_script(SCRIPT.parent / "ceiling.py")


@pytest.mark.slow  # the whole benchmark script end to end (the default run keeps its units)
def test_benchmark_prints_one_json_line_with_throughputs_and_mfu():
    args = ["--layers", "1", "--d-model", "32", "--heads", "2", "--rotary-dim", "8", "--vocab", "64",
            "--gen-batch", "4", "--prompt", "8", "--new-tokens", "8", "--train-batch", "2", "--train-seq", "16",
            "--repeats", "2", "--train-steps", "2", "--cpu-devices", "2", "--ceiling"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])
    assert result["mesh"] == {"dp": 2, "mp": 1}
    for key in ("generate_tokens_per_s", "train_tokens_per_s", "generate_compile_s", "train_compile_s", "mfu",
                "generate_ceiling_tokens_per_s", "train_ceiling_tokens_per_s"):
        assert result[key] > 0, (key, result)
    assert result["shape"]["gen_batch"] == 4 and result["threads"] >= 1
    assert "generate_ratio_jax_over_hf" not in result  # only with --peer


@pytest.mark.slow  # as above, for the Llama family
def test_benchmark_runs_the_llama_family():
    args = ["--arch", "llama", "--layers", "1", "--d-model", "32", "--heads", "4", "--kv-heads", "2", "--d-ff", "48",
            "--vocab", "64", "--gen-batch", "2", "--prompt", "8", "--new-tokens", "4", "--train-batch", "2",
            "--train-seq", "16", "--repeats", "1", "--train-steps", "1", "--cpu-devices", "1"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["arch"] == "llama" and result["shape"]["kv_heads"] == 2 and "rotary_dim" not in result["shape"]
    assert result["generate_tokens_per_s"] > 0 and result["train_tokens_per_s"] > 0 and "mfu" in result


def test_ceiling_decode_starts_from_the_real_prefill_and_runs_every_step():
    """The attention-free decode's first token is the real model's (same prefill);
    later ones differ (no attention), and every row gets max_new_tokens tokens."""
    import jax
    import numpy as np

    ceiling = _ceiling_module()
    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.runtime import sharding
    from star_haiku_xmap.sampling import static as sample
    from star_haiku_xmap.model.config import GPTJConfig

    cfg = GPTJConfig(n_layer=2, d_model=32, n_head=2, d_head=16, d_ff=64, rotary_dim=8, n_ctx=32, vocab=64)
    params = model.init_params(cfg, 0)
    tokens = np.random.default_rng(0).integers(0, 64, (4, 8)).astype(np.int32)
    mask = np.ones_like(tokens, bool)
    mesh = sharding.make_mesh({"dp": 1, "mp": 1}, jax.devices()[:1])
    dense = np.asarray(ceiling.dense_generate(params, tokens, mask, config=cfg, max_new_tokens=12, mesh=mesh))
    real = np.asarray(sample.generate(params, tokens, mask, sample.keys_from_seeds(range(4)), 0.0, 1.0, config=cfg,
                                      max_new_tokens=12, eos_id=-1))
    assert dense.shape == real.shape == (4, 12)
    np.testing.assert_array_equal(dense[:, 0], real[:, 0])
    assert (dense != real).any()


def test_ceiling_train_step_learns_a_repeated_batch():
    """The attention-free train step is a real step: its loss falls on one batch."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    ceiling = _ceiling_module()
    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.runtime import sharding
    from star_haiku_xmap.train import trainer as train
    from star_haiku_xmap.model.config import GPTJConfig
    from star_haiku_xmap.options import AdamW

    cfg = GPTJConfig(n_layer=1, d_model=32, n_head=2, d_head=16, d_ff=64, rotary_dim=8, n_ctx=16, vocab=64)
    mesh = sharding.make_mesh({"dp": 1, "mp": 1}, jax.devices()[:1])
    tx = AdamW.from_table({"lr": 1e-2, "warmup_steps": 0}).build(100)
    state = train.init_state(jax.tree.map(jnp.copy, model.init_params(cfg, 0)), tx)
    update = ceiling.make_dense_update(cfg, tx, mesh, state)
    tokens = np.random.default_rng(0).integers(0, 64, (4, 16)).astype(np.int32)
    losses = []
    for _ in range(20):
        state, loss = update(state, tokens)
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0], losses
    assert int(state.step) == 20


WORKLOAD = SCRIPT.with_name("star_workload.py")


@pytest.mark.slow  # a minute: both mixes' generation and training, each side compiled
def test_workload_benchmark_prints_every_ratio_of_both_mixes():
    """star_workload.py end to end on a few requests of both mixes (one layer, a
    small vocabulary; no HF peer): one JSON line with each side's useful tokens/s
    and the ratios between this engine's sides."""
    args = ["--addition-requests", "6", "--cqa-requests", "3", "--cqa-prompt", "120", "--cqa-vocab", "256",
            "--train-steps", "1", "--rounds", "1", "--layers", "1", "--cpu-devices", "2"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(WORKLOAD), *args], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])
    assert result["mesh"] == {"dp": 2, "mp": 1} and result["threads"] >= 1
    for mix in ("addition", "cqa"):
        for kind, sides in (("gen", ("engine", "engine_static")), ("train", ("engine_packed", "engine_padded"))):
            assert result[f"{mix}_{kind}_useful_tokens"] > 0
            for side in sides:
                assert result[f"{mix}_{kind}_{side}_tokens_per_s"] > 0, (mix, side, result)
        assert result[f"{mix}_gen_engine_over_engine_static"] > 0
        assert result[f"{mix}_train_engine_packed_over_engine_padded_cpu"] > 0
        assert result[f"{mix}_engine_stats"]["decode_steps"] > 0
        assert f"{mix}_gen_engine_over_hf_static" not in result  # only with --peer
    # The cqa prompts share a 73-token prefix: prefilled once (64 tokens), and measured against not sharing it.
    assert result["cqa_engine_stats"]["prefix_tokens"] == 64 and result["addition_engine_stats"]["prefix_tokens"] == 0
    assert result["cqa_gen_engine_over_engine_no_prefix"] > 0 and "addition_gen_engine_no_prefix_tokens_per_s" not in result
    assert result["addition_gen_useful_tokens"] == sum(_workload_module().addition_mix(_Args(6))["budgets"])


class _Args:
    def __init__(self, addition_requests):
        self.addition_requests = addition_requests


def _workload_module():
    return load_script(SCRIPT.parent / "star_workload.py")


def test_workload_mesh_arguments():
    """--mesh and --train-mesh give the engine's meshes as DPxMP (dp -1: the remaining
    devices); --train-devices N is --train-mesh Nx1; the training plans' row multiple is the
    training mesh's dp; a malformed mesh, or a training mesh without both sizes (as the backend's
model.train_mesh), is refused by argparse (exit 2, one line)."""
    sw = _workload_module()
    a = sw.parse_args([])
    assert a.mesh == (-1, 1) and a.train_mesh is None and sw.train_dp(a, 2) == 2
    a = sw.parse_args(["--mesh", "1x2"])
    assert a.mesh == (1, 2) and sw.train_dp(a, 2) == 1
    a = sw.parse_args(["--mesh=-1x2", "--train-mesh", "1x1"])
    assert sw.train_dp(a, 4) == 1 and sw.train_dp(sw.parse_args(["--mesh=-1x2"]), 4) == 2
    assert sw.parse_args(["--train-devices", "1"]).train_mesh == (1, 1)
    for bad in (["--mesh", "2"], ["--mesh", "0x1"], ["--mesh", "1x0"], ["--train-mesh", "ax1"],
                ["--train-mesh=-1x1"], ["--train-devices", "0"], ["--train-devices", "1", "--train-mesh", "1x1"]):
        with pytest.raises(SystemExit) as exc:
            sw.parse_args(bad)
        assert exc.value.code == 2, bad


def test_addition_mix_is_one_iteration_of_the_demo():
    """The addition mix: the file's train questions of one iteration (``n_train_samples``),
    every second one hinted, the dev questions, each with its gold scratchpad's length as
    budget; training on 500 of them at the file's batch size."""
    import tomllib

    from star_arithmetic import AdditionTask

    mix = _workload_module().addition_mix(_Args(0))
    toml = tomllib.loads((SCRIPT.parents[1] / "experiments" / "addition.toml").read_text())
    task = AdditionTask(**toml["task"]["options"])
    first = task.load("train", None)[0]
    n, n_dev = toml["generation"]["n_train_samples"], toml["task"]["options"]["n_dev"]
    assert len(mix["prompts"]) == len(mix["budgets"]) == n + (n + 1) // 2 + n_dev
    assert bytes(mix["prompts"][0]).decode() == task.context(first)
    assert mix["budgets"][0] == len(task.gold_completion(first, direct=False).encode())
    assert sum(b"Hint:" in bytes(p) for p in mix["prompts"]) == (n + 1) // 2
    assert 40 <= min(mix["budgets"]) and max(mix["budgets"]) <= toml["generation"]["max_new_tokens"]
    assert mix["slots"] == toml["generation"]["batch_size"] and mix["model"]["n_layer"] == toml["model"]["n_layer"]
    assert len(mix["train"]) == 500 and mix["train_batch"] == toml["training"]["batch_size"]


def _xla_ops():
    return load_script(SCRIPT.parent / "xla_ops.py")


def test_xla_ops_self_time_excludes_nested_ops():
    """A loop's own time is what its body's ops leave of it; ops beside each other keep theirs."""
    ops = _xla_ops()
    events = [(0, 100, ("m", "while")), (10, 30, ("m", "dot")), (40, 70, ("m", "fusion")), (50, 60, ("m", "inner")),
              (120, 130, ("m", "dot"))]
    spans = ops._self_spans(events)
    assert sorted(spans[("m", "while")]) == [(0, 10), (30, 40), (70, 100)]
    assert sorted(spans[("m", "dot")]) == [(10, 30), (120, 130)]
    assert sorted(spans[("m", "fusion")]) == [(40, 50), (60, 70)] and spans[("m", "inner")] == [(50, 60)]
    assert ops._union([(0, 10), (5, 20), (30, 40)]) == 30


def test_xla_ops_loop_time_is_time_no_op_runs_on_any_thread():
    """A loop's body ops may run on another thread (Eigen's, another device's): its own time is
    what is left of its span once every other op's time, on any thread, is taken out."""
    ops = _xla_ops()
    parents: set = set()
    main = ops._self_spans([(0, 100, ("m", "while")), (10, 20, ("m", "fusion"))], parents)
    assert parents == {("m", "while")} and sorted(main[("m", "while")]) == [(0, 10), (20, 100)]
    busy = ops._merged([(10, 20), (30, 60), (50, 70), (90, 95)])  # a dot on another thread, two overlapping
    assert busy == [(10, 20), (30, 70), (90, 95)]
    assert ops._minus(main[("m", "while")], busy) == [(0, 10), (20, 30), (70, 90), (95, 100)]
    assert ops._minus([(0, 5)], busy) == [(0, 5)] and ops._minus([(30, 70)], busy) == []
    assert ops._minus([(15, 35), (0, 12)], busy) == [(0, 10), (20, 30)]


def test_xla_ops_profiles_and_labels_a_compiled_step():
    """XLA's trace of a jit'd call: its matmul is an op of its program, with the opcode, shape and
    source path of the compiled text, sorted into the step's parts by that path."""
    import jax
    import jax.numpy as jnp

    ops = _xla_ops()

    def step(w, x):
        with jax.named_scope("fused_ce"):
            y = jnp.tanh(x @ w)
        return jax.lax.fori_loop(0, 3, lambda i, a: a * 0.5 + jnp.sin(a), y).sum()

    f = jax.jit(step)
    w, x = jnp.ones((256, 256)), jnp.ones((128, 256))
    f(w, x).block_until_ready()
    rows = ops.label(ops.op_profile(lambda: f(w, x).block_until_ready(), calls=2), [f.lower(w, x).compile().as_text()])
    assert rows and all(r.ms >= 0 and r.module for r in rows)
    assert sum(r.ms for r in rows) > 0
    heads = [r for r in rows if ops.part(r) == "head"]
    assert heads and any("fused_ce" in r.source and "256" in r.shape for r in heads), rows[:8]
    assert set(ops.parts(rows)) <= {"head", "forward", "backward", "collectives", "loop gaps", "optimizer/other"}
    assert "per part:" in ops.table(rows, 5)


VOCAB_PROFILE = SCRIPT.with_name("vocab_step_profile.py")


@pytest.mark.slow  # every engine part and step compiled, then profiled
def test_vocab_step_profile_prints_the_three_layers_and_their_ops():
    args = ["--rounds", "1", "--rows", "2", "--seq", "16", "--layers", "1", "--d-model", "32", "--vocab", "300",
            "--chunk", "64", "--tokens", "8", "--no-peer", "--ops", "--cpu-devices", "1"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(VOCAB_PROFILE), *args], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mesh"] == {"dp": 1, "mp": 1} and result["tokens"] == 8
    for kind in ("plain", "chunked", "fused"):
        assert result["median_ms"][f"engine_step_{kind}"] > 0
        assert result["ops"][kind]["top"] and "head" in result["ops"][kind]["parts_ms"], result["ops"][kind]
    assert result["step_chunked_over_fused"] > 0 and "step_hf_over_engine_fused" not in result
