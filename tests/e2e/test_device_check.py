"""benchmarks/device/check.sh, the GPU check, runs here at tiny shapes (``--tiny``) on the
CPU, so that the script a lent GPU runs cannot rot: every check writes its line, the
figures are consistent with the shapes, and nothing fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from star_testkit import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device" / "check.sh"


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHON"] = sys.executable
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


@pytest.mark.slow  # 50 s: the whole check at tiny shapes, in CI's slow step
def test_check_tiny_writes_every_check_as_a_json_line(tmp_path):
    proc = _run(str(tmp_path / "out"), "--tiny")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "check.jsonl").read_text().splitlines()]
    by = {r["check"]: r for r in rows}
    assert list(by) == ["parity", "train", "train_lora", "generate", "addition_demo"]
    for r in rows:  # every figure names its device and the day
        assert r["device"] and r["platform"] == "cpu" and r["date"] and r["tiny"] is True
        assert "error" not in r, r
    parity = by["parity"]
    assert parity["ok"] and parity["gptj"]["greedy_equal"] and parity["llama"]["greedy_equal"]
    train = by["train"]
    assert train["rows"] == 8 and train["seq"] == 128 and train["tokens_per_s"] > 0
    assert 0 < train["mfu"] < 1 and train["loss"] > 0
    gen = by["generate"]
    assert gen["requests"] == gen["prompts"] * gen["k"] == 32
    assert gen["useful_tokens"] == gen["requests"] * gen["new_tokens"]  # no end-of-text: every row runs out
    assert gen["prefill_rows"] == gen["prompts"]  # k samples share one prefill
    assert gen["kv_bytes_read"] > 0 and "bandwidth_fraction" not in gen  # a CPU has no datasheet bandwidth
    demo = by["addition_demo"]
    assert demo["finished"] and demo["iterations_done"] == 1 and len(demo["dev_accuracy"]) == 2
    lora = by["train_lora"]  # the adapters alone train: a small share of the parameters
    assert lora["tokens_per_s"] > 0 and 0 < lora["trained"] < lora["params"] / 5 and lora["lora"]["rank"] == 4
    assert lora["flops_per_token"] < train["flops_per_token"] and 0 < lora["mfu"] < 1
    assert train["attention"] == gen["attention"] == "reference"  # the CPU default


def test_check_usage_and_unknown_check_exit_2(tmp_path):
    proc = _run()
    assert proc.returncode == 2 and "usage" in proc.stderr
    proc = _run(str(tmp_path / "o"), "--tiny", "--only", "parity,warp")
    assert proc.returncode == 2 and "warp" in proc.stderr and not (tmp_path / "o" / "check.jsonl").exists()


def test_flops_count_every_matmul_parameter_once():
    """6N counts every projection and the LM head once: for a tied model that is every
    matrix of the parameter tree (the embedding is the head)."""
    import jax
    import numpy as np
    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.model.config import preset

    wl = load_script(ROOT / "benchmarks" / "device" / "device_workloads.py")
    for name, over in (("qwen2.5-1.5b", {}), ("tiny", {})):
        cfg = preset(name, **over)
        shapes = jax.eval_shape(lambda k: model.init_params(cfg, k), jax.random.key(0))  # noqa: B023
        matrices = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes) if len(x.shape) == 2)
        tied = getattr(cfg, "tie_embeddings", False)
        head_separate = 0 if tied else cfg.vocab * cfg.d_model  # untied: the embedding is a lookup only
        assert wl.matmul_params(cfg) == matrices - head_separate, name
    cfg = preset("qwen2.5-1.5b")
    assert 1.50e9 < wl.matmul_params(cfg) < 1.56e9  # Qwen2.5-1.5B: 1.54B parameters, tied
    T = 1024
    assert wl.train_flops_per_token(cfg, T) == 6 * wl.matmul_params(cfg) + 12 * 28 * 12 * 128 * T


@pytest.mark.parametrize("kind,expected", [("NVIDIA H100 80GB HBM3", 989.4e12), ("NVIDIA H100 PCIe", 756e12),
                                           ("NVIDIA H200", 989.4e12)])
def test_peaks_by_device_kind(kind, expected):
    check = load_script(ROOT / "benchmarks" / "device" / "check.py")
    pk = check.peaks({"platform": "gpu", "device": kind}, tiny=False)
    assert pk["peak_flops"] == expected and pk["peak_bandwidth"] > 1e12
    assert check.peaks({"platform": "gpu", "device": "Some GPU"}, tiny=False)["peak_flops"] is None


def test_a_check_that_fails_with_cudnn_attention_runs_again_with_xla(monkeypatch):
    from star_haiku_xmap.model import layers

    check = load_script(ROOT / "benchmarks" / "device" / "check.py")
    calls = []

    def fn():
        calls.append(os.environ.get(layers.ATTENTION_ENV))
        if len(calls) == 1:
            raise RuntimeError("cuDNN: unsupported")
        return {"tokens_per_s": 1.0}

    monkeypatch.setenv(layers.ATTENTION_ENV, "cudnn")
    row = check.with_fallback(fn)
    assert calls == ["cudnn", "xla"] and row == {"tokens_per_s": 1.0, "cudnn_error": "RuntimeError: cuDNN: unsupported"}
    monkeypatch.setenv(layers.ATTENTION_ENV, "reference")  # not cuDNN's failure: the error stands
    calls.clear()
    with pytest.raises(RuntimeError):
        check.with_fallback(fn)
