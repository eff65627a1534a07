"""glibc's huge pages for XLA:CPU (``with_hugepages``), how many XLA:CPU devices a process exposes (one
per core by default, so that a dp mesh splits batches over the cores), multi-process JAX and
its heartbeat, the persistent compilation cache, the mesh. Each must run before jax starts
its backends; building the backend (``star-engine validate``) does none of it.

**Huge pages.** XLA:CPU allocates a fresh buffer for every step's temporaries and faults it
in page by page; with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` malloc asks for huge pages
(THP in ``madvise`` mode), which made CPU training and generation faster with bit-identical
results (docs/performance.md). glibc reads its tunables only at process start, so the
``star-engine`` command runs itself again once with the tunable added (``exec``: same pid,
same arguments) when the run starts the backend, before it writes anything; it sets
``star_engine.helpers.RERUN_ENV`` so that the command's notes are not said again.
``STAR_ENGINE_HUGEPAGES=0`` leaves malloc as it is; a ``glibc.malloc.hugetlb`` already in
``GLIBC_TUNABLES`` is kept as given. On a machine with an accelerator
(``accelerator_present``) it stays off: the host's malloc is not where such a run spends
its time.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

from star_engine.helpers import RERUN_ENV

HUGETLB = "glibc.malloc.hugetlb=1"
OPT_OUT = "STAR_ENGINE_HUGEPAGES"
# Device files of an NVIDIA GPU, an AMD GPU (ROCm) and a TPU (accel driver).
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/kfd", "/dev/accel0")
COMMAND = "star-engine"  # the console script; ``python -m star_engine`` is the same command


def accelerator_present(devices: tuple[str, ...] = ACCELERATOR_DEVICES) -> bool:
    """Whether this machine has a GPU or TPU (its driver's device file), without starting
    any framework: CPU-only tuning (huge pages, one XLA:CPU device per core) stays off there."""
    return any(os.path.exists(d) for d in devices)


def hugepages_environ(environ: Mapping[str, str], accelerator: bool | None = None) -> dict[str, str] | None:
    """The environment to run again with, or None when nothing changes (opted
    out, not Linux with glibc, an accelerator present, or the tunable already set
    either way). ``accelerator``: default ``accelerator_present()``."""
    if environ.get(OPT_OUT, "1").strip() == "0":
        return None
    if accelerator_present() if accelerator is None else accelerator:
        return None
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in tunables:
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(x for x in (tunables, HUGETLB) if x), RERUN_ENV: "1"}


def is_command() -> bool:
    """Whether this process is the ``star-engine`` command (its console script, or
    ``python -m star_engine``): only it may run itself again (never a test session, a
    notebook, a benchmark that uses the backend)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "star_engine.__main__" or os.path.basename(sys.argv[0]) == COMMAND


def with_hugepages() -> None:
    """Run this process's command line again with the tunable (returns only when
    nothing is to change, or when exec fails: then malloc stays as it is)."""
    env = hugepages_environ(os.environ)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError:
        pass


def default_cpu_devices() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
