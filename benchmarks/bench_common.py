"""Pieces the benchmarks share: machine facts, timing, interleaved rounds against
a peer, paired ratios, malloc settings, and a child process that serves timed
calls (the HF transformers side runs in one, so that the two runtimes' thread
pools never compete)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable, Sequence


def threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thp_mode() -> str:
    """The kernel's transparent huge page mode (the bracketed word), or "unknown"."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        return text.split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed(fn) -> tuple[float, float]:
    """(wall, CPU) seconds of one call. CPU time (all threads of this process)
    barely moves with other processes' load, wall time does."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def logged(what: str, fn):
    """``fn`` (returning ``timed``'s pair) that also reports its times on stderr (a long run shows
    progress)."""
    def call():
        t = fn()
        print(f"{what}: {t[0]:.2f} s wall, {t[1]:.2f} s CPU, load {os.getloadavg()[0]:.1f}", file=sys.stderr,
              flush=True)
        return t

    return call


def first_call(fn) -> float:
    return timed(fn)[0]


def timings(fn, n: int) -> tuple[float, float]:
    """(best, median) wall seconds of ``n`` calls. Throughputs use the best call: on
    a shared machine it is the least disturbed by other processes."""
    walls = [timed(fn)[0] for _ in range(n)]
    return min(walls), statistics.median(walls)


def matmul_peak(dtype: str, libraries=("xla", "numpy")) -> dict[str, float]:
    """Best FLOP/s of square matmuls per library (numpy only for fp32)."""
    import numpy as np

    peaks: dict[str, float] = {}
    for n in (1024, 2048):
        x = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
        if "xla" in libraries:  # the measurement a run names (Backend.matmul_gflops), best of 5 calls here
            from star_haiku_xmap.runtime.speed import matmul_gflops

            peaks["xla"] = max(peaks.get("xla", 0.0), matmul_gflops(sizes=(n,), calls=5, dtype=dtype) * 1e9)
        if "numpy" in libraries and dtype == "float32":
            t, _ = timings(lambda: x @ x, 5)  # noqa: B023
            peaks["numpy"] = max(peaks.get("numpy", 0.0), 2 * n ** 3 / t)
        if "torch" in libraries:
            import torch

            xt = torch.from_numpy(x).to(getattr(torch, dtype))
            xt @ xt
            t, _ = timings(lambda: xt @ xt, 5)  # noqa: B023
            peaks["torch"] = max(peaks.get("torch", 0.0), 2 * n ** 3 / t)
    return peaks


def rotate(sides: Sequence[Callable[[], tuple[float, float]]], rounds: int) -> list[list[tuple[float, float]]]:
    """(wall, CPU) of each side's calls, one call per side per round; the order
    rotates and reverses from round to round (ABBA for two sides), so that slow
    drifts in load hit every side alike. A short pause between calls lets the
    previous runtime's spinning threads go to sleep."""
    out: list[list[tuple[float, float]]] = [[] for _ in sides]
    n = len(sides)
    for r in range(rounds):
        order = [(r // 2 + j) % n for j in range(n)]
        for side in (order if r % 2 == 0 else order[::-1]):
            time.sleep(0.05)
            out[side].append(sides[side]())
    return out


def interleave(jax_fn, hf_call, rounds: int) -> tuple[list, list]:
    """``rotate`` for a local function and a peer call (its reply's "s" and "cpu")."""
    def peer():
        reply = hf_call()
        return reply["s"], reply["cpu"]

    tj, th = rotate([lambda: timed(jax_fn), peer], rounds)
    return tj, th


def summarise(prefix: str, times: list, tokens: int) -> dict:
    walls, cpus = [t[0] for t in times], [t[1] for t in times]
    best, med = min(walls), statistics.median(walls)
    return {f"{prefix}_s": round(best, 4), f"{prefix}_tokens_per_s": round(tokens / best, 1),
            f"{prefix}_tokens_per_s_median": round(tokens / med, 1), f"{prefix}_cpu_s": round(min(cpus), 4)}


def paired_ratio(fast_times: list, slow_times: list, index: int) -> float:
    """Median over rounds of slow / fast (index 0: wall time, 1: CPU time)."""
    return round(statistics.median(h[index] / j[index] for j, h in zip(fast_times, slow_times)), 2)


# ----------------------------------------------------------------------------- malloc

HUGETLB = "glibc.malloc.hugetlb=1"
MALLOC_MODES = ("default", "retain", "hugepages")
MALLOC_HELP = ("glibc malloc settings for both runtimes. XLA:CPU maps (and page-faults in) a fresh temporary "
               "buffer of the whole step on every call; retain: one arena, never mmap or trim, so the buffer is "
               "reused; hugepages: GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (transparent huge pages for malloc'd "
               "memory, when THP is in madvise mode)")


def retain_malloc() -> None:
    """Keep freed memory in glibc's heap for reuse. Must run before any thread
    starts (threads pick their arena at their first malloc)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
    ok = libc.mallopt(M_ARENA_MAX, 1) and libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1)
    if not ok:
        raise SystemExit("mallopt failed")


def apply_malloc(mode: str, script: str, argv: Sequence[str]) -> None:
    """Set ``mode`` up for this process and its children: mallopt now
    ("retain"), or run ``script argv`` again with the glibc tunable
    ("hugepages": glibc reads its tunables at process start; exec keeps the pid)."""
    if mode == "retain":
        retain_malloc()
    if mode == "hugepages" and HUGETLB not in os.environ.get("GLIBC_TUNABLES", ""):
        tunables = ":".join(x for x in (os.environ.get("GLIBC_TUNABLES"), HUGETLB) if x)
        os.execve(sys.executable, [sys.executable, str(Path(script).resolve()), *argv],
                  dict(os.environ, GLIBC_TUNABLES=tunables))


# ----------------------------------------------------------------------------- peer process


def serve(calls: dict[str, Callable[[], dict]]) -> None:
    """Child process: answer one request line at a time with the JSON reply of
    ``calls[line]`` (an unknown line or end of input ends the loop)."""
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        fn = calls.get(line.strip())
        if fn is None:
            break
        print(json.dumps(fn()), flush=True)


def timed_reply(fn) -> Callable[[], dict]:
    """A ``serve`` call that times ``fn`` and replies {"s", "cpu"}."""
    return lambda: dict(zip(("s", "cpu"), timed(fn)))


class Peer:
    """A child process running ``script serve_flag argv`` (``serve``), driven one call at a time."""

    def __init__(self, script: str | Path, argv: Sequence[str], wait_policy: str = "default",
                 serve_flag: str = "--hf-serve"):
        env = dict(os.environ)
        if wait_policy == "passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        self.wait_policy = wait_policy
        cmd = [sys.executable, str(script), serve_flag, *argv]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both PIPE
        self.to_child, self.from_child = self.proc.stdin, self.proc.stdout

    def ready(self) -> Peer:
        self._read()  # {"ready": true} once the child has built and warmed up its workloads
        return self

    def _read(self) -> dict:
        line = self.from_child.readline()
        if not line:
            raise SystemExit(f"peer process died (exit code {self.proc.wait()})")
        return json.loads(line)

    def ask(self, cmd: str) -> dict:
        self.to_child.write(cmd + "\n")
        self.to_child.flush()
        return self._read()

    def close(self) -> None:
        self.to_child.close()
        self.proc.wait()


def choose_peers(peers: list[Peer], cmds: Sequence[str]) -> dict[str, Peer]:
    """The faster peer per command, from one probe call of each (the HF side gets
    its best OpenMP wait policy for the load of the moment); the others are closed."""
    if len(peers) == 1:
        return {cmd: peers[0] for cmd in cmds}
    chosen = {cmd: min(peers, key=lambda p: p.ask(cmd)["s"]) for cmd in cmds}
    for p in peers:
        if p not in chosen.values():
            p.close()
    return chosen
