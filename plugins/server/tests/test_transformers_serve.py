"""``[generation] engine = "server"`` end to end with a real ``transformers serve`` (CPU): a tiny
addition run sampled through the server gives the built-in sampler's greedy texts, each row
naming the exported folder's hash and the server; a server killed mid-stage stops the run with
one line and a rerun resumes from the stored chunks; a server serving other weights is refused
before anything is sampled; Ctrl-C stops the server the run started. Slow (minutes on 2 cores)."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_server import ServerProcess

try:
    import psutil
except ImportError:  # the /proc scan below
    psutil = None

ROOT = Path(__file__).resolve().parents[3]
MISSING = [m for m in ("transformers", "torch", "fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(MISSING), reason=f"transformers serve needs {', '.join(MISSING)}")]

SCRIPT = Path(sys.executable).parent / "transformers"  # the venv's own console script, not PATH's
SERVE = ([str(SCRIPT)] if os.access(SCRIPT, os.X_OK) else [sys.executable, "-m", "transformers.cli.transformers"])
SERVE += ["serve"]
FLAGS = ["--host", "127.0.0.1", "--port", "{port}", "--device", "cpu"]
# a fixed KV cache: by default continuous batching on a CPU takes 60-90% of the free RAM (OOM beside other work)
BATCHING = ["--continuous-batching", "--cb-num-blocks", "256", "--cb-max-batch-tokens", "1024"]
TIMEOUT = 900
FILES = {"iterations/001/generated.parquet": "rationale", "iterations/001/rationalized.parquet": "rationale",
         "iterations/000/eval_dev.parquet": "generation"}


def run_argv(out: Path, *sets: str) -> list[str]:
    base = [f"experiment.output_dir={json.dumps(str(out))}", "experiment.iterations=1", "base_training.steps=20",
            'training.schedule={name="steady_grow", start_steps=3, add_steps=3}', "generation.n_train_samples=24",
            "task.options.n_dev=12", "generation.max_new_tokens=48", "generation.chunk_size=8", *sets]
    argv = [sys.executable, "-m", "star_engine", "run", str(ROOT / "experiments" / "addition.toml")]
    for s in base:
        argv += ["--set", s]
    return argv


def served_sets(**server: str) -> list[str]:
    if not server:
        command = shlex.join([*SERVE, "{model}", *FLAGS, *BATCHING])
        server = {"command": command, "kind": "transformers", "concurrency": "16"}
    table = ", ".join(f"{k}={json.dumps(v) if k != 'concurrency' else v}" for k, v in server.items())
    return ['generation.engine="server"', f"generation.server={{{table}}}"]


def run(out: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(run_argv(out, *sets), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)


def start(out: Path, *sets: str) -> subprocess.Popen[bytes]:
    """The run in the background, with Ctrl-C's default action as in a terminal (a test suite run
    as a shell's background job inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.stdout", "wb") as so, open(f"{out}.stderr", "wb") as se:
        return subprocess.Popen(run_argv(out, *sets), cwd=ROOT, stdout=so, stderr=se,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def server_pids(served: Path) -> list[int]:
    """The running processes whose command line names ``served`` (a run's exported folders)."""
    needle, found = str(served), []
    if psutil is not None:
        for p in psutil.process_iter(["cmdline", "status"]):
            if p.info["status"] != psutil.STATUS_ZOMBIE and needle in " ".join(p.info["cmdline"] or ()):
                found.append(p.pid)
        return found
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if needle in cmdline and stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def no_server_left(served: Path, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while server_pids(served) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not server_pids(served)


def wait_for(what, proc: subprocess.Popen[bytes], within: float = 600.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        assert proc.poll() is None, f"the run ended (code {proc.returncode}) before it was caught mid-run"
        time.sleep(0.1)
    raise AssertionError(f"not seen within {within:g} s")


def texts(out: Path) -> dict[str, list[tuple]]:
    got = {}
    for rel, col in FILES.items():
        rows = pq.read_table(out / rel).to_pylist()
        got[rel] = sorted((r["question_id"], r.get("sample", 0), r[col]) for r in rows)
    return got


def last_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.strip()][-1]


@pytest.fixture(scope="module", autouse=True)
def transformers_serve_runs() -> None:
    done = subprocess.run([*SERVE, "--help"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.skip(f"{shlex.join(SERVE)} --help failed: {done.stderr.strip()[-300:]}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One run with the built-in sampler, one through ``transformers serve`` (same config)."""
    root = tmp_path_factory.mktemp("runs")
    out = {"builtin": root / "builtin", "server": root / "server"}
    for name, sets in (("builtin", []), ("server", served_sets())):
        done = run(out[name], *sets)
        assert done.returncode == 0, f"{name} run failed:\n{done.stderr[-3000:]}"
    return out


def test_greedy_texts_equal_the_builtin_samplers(runs):
    builtin, server = runs["builtin"], runs["server"]
    assert texts(server) == texts(builtin)
    assert any(t for rows in texts(server).values() for *_, t in rows), "every text is empty: a weak comparison"
    served = json.loads((server / "served" / "served.json").read_text())
    sha = {e.get("folder", k[:16]): e["sha256"] for k, e in served.items()}
    for rel in ("iterations/001/generated.parquet", "iterations/001/rationalized.parquet"):
        rows = pq.read_table(server / rel).to_pylist()
        assert rows
        for r in rows:
            url, folder = r["sampled_by"].split(" ")
            assert url.startswith("http://127.0.0.1:") and Path(folder).parent == server / "served"
            assert r["model_version"] == sha[Path(folder).name]
            assert r["model_checkpoint"].startswith(Path(folder).name)
    assert no_server_left(server / "served")


def test_a_server_killed_mid_stage_stops_the_run_in_one_line_and_a_rerun_resumes(runs, tmp_path):
    out = tmp_path / "run"
    proc = start(out, *served_sets())
    try:
        wait_for(lambda: list((out / "iterations").glob("001/generate/chunk-*.parquet")), proc)
        pids = server_pids(out / "served")
        assert pids, "no server process found while the run samples"
        for pgid in {os.getpgid(p) for p in pids}:
            os.killpg(pgid, signal.SIGKILL)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = Path(f"{out}.stderr").read_text()
    assert code == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    line = last_line(stderr)
    assert line.startswith("error: server http://127.0.0.1:") and "/v1/completions" in line, line
    assert no_server_left(out / "served")
    kept = {c: (c.read_bytes(), pq.read_table(c).to_pylist()) for c in (out / "iterations").glob("*/*/chunk-*.parquet")}
    assert kept
    assert all(c.read_bytes() == b for c, (b, _) in kept.items())  # nothing rewrote them at the failure

    rerun = run(out, *served_sets())
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert texts(out) == texts(runs["builtin"])
    stage_file = {"generate": "generated.parquet", "rationalize": "rationalized.parquet"}
    for chunk, (_, rows) in kept.items():  # the stored chunks were read back, not sampled again
        if chunk.parent.name not in stage_file:
            continue
        final = pq.read_table(out / "iterations" / chunk.parent.parent.name / stage_file[chunk.parent.name]).to_pylist()
        for c in rows:
            assert final[c["index"]]["rationale"] == c["text"]
            assert final[c["index"]]["sampled_by"] == c["sampled_by"]  # the killed server's URL
    assert no_server_left(out / "served")


def test_a_server_serving_other_weights_is_refused(runs, tmp_path):
    other = next(p for p in (runs["server"] / "served").iterdir() if p.is_dir())
    command = shlex.join([*SERVE, "{model}", *FLAGS])
    out = tmp_path / "run"
    with ServerProcess(command, other, tmp_path / "pinned.log", timeout_seconds=300) as pinned:
        url = pinned.url
        done = run(out, "base_training.steps=5", *served_sets(url=url, kind="transformers", load="none"))
        assert pinned.proc is not None and pinned.proc.poll() is None  # the run left the user's server alone
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    line = last_line(done.stderr)
    assert line.startswith(f"error: server {url} does not serve model version"), line
    assert str(other) in line  # what it lists instead
    sampled = [*out.glob("iterations/*/*/chunk-*.parquet"), *out.glob("iterations/*/eval_*.parquet"),
               *out.glob("iterations/*/generated.parquet")]
    assert not sampled, sampled


def test_ctrl_c_stops_the_server_the_run_started(tmp_path):
    out = tmp_path / "run"
    proc = start(out, *served_sets())
    try:
        # The server is up from the first chunk (iteration 0's evaluation) to the run's end: the
        # signal lands with the fine-tuning and two sampling stages still to come. (Waiting for a
        # chunk file instead raced the run's end: a fast stage's chunks go when its file is written.)
        wait_for(lambda: server_pids(out / "served"), proc)
        time.sleep(2)
        assert (out / "served" / "server.log").exists() and proc.poll() is None
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 130, Path(f"{out}.stderr").read_text()[-3000:]
    assert "rerun" in last_line(Path(f"{out}.stderr").read_text())
    assert no_server_left(out / "served")


def test_the_server_generation_benchmark_prints_its_figures():
    """benchmarks/server_generation.py at tiny shapes: one JSON line, every row of the server side
    run to its budget, a ratio for the engine against the server, the versions named."""
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "server_generation.py"), "--rounds", "1",
                          "--addition-requests", "12", "--layers", "1"],
                         capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["server_exact_budgets"] is True and out["useful_tokens"] == out["server_useful_tokens"] > 0
    assert out["engine_over_server"] > 0 and out["engine_tokens_per_s"] > 0 and out["server_tokens_per_s"] > 0
    assert out["transformers"] and out["torch"] and out["cpu"]
