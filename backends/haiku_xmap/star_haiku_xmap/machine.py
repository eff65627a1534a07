"""This machine for XLA, and the backend's runtime start-up (``start_runtime``): glibc's
huge pages for XLA:CPU (``with_hugepages``), how many XLA:CPU devices a process exposes (one
per core by default, so that a dp mesh splits batches over the cores), multi-process JAX and
its heartbeat, the persistent compilation cache, the mesh. Each must run before jax starts
its backends; building the backend (``star-engine validate``) does none of it.

**Huge pages.** XLA:CPU allocates a fresh buffer for every step's temporaries and faults it
in page by page; with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` malloc asks for huge pages
(THP in ``madvise`` mode), which made CPU training and generation faster with bit-identical
results (docs/performance.md). glibc reads its tunables only at process start, so the
``star-engine`` command runs itself again once with the tunable added (``exec``: same pid,
same arguments) when the run starts the backend, before it writes anything.
``STAR_ENGINE_HUGEPAGES=0`` leaves malloc as it is; a ``glibc.malloc.hugetlb`` already in
``GLIBC_TUNABLES`` is kept as given. On a machine with an accelerator
(``accelerator_present``) it stays off: the host's malloc is not where such a run spends
its time.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from typing import Any, cast
from collections.abc import Mapping

from star_engine import UserError
from star_engine.helpers import is_int

from . import distributed as dist
from .options import MAX_CPU_DEVICES

HUGETLB = "glibc.malloc.hugetlb=1"
OPT_OUT = "STAR_ENGINE_HUGEPAGES"
# Device files of an NVIDIA GPU, an AMD GPU (ROCm) and a TPU (accel driver).
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/kfd", "/dev/accel0")
COMMAND = "star-engine"  # the console script; ``python -m star_engine`` is the same command


@dataclass(frozen=True)
class Runtime:
    """What start-up made: the mesh, and the ``jax.distributed`` arguments (None: one process)."""

    mesh: Any
    distributed: dict | None


def start_runtime(options: Any) -> Runtime:
    """Start what a run needs of this machine, for ``[model]`` ``options`` (``ModelOptions``),
    in this order: XLA:CPU's device count, multi-process JAX, the heartbeat the other
    processes' barriers watch, the compilation cache, then the mesh (which lists the devices)."""
    from . import sharding

    if options.cpu_devices is not None:
        set_cpu_devices(options.cpu_devices)
    elif dist.resolve_options(options.distributed) is None:
        use_every_core(options.mesh)
    distributed = dist.initialize(options.distributed)
    use_compile_cache()
    if distributed:  # the other processes' barriers see this one alive from now on
        from .coordination import start_heartbeat

        start_heartbeat()
    try:
        mesh = sharding.make_mesh({"dp": -1, "mp": 1} if options.mesh is None else dict(options.mesh))
    except ValueError as exc:
        raise UserError(f"model.mesh: {exc}", key="model.mesh") from None
    return Runtime(mesh, distributed)


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
    return {**environ, "GLIBC_TUNABLES": ":".join(x for x in (tunables, HUGETLB) if x)}


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


def set_cpu_devices(n: Any) -> None:
    """Expose ``n`` XLA:CPU devices in this process (``[model] cpu_devices``), so
    that a dp mesh splits the batch over the cores. XLA:CPU runs the small
    matmuls and the one-query attention of decoding on about one core per
    device (its intra-op threads barely help at these sizes), so on 2 cores a
    2-device mesh decodes ~1.6x faster than one device. Must run before jax
    starts its backends; later, the process must already have ``n`` CPU devices."""
    if not is_int(n) or not 1 <= n <= MAX_CPU_DEVICES:
        raise UserError(f"model.cpu_devices: must be an int in [1, {MAX_CPU_DEVICES}], got {n!r}",
                        key="model.cpu_devices")  # the [model] table is checked alike (options.resolve)
    import jax  # this module loads with the plugin, which must not import jax (discovery stays fast)

    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # backends already started (e.g. a second backend in one process)
        have = len(jax.devices("cpu"))
        if have != n:
            raise UserError(f"model.cpu_devices: jax already started in this process with {have} CPU "
                            f"device(s), not {n}; set it before anything uses jax", key="model.cpu_devices") from None


def default_cpu_devices() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def use_every_core(mesh: Mapping[str, Any] | None = None) -> None:
    """``model.cpu_devices`` left unset: one XLA:CPU device per core
    (``default_cpu_devices``), unless jax has already started its backends or the
    count is set elsewhere (``XLA_FLAGS=--xla_force_host_platform_device_count``, or the machine
    has a GPU or TPU: ``accelerator_present``,
    ``JAX_NUM_CPU_DEVICES``). A mesh with both sizes given (``{dp = 1, mp = 1}``)
    asks for exactly dp x mp devices instead. The same machine and setting give the
    same mesh."""
    import jax  # as set_cpu_devices
    from jax._src import xla_bridge

    if accelerator_present():  # the mesh is the GPU's or TPU's devices: XLA:CPU's count stays as it is
        return
    if ("xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
            or cast(Any, jax.config).jax_num_cpu_devices != -1 or xla_bridge.backends_are_initialized()):
        return
    sizes: list[Any] = [mesh.get(a) for a in ("dp", "mp")] if isinstance(mesh, Mapping) else []
    if len(sizes) == 2 and all(is_int(v) and v > 0 for v in sizes):
        jax.config.update("jax_num_cpu_devices", sizes[0] * sizes[1])
    else:
        jax.config.update("jax_num_cpu_devices", default_cpu_devices())


def use_compile_cache() -> None:
    """JAX's persistent compilation cache, so that a second run (or the ablation run
    after the main one) loads the compiled steps instead of compiling them again:
    ``STAR_HAIKU_XMAP_COMPILE_CACHE`` names the folder (default
    ``$XDG_CACHE_HOME/star-engine/jax``, i.e. ``~/.cache/star-engine/jax``); ``0`` or
    an empty value turns it off. A loaded executable is the one that was compiled,
    so results do not change. A cache folder already configured is kept."""
    import jax  # as set_cpu_devices

    folder = os.environ.get("STAR_HAIKU_XMAP_COMPILE_CACHE")
    if folder is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "star-engine", "jax")
    if folder in ("", "0") or cast(Any, jax.config).jax_compilation_cache_dir:
        return
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:  # an unwritable home: run without the cache
        return
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
