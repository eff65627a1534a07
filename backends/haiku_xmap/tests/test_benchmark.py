"""benchmarks/gptj_throughput.py runs end to end at a tiny shape and prints the
JSON line the README's speed table comes from (no --peer: torch is optional)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gptj_throughput.py"


def test_benchmark_prints_one_json_line_with_throughputs_and_mfu():
    args = ["--layers", "1", "--d-model", "32", "--heads", "2", "--rotary-dim", "8", "--vocab", "64",
            "--gen-batch", "4", "--prompt", "8", "--new-tokens", "8", "--train-batch", "2", "--train-seq", "16",
            "--repeats", "2", "--train-steps", "2", "--cpu-devices", "2"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])
    assert result["mesh"] == {"dp": 2, "mp": 1}
    for key in ("generate_tokens_per_s", "train_tokens_per_s", "generate_compile_s", "train_compile_s", "mfu"):
        assert result[key] > 0, (key, result)
    assert result["shape"]["gen_batch"] == 4 and result["threads"] >= 1
    assert "generate_ratio_jax_over_hf" not in result  # only with --peer
