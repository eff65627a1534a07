"""The GPU check: what one accelerator does with the haiku_xmap backend, as JSON lines.

Run through ``check.sh`` (which installs what the machine lacks); every figure names
the device it was measured on. Checks, in this order (each one line of
``OUT/check.jsonl``; a check that fails writes its error and the others still run):

- ``parity``: GPT-J and Llama-style tiny configs, fp32, logits on the default device
  against the same parameters on the CPU (max |diff|, at "highest" matmul precision
  and at the platform's default, which is TF32 on NVIDIA GPUs);
- ``train``: tokens/s and MFU of a Qwen2.5-1.5B-shaped model with random weights,
  bf16 compute, fp32 master weights and AdamW, packed rows of ``--train-seq`` tokens;
- ``train_lora``: Llama-3.1-8B-shaped, LoRA rank 32 on every projection over the frozen
  bf16 base (MFU with 4 N + 12 L H Q T a token: no weight gradients for the base);
- ``generate``: continuous batching at the 1.5B shape: ``--prompts`` prompts of ~400
  tokens, k samples each sharing one prefill, ``--new-tokens`` new tokens; useful
  tokens/s and the fraction of the memory-bandwidth bound (weights and KV cache read
  per decode step) it reaches;
- ``addition_demo``: ``experiments/addition.toml`` whole, wall time and final
  accuracy (within what is left of ``--budget``; a run cut short says so).

``--tiny`` runs the same code at tiny shapes (about a minute on a CPU): the default
test suite runs it, so the script cannot rot. FLOPs (PaLM appendix B, as nanoGPT's
``estimate_mfu``): 6 N + 12 L H Q T per trained token, N the matmul parameters with
the LM head once. Peaks: the GPU's dense bf16 datasheet figure (``PEAKS``); on a CPU
the best bf16 matmul XLA runs here, and no bandwidth bound.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import device_workloads as workloads  # noqa: E402  (beside this file)

# device_kind substring -> (dense bf16 FLOP/s, memory bytes/s), from the datasheets
# (../shared/REFERENCE.md "MFU and GPU peaks"). First match wins: PCIe before H100.
PEAKS = (
    ("H100 PCIe", 756e12, 2.0e12),
    ("H100", 989.4e12, 3.35e12),
    ("H200", 989.4e12, 4.8e12),
)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder for check.jsonl (created)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes: the CPU self-test (about a minute)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole check; the demo gets what is left (default 520, --tiny 240)")
    ap.add_argument("--only", default=None, help="comma-separated checks to run (default: all)")
    ap.add_argument("--train-steps", type=int, default=None, help="timed training steps (default 8, --tiny 3)")
    ap.add_argument("--train-rows", type=int, default=None, help="rows per micro-batch (default 8, --tiny 4)")
    ap.add_argument("--train-accum", type=int, default=None, help="micro-batches per step (default 2, --tiny 2)")
    ap.add_argument("--slots", type=int, default=None, help="continuous-batching slots (default 512, --tiny 16)")
    ap.add_argument("--in-process", action="store_true", help="run the checks in this process (default: one "
                    "child process each)")
    ap.add_argument("--row-to", type=Path, default=None, help=argparse.SUPPRESS)  # a child's row, for its parent
    a = ap.parse_args(argv)
    d = ({"budget": 240.0, "train_steps": 3, "train_rows": 4, "train_accum": 2, "slots": 16} if a.tiny else
         {"budget": 520.0, "train_steps": 8, "train_rows": 8, "train_accum": 2, "slots": 512})
    for k, v in d.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


CHECKS = ("parity", "train", "train_lora", "generate", "addition_demo")


class Recorder:
    """Appends one JSON object a line to ``out/check.jsonl`` (flushed, so a killed run
    keeps every finished check) and echoes it."""

    def __init__(self, out: Path, common: dict):
        out.mkdir(parents=True, exist_ok=True)
        self.path, self.common = out / "check.jsonl", common

    def write(self, check: str, row: dict) -> None:
        line = json.dumps({"check": check, **row, **self.common}, sort_keys=False)
        with self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        print(line, flush=True)


def device_facts() -> dict:
    import jax

    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", dev.platform)
    facts = {"platform": dev.platform, "device": kind, "devices": jax.device_count(),
             "jax": jax.__version__, "date": datetime.date.today().isoformat()}
    if dev.platform == "cpu":
        from bench_common import cpu_name, threads

        facts["device"] = f"cpu: {cpu_name()}"
        facts["threads"] = threads()
    return facts


def peaks(facts: dict, tiny: bool) -> dict:
    """Peak FLOP/s and bandwidth for the MFU and the bandwidth fraction, with where they come from."""
    for name, flops, bw in PEAKS:
        if facts["platform"] == "gpu" and name.lower() in facts["device"].lower():
            return {"peak_flops": flops, "peak_bandwidth": bw, "peak_source": f"datasheet ({name})"}
    if facts["platform"] == "cpu":
        from bench_common import matmul_peak

        return {"peak_flops": matmul_peak("bfloat16", ("xla",))["xla"], "peak_bandwidth": None,
                "peak_source": "measured XLA bf16 matmul on this CPU"}
    return {"peak_flops": None, "peak_bandwidth": None, "peak_source": f"unknown device {facts['device']!r}"}


def memory_used() -> dict:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return {k: stats[k] for k in ("peak_bytes_in_use", "bytes_limit") if k in stats}


def run_demo(a: argparse.Namespace, deadline: float) -> dict:
    """``experiments/addition.toml`` in a child process until it ends or ``deadline``;
    --tiny shrinks it to one short iteration."""
    import shutil
    import signal
    import subprocess
    import tempfile

    run_dir = Path(tempfile.mkdtemp(prefix="star-demo-")) / "run"
    cmd = [sys.executable, "-m", "star_engine", "run", str(ROOT / "experiments" / "addition.toml"),
           "--set", f"experiment.output_dir={json.dumps(str(run_dir))}"]
    if a.tiny:
        cmd += ["--limit", "12", "--set", "experiment.iterations=1", "--set", "base_training.steps=4",
                "--set", "generation.n_train_samples=12", "--set", "training.schedule.start_steps=2"]
        # (the model stays the file's: a committed base checkpoint fixes its shape)
    left = deadline - time.monotonic()
    if left < 30:
        return {"skipped": f"{left:.0f} s left of --budget"}
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                             env={**os.environ, "STAR_HAIKU_XMAP_COMPILE_CACHE": "0"})
    try:
        out, _ = child.communicate(timeout=left)
        finished = child.returncode == 0
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGINT)  # the engine stops cleanly on Ctrl-C
        try:
            out, _ = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
        finished = False
    wall = time.perf_counter() - t0
    row = {"finished": finished, "returncode": child.returncode, "wall_s": round(wall, 1),
           "command": " ".join(cmd[1:])}
    row.update(workloads.demo_accuracy(run_dir))
    if not finished:
        row["output_tail"] = out[-1500:]
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    return row


def with_fallback(fn) -> dict:
    """``fn()``'s row; when it fails with cuDNN's attention (a shape, version or compile it
    does not take), once more with XLA's, the failure recorded as ``cudnn_error``: the
    check's figures are worth more than the first attempt's error."""
    try:
        return fn()
    except Exception as e:
        from star_haiku_xmap.model.layers import ATTENTION_ENV, attention_kind

        if attention_kind() != "cudnn":
            raise
        import jax

        os.environ[ATTENTION_ENV] = "xla"
        jax.clear_caches()
        row = fn()
        row["cudnn_error"] = f"{type(e).__name__}: {e}"[:500]
        return row


def run_one(a: argparse.Namespace, check: str, deadline: float) -> dict:
    """One check in this process: its figures, or its error."""
    pk = peaks(device_facts(), a.tiny) if check in ("train", "train_lora", "generate") else {}
    try:
        if check == "parity":
            row = workloads.parity()
        elif check == "train":
            row = with_fallback(lambda: workloads.train(workloads.shape("train", a.tiny), a, pk))
        elif check == "train_lora":
            row = with_fallback(lambda: workloads.train_lora(a, pk))
        elif check == "generate":
            row = with_fallback(lambda: workloads.generate(workloads.shape("generate", a.tiny), a, pk))
        else:
            row = run_demo(a, deadline)
        if check != "addition_demo":
            row.update(memory_used())
    except Exception as e:  # one check's failure is a figure too; the others still run
        row = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
    # The device's facts last: the demo's child process must find the GPU's memory free, and
    # a process that starts JAX on a GPU takes most of it.
    return {**device_facts(), **row}


def main(argv=None) -> int:
    """Each check in a child process of its own (``--in-process`` runs it here): device
    memory is returned between checks, and one that dies (out of memory) is a line too."""
    import subprocess

    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    start = time.monotonic()
    deadline = start + a.budget
    only = [c for c in CHECKS if a.only is None or c in a.only.split(",")]
    unknown = set(a.only.split(",") if a.only else ()) - set(CHECKS)
    if unknown:
        print(f"--only: unknown check(s) {sorted(unknown)}; known: {list(CHECKS)}", file=sys.stderr)
        return 2
    rec = Recorder(a.out, {"tiny": a.tiny})
    failed = 0
    for check in only:
        t0 = time.perf_counter()
        if a.in_process:
            row = run_one(a, check, deadline)
        else:
            left = max(deadline - time.monotonic(), 1.0)
            row_file = a.out / f".{check}.json"
            rc: int | str  # the exit code, or why there is none
            try:
                rc = subprocess.run([sys.executable, __file__, *argv, "--only", check, "--in-process",
                                     "--budget", f"{left:.1f}", "--row-to", str(row_file)],
                                    timeout=left + 120).returncode
            except subprocess.TimeoutExpired:
                rc = "a timeout"
            row = (json.loads(row_file.read_text()) if row_file.is_file() else
                   {"error": f"the check's process ended with {rc} and wrote nothing"})
            row_file.unlink(missing_ok=True)
        failed += "error" in row
        row["check_s"] = round(time.perf_counter() - t0, 1)
        if a.row_to is not None:
            a.row_to.write_text(json.dumps(row))
        else:
            rec.write(check, row)
    if a.row_to is None:
        print(f"check: {rec.path} ({failed} failed, {time.monotonic() - start:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
