"""What machine a run ran on, in the words ``lscpu`` uses: the CPU model and the CPUs this process
may use (the run's summary and its ``run_finished`` event say it beside the wall time, since
timings and XLA:CPU's floating-point results differ from one CPU to another)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
_KEYS = ("model name", "Model", "Hardware", "cpu model")  # x86; ARM boards; some ARM kernels; MIPS


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name`` on Linux x86, as ``lscpu``
    prints it); else what ``platform`` knows; "unknown CPU" when nothing says."""
    try:
        text = cpuinfo.read_text(errors="replace")[:1 << 20]
    except OSError:
        text = ""
    for key in _KEYS:
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, as a container or ``taskset`` limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def clock(seconds: float) -> str:
    """``13 min 40 s``, ``2 h 05 min``, ``41 s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def ran_on(seconds: float, gflops: float | None = None) -> str:
    """The summary's last line: the machine (with its fp32 matmul speed when the backend
    measured it) and this command's wall time."""
    cpus = usable_cpus()
    speed = f", {gflops:,.0f} fp32 GFLOP/s" if gflops else ""
    return f"ran on {cpu_model()} ({cpus} CPU{'s' if cpus != 1 else ''}{speed}): {clock(seconds)} wall"


def expected_time(minutes: float, at_gflops: float, gflops: float) -> str:
    """The line a run prints at start: ``minutes`` measured at ``at_gflops`` scaled to this
    machine's ``gflops`` (a run of small matmuls scales with the CPU's matmul speed to first
    order; the speed is measured under whatever else runs now, so the estimate includes that
    load as it is at start)."""
    estimate = minutes * at_gflops / gflops * 60
    return (f"expected: ~{clock(estimate)} on this CPU ({cpu_model()}: {gflops:,.0f} fp32 GFLOP/s measured now; "
            f"{clock(minutes * 60)} at {at_gflops:,.0f}, experiment.expected_minutes)")
