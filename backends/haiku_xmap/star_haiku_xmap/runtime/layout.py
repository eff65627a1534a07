"""The process layout and the mesh's shape, read before jax starts (jax-free: the backend
reads them when it is built; ``distributed.initialize`` and ``sharding.make_mesh`` act on them).

``resolve_options``: the ``jax.distributed.initialize`` arguments of a ``[model] distributed``
value and the environment (``STAR_ENGINE_COORDINATOR``, ``STAR_ENGINE_NUM_PROCESSES``,
``STAR_ENGINE_PROCESS_ID``, ``STAR_ENGINE_LOCAL_DEVICE_IDS``; see ``distributed.py``);
``mesh_shape``: the (dp, mp) sizes of a ``[model] mesh`` table for a device count.
"""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Mapping

from star_engine import UserError
from star_engine.helpers import is_int

AXES = ("dp", "mp")

ENV_COORDINATOR = "STAR_ENGINE_COORDINATOR"
ENV_NUM_PROCESSES = "STAR_ENGINE_NUM_PROCESSES"
ENV_PROCESS_ID = "STAR_ENGINE_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "STAR_ENGINE_LOCAL_DEVICE_IDS"

def resolve_options(option: Any, environ: Mapping[str, str] | None = None) -> dict | None:
    """The ``jax.distributed.initialize`` arguments for a ``[model] distributed``
    value and the environment, or None for a single process. UserError on bad values."""
    env = os.environ if environ is None else environ
    if option == "auto":
        return {"auto": True}
    if option is not None and not isinstance(option, Mapping):
        raise UserError(f"model.distributed: must be a table {{coordinator = \"host:port\", num_processes = N, "
                        f"process_id = I}} or \"auto\", got {option!r}", key="model.distributed")
    table = dict(option or {})
    unknown = sorted(set(table) - {"coordinator", "num_processes", "process_id", "local_device_ids"})
    if unknown:
        raise UserError(f"model.distributed: unknown keys {unknown}; allowed: coordinator, num_processes, "
                        "process_id, local_device_ids", key="model.distributed")
    out: dict[str, Any] = {
        "coordinator": table.get("coordinator", env.get(ENV_COORDINATOR)),
        "num_processes": table.get("num_processes", env.get(ENV_NUM_PROCESSES)),
        "process_id": table.get("process_id", env.get(ENV_PROCESS_ID)),
        "local_device_ids": table.get("local_device_ids", env.get(ENV_LOCAL_DEVICE_IDS)),
    }
    if out["coordinator"] is None and out["num_processes"] is None and out["process_id"] is None:
        return None
    for key in ("num_processes", "process_id"):
        v = out[key]
        if isinstance(v, str):
            try:
                v = int(v)
            except ValueError:
                raise UserError(f"model.distributed.{key}: not an integer: {v!r}", key=f"model.distributed.{key}") from None
        if not is_int(v):
            raise UserError(f"model.distributed.{key}: required (or ${ENV_NUM_PROCESSES if key == 'num_processes' else ENV_PROCESS_ID}), got {v!r}", key=f"model.distributed.{key}")
        out[key] = v
    if out["num_processes"] < 1 or not 0 <= out["process_id"] < out["num_processes"]:
        raise UserError(f"model.distributed: process_id {out['process_id']} must lie in [0, num_processes = "
                        f"{out['num_processes']})", key="model.distributed")
    coord = out["coordinator"]
    if not isinstance(coord, str) or ":" not in coord or not coord.rsplit(":", 1)[1].isdigit():
        raise UserError(f"model.distributed.coordinator: expected \"host:port\" (or ${ENV_COORDINATOR}), got {coord!r}", key="model.distributed.coordinator")
    ids = out["local_device_ids"]
    if isinstance(ids, str):
        try:
            ids = [int(x) for x in ids.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"{ENV_LOCAL_DEVICE_IDS}: expected comma-separated ints, got {ids!r}", key="model.distributed.local_device_ids") from None
    if ids is not None and (not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids)):
        raise UserError(f"model.distributed.local_device_ids: expected a list of ints, got {ids!r}", key="model.distributed.local_device_ids")
    out["local_device_ids"] = ids
    return out


def mesh_shape(mesh: Mapping[str, Any] | None, n_devices: int) -> tuple[int, int]:
    """(dp, mp) for ``n_devices`` from ``{"dp": -1, "mp": 1}``; -1 takes what is left."""
    cfg = {"dp": -1, "mp": 1} if mesh is None else dict(mesh)
    unknown = sorted(set(cfg) - set(AXES))
    if unknown:
        raise ValueError(f"mesh: unknown axes {unknown}; allowed: {list(AXES)}")
    dp, mp = cfg.get("dp", -1), cfg.get("mp", 1)
    for name, value in (("dp", dp), ("mp", mp)):
        if not is_int(value) or (value < 1 and value != -1):
            raise ValueError(f"mesh.{name} must be a positive int or -1, got {value!r}")
    if dp == -1 and mp == -1:
        raise ValueError("mesh: at most one of dp, mp may be -1")
    if dp == -1 or mp == -1:
        fixed = mp if dp == -1 else dp
        if n_devices % fixed:
            raise ValueError(f"mesh: {n_devices} devices are not divisible by {fixed}")
        dp, mp = (n_devices // fixed, mp) if dp == -1 else (dp, n_devices // fixed)
    if dp * mp != n_devices:
        raise ValueError(f"mesh: dp={dp} x mp={mp} = {dp * mp} != {n_devices} devices")
    return dp, mp
