"""This machine for XLA, and the backend's runtime start-up (``start_runtime``): glibc's
huge pages for XLA:CPU (``with_hugepages``), how many XLA:CPU devices a process exposes (one
per core by default, so that a dp mesh splits batches over the cores), multi-process JAX and
its heartbeat, the persistent compilation cache, the mesh. Each must run before jax starts
its backends; building the backend (``star-engine validate``) does none of it.

Huge pages are ``hugepages.py``'s (re-exported here).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast
from collections.abc import Mapping

import jax
from jax._src import xla_bridge

from star_engine import UserError
from star_engine.helpers import is_int

from ..options import MAX_CPU_DEVICES
from . import distributed as dist
from ..runtime import sharding
from ..runtime.coordination import start_heartbeat
from ..runtime.envvars import star_cache_dir
from ..runtime.hugepages import (ACCELERATOR_DEVICES, COMMAND, HUGETLB, OPT_OUT, accelerator_present,  # noqa: F401
                                 default_cpu_devices, hugepages_environ, is_command, with_hugepages)


@dataclass(frozen=True)
class Runtime:
    """What start-up made: the mesh, the ``jax.distributed`` arguments (None: one process) and
    the mesh fine-tuning runs on (``[model] train_mesh``: a sub-mesh; else the mesh itself)."""

    mesh: Any
    distributed: dict | None
    train_mesh: Any


def start_runtime(options: Any) -> Runtime:
    """Start what a run needs of this machine, for ``[model]`` ``options`` (``ModelOptions``),
    in this order: XLA:CPU's device count, multi-process JAX, the heartbeat the other
    processes' barriers watch, the compilation cache, then the mesh (which lists the devices)."""
    if options.cpu_devices is not None:
        set_cpu_devices(options.cpu_devices)
    elif dist.resolve_options(options.distributed) is None:
        use_every_core(options.mesh)
    distributed = dist.initialize(options.distributed)
    use_compile_cache()
    if distributed:  # the other processes' barriers see this one alive from now on
        start_heartbeat()
    try:
        mesh = sharding.make_mesh({"dp": -1, "mp": 1} if options.mesh is None else dict(options.mesh))
    except ValueError as exc:
        raise UserError(f"model.mesh: {exc}", key="model.mesh") from None
    if getattr(options, "decode_attention", "dense") == "ragged":
        if int(mesh.shape["mp"]) > 1:
            raise UserError(f"model.decode_attention: 'ragged' needs mp = 1; this mesh has mp = {mesh.shape['mp']}",
                            key="model.decode_attention")
        from ..kernels.ragged import register

        register()
    return Runtime(mesh, distributed, train_mesh(mesh, options.train_mesh))


def train_mesh(mesh: Any, shape: Mapping[str, Any] | None) -> Any:
    """The mesh of ``[model] train_mesh``: ``{dp, mp}`` over the first dp x mp devices of
    ``mesh`` (one process only: a sub-mesh of a multi-process mesh would leave processes out);
    None: ``mesh`` itself."""
    if shape is None:
        return mesh
    devices = list(mesh.devices.flat)
    n = int(shape["dp"]) * int(shape["mp"])
    if jax.process_count() > 1:
        raise UserError("model.train_mesh: a sub-mesh for training needs a single process "
                        f"(this run has {jax.process_count()}); leave it unset", key="model.train_mesh")
    if n > len(devices):
        raise UserError(f"model.train_mesh: dp x mp = {n} devices, but the run's mesh has {len(devices)}",
                        key="model.train_mesh")
    return sharding.make_mesh(dict(shape), devices=devices[:n])


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

    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # backends already started (e.g. a second backend in one process)
        have = len(jax.devices("cpu"))
        if have != n:
            raise UserError(f"model.cpu_devices: jax already started in this process with {have} CPU "
                            f"device(s), not {n}; set it before anything uses jax", key="model.cpu_devices") from None


def use_every_core(mesh: Mapping[str, Any] | None = None) -> None:
    """``model.cpu_devices`` left unset: one XLA:CPU device per core
    (``default_cpu_devices``), unless jax has already started its backends or the
    count is set elsewhere (``XLA_FLAGS=--xla_force_host_platform_device_count``, or the machine
    has a GPU or TPU: ``accelerator_present``,
    ``JAX_NUM_CPU_DEVICES``). A mesh with both sizes given (``{dp = 1, mp = 1}``)
    asks for exactly dp x mp devices instead. The same machine and setting give the
    same mesh."""

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

    folder = os.environ.get("STAR_HAIKU_XMAP_COMPILE_CACHE")
    if folder is None:
        folder = star_cache_dir("jax")
    if folder in ("", "0") or cast(Any, jax.config).jax_compilation_cache_dir:
        return
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:  # an unwritable home: run without the cache
        return
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
