"""Multi-process JAX: start-up, and host <-> global array helpers.

**Initialisation.** ``initialize(option)`` calls ``jax.distributed.initialize``
once, before jax starts its backends, from (in this order of precedence):

1. the ``[model] distributed`` table: ``{coordinator = "host:port", num_processes
   = 2, process_id = 0}`` (every key optional; missing ones come from 2.), or the
   string ``"auto"`` (JAX's own detection: Cloud TPU, SLURM, Open MPI, k8s, and
   ``JAX_COORDINATOR_ADDRESS``);
2. the environment: ``STAR_ENGINE_COORDINATOR``, ``STAR_ENGINE_NUM_PROCESSES``,
   ``STAR_ENGINE_PROCESS_ID`` (and ``STAR_ENGINE_LOCAL_DEVICE_IDS``, comma-separated).

Without either nothing happens (one process). On CPU the cross-process
collectives use gloo (``jax_cpu_collectives_implementation``).

**Arrays across processes.** ``global_array`` / ``place`` build global arrays
from what every process holds; ``to_host`` / ``host_leaves`` bring them back
(collective where an array spans processes). Training with ZeRO-1 on a mesh is
``train.train``'s.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from star_engine import UserError

from ..checkpoint.format import flatten
from ..checkpoint.write import save_checkpoint as save, write_checkpoint
from ..runtime import coordination, sharding
from ..runtime.layout import ENV_COORDINATOR, ENV_LOCAL_DEVICE_IDS, ENV_NUM_PROCESSES, ENV_PROCESS_ID, resolve_options  # noqa: F401

_initialized: dict | None = None


# ----------------------------------------------------------------------------- initialisation


def initialize(option: Any = None, environ: Mapping[str, str] | None = None) -> dict | None:
    """Start multi-process JAX if configured (see the module docstring); idempotent.
    Returns the arguments used, or None for a single process."""
    global _initialized
    args = resolve_options(option, environ)
    if args is None:
        return None
    if _initialized is not None:
        if _initialized != args:
            raise UserError(f"model.distributed: JAX is already initialised with {_initialized}, not {args}", key="model.distributed")
        return _initialized
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, ValueError):  # option absent in this jax: its default is used
        pass
    try:
        if args.get("auto"):
            jax.distributed.initialize()
        else:
            jax.distributed.initialize(args["coordinator"], num_processes=args["num_processes"],
                                       process_id=args["process_id"], local_device_ids=args["local_device_ids"])
    except RuntimeError as exc:
        raise UserError(f"model.distributed: jax.distributed.initialize failed ({exc}); it must run before "
                        "anything else uses jax, once per process", key="model.distributed") from None
    _initialized = args
    return args


def is_primary() -> bool:
    """True on process 0 (the one that writes files in a multi-process run)."""
    return jax.process_index() == 0


# ----------------------------------------------------------------------------- host <-> global


def global_array(host: np.ndarray, sharding: Any) -> Any:
    """A global ``jax.Array`` from a host array every process holds in full (the
    same values everywhere): each process places only its addressable slices."""
    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def place(params: Any, mesh) -> Any:
    """``params`` as global arrays with the rule table's shardings on ``mesh``. Host
    arrays and single-process arrays are placed slice by slice (every process must
    hold the same values); arrays already sharded that way are returned as they are."""
    def one(x, sh):
        if isinstance(x, jax.Array) and x.sharding == sh:
            return x
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.jit(lambda a: a, out_shardings=sh)(x)  # resharding stays on the devices
        return global_array(np.asarray(jax.device_get(x)), sh)

    return jax.tree.map(one, params, sharding.tree_shardings(params, mesh))


def to_host(x: Any) -> np.ndarray:
    """A (possibly multi-process) array as one host numpy array on every process
    (collective when the array spans processes)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def barrier(name: str) -> None:
    """Wait for every process (no-op with one); a failed or dead peer ends the
    wait (``coordination.barrier``)."""
    coordination.barrier(name)


def save_checkpoint(path: Any, params: Any, **kw: Any) -> dict | None:
    """``checkpoint.write.save_checkpoint`` of parameters that may span processes:
    every process takes part in the per-leaf gathers, process 0 writes (the path must be
    on a filesystem all of them see), then all wait."""
    if jax.process_count() == 1:
        return save(path, params, **kw)
    leaves = host_leaves(params)
    if is_primary():
        write_checkpoint(path, leaves, **kw)
    else:
        for _ in leaves:
            pass
    barrier(f"saved {path}")
    return None


def host_leaves(params: Any) -> Any:
    """Yield ``(key path, host numpy array)`` of a params tree one leaf at a time;
    a leaf spread over several processes is gathered (every process must iterate,
    the gather is collective)."""
    for key_path, value in flatten(params):
        yield key_path, to_host(value)
