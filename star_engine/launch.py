"""The ``star-engine`` console entry: glibc's malloc set to back large blocks with
transparent huge pages, then the command line (``cli.main``).

XLA:CPU allocates a fresh buffer for every step's temporaries and faults it in
page by page; with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` malloc asks for huge
pages (THP in ``madvise`` mode), which made the GPT-J backend's CPU training and
generation faster with bit-identical results (docs/performance.md). glibc reads
its tunables only at process start, so the command runs itself again once with
the tunable added (``exec``: same pid, same arguments). ``STAR_ENGINE_HUGEPAGES=0``
leaves malloc as it is; a ``glibc.malloc.hugetlb`` already in ``GLIBC_TUNABLES``
is kept as given. On a machine with an accelerator (``accelerator_present``) it stays
off: the host's malloc is not where such a run spends its time.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

HUGETLB = "glibc.malloc.hugetlb=1"
OPT_OUT = "STAR_ENGINE_HUGEPAGES"
# Device files of an NVIDIA GPU, an AMD GPU (ROCm) and a TPU (accel driver).
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/kfd", "/dev/accel0")


def accelerator_present(devices: tuple[str, ...] = ACCELERATOR_DEVICES) -> bool:
    """Whether this machine has a GPU or TPU (its driver's device file), without starting
    any framework: CPU-only tuning (huge pages here, one XLA:CPU device per core in the
    haiku_xmap backend) stays off there."""
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
    return {**environ, "GLIBC_TUNABLES": ":".join(x for x in (tunables, HUGETLB) if x)}


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


def main() -> int:
    with_hugepages()
    from .cli import main as cli_main

    return cli_main()
