"""Multi-process JAX, ZeRO-1 training and host <-> global array helpers.

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

**ZeRO-1.** ``train`` is ``train.train`` with the optimizer state partitioned
over "dp" on top of the rule table's "mp" split (``sharding.train_state_shardings``),
optionally kept in bf16 (``opt_state_dtype``); fp32 master weights of a bf16 model
are optimizer state too and are split the same way (``state_shardings``). The
state is built directly in its shardings (never replicated first), and batches are
built as global arrays from each process's addressable slices, so it runs
unchanged on several processes.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from star_engine.errors import UserError
from star_engine.options import is_int

ENV_COORDINATOR = "STAR_ENGINE_COORDINATOR"
ENV_NUM_PROCESSES = "STAR_ENGINE_NUM_PROCESSES"
ENV_PROCESS_ID = "STAR_ENGINE_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "STAR_ENGINE_LOCAL_DEVICE_IDS"
OPT_STATE_DTYPES = ("float32", "bfloat16")

_initialized: dict | None = None


# ----------------------------------------------------------------------------- initialisation


def resolve_options(option: Any, environ: Mapping[str, str] | None = None) -> dict | None:
    """The ``jax.distributed.initialize`` arguments for a ``[model] distributed``
    value and the environment, or None for a single process. UserError on bad values."""
    env = os.environ if environ is None else environ
    if option == "auto":
        return {"auto": True}
    if option is not None and not isinstance(option, Mapping):
        raise UserError(f"model.distributed: must be a table {{coordinator = \"host:port\", num_processes = N, "
                        f"process_id = I}} or \"auto\", got {option!r}")
    table = dict(option or {})
    unknown = sorted(set(table) - {"coordinator", "num_processes", "process_id", "local_device_ids"})
    if unknown:
        raise UserError(f"model.distributed: unknown keys {unknown}; allowed: coordinator, num_processes, "
                        "process_id, local_device_ids")
    out = {
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
                raise UserError(f"model.distributed.{key}: not an integer: {v!r}") from None
        if not is_int(v):
            raise UserError(f"model.distributed.{key}: required (or ${ENV_NUM_PROCESSES if key == 'num_processes' else ENV_PROCESS_ID}), got {v!r}")
        out[key] = v
    if out["num_processes"] < 1 or not 0 <= out["process_id"] < out["num_processes"]:
        raise UserError(f"model.distributed: process_id {out['process_id']} must lie in [0, num_processes = "
                        f"{out['num_processes']})")
    coord = out["coordinator"]
    if not isinstance(coord, str) or ":" not in coord or not coord.rsplit(":", 1)[1].isdigit():
        raise UserError(f"model.distributed.coordinator: expected \"host:port\" (or ${ENV_COORDINATOR}), got {coord!r}")
    ids = out["local_device_ids"]
    if isinstance(ids, str):
        try:
            ids = [int(x) for x in ids.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"{ENV_LOCAL_DEVICE_IDS}: expected comma-separated ints, got {ids!r}") from None
    if ids is not None and (not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids)):
        raise UserError(f"model.distributed.local_device_ids: expected a list of ints, got {ids!r}")
    out["local_device_ids"] = ids
    return out


def initialize(option: Any = None, environ: Mapping[str, str] | None = None) -> dict | None:
    """Start multi-process JAX if configured (see the module docstring); idempotent.
    Returns the arguments used, or None for a single process."""
    global _initialized
    args = resolve_options(option, environ)
    if args is None:
        return None
    if _initialized is not None:
        if _initialized != args:
            raise UserError(f"model.distributed: JAX is already initialised with {_initialized}, not {args}")
        return _initialized
    import jax

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
                        "anything else uses jax, once per process") from None
    _initialized = args
    return args


def is_primary() -> bool:
    """True on process 0 (the one that writes files in a multi-process run)."""
    import jax

    return jax.process_index() == 0


# ----------------------------------------------------------------------------- host <-> global


def global_array(host: np.ndarray, sharding: Any) -> Any:
    """A global ``jax.Array`` from a host array every process holds in full (the
    same values everywhere): each process places only its addressable slices."""
    import jax

    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def place(params: Any, mesh) -> Any:
    """``params`` as global arrays with the rule table's shardings on ``mesh``. Host
    arrays and single-process arrays are placed slice by slice (every process must
    hold the same values); arrays already sharded that way are returned as they are."""
    import jax

    from . import sharding

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
    import jax

    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def barrier(name: str) -> None:
    """Wait for every process (no-op with one); a failed or dead peer ends the
    wait (``coordination.barrier``)."""
    from .coordination import barrier as coordinated

    coordinated(name)


def host_leaves(params: Any) -> Any:
    """Yield ``(key path, host numpy array)`` of a params tree one leaf at a time;
    a leaf spread over several processes is gathered (every process must iterate,
    the gather is collective)."""
    from .checkpoint import _flatten

    for key_path, value in _flatten(params):
        yield key_path, to_host(value)


# ----------------------------------------------------------------------------- optimizer state dtype


def with_state_dtype(tx, dtype: str):
    """``tx`` whose floating state is stored in ``dtype`` and computed in fp32
    (bf16 moments halve the optimizer memory; the update itself stays fp32)."""
    import jax
    import jax.numpy as jnp
    import optax

    if dtype == "float32":
        return tx
    if dtype not in OPT_STATE_DTYPES:
        raise ValueError(f"opt_state_dtype must be one of {OPT_STATE_DTYPES}, got {dtype!r}")
    store = jnp.bfloat16

    def cast(tree, to):
        return jax.tree.map(lambda x: x.astype(to) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    def init(params):
        return cast(tx.init(params), store)

    def update(updates, state, params=None):
        new_updates, new_state = tx.update(updates, cast(state, jnp.float32), params)
        return new_updates, cast(new_state, store)

    return optax.GradientTransformation(init, update)


# ----------------------------------------------------------------------------- training


def state_shardings(state: Any, mesh, zero: int, compute_dtype: Any) -> Any:
    """Shardings of a (possibly abstract) ``train.TrainState``: the rule table, the
    optimizer state also over dp with ``zero = 1`` (``sharding.train_state_shardings``).
    Master weights kept in another dtype than the compute one (fp32 under bf16) are
    optimizer state as well: with ZeRO-1 they are split over dp like the moments, and
    each step all-gathers their compute-dtype cast (``train.make_update``)."""
    import jax

    from . import sharding

    state_sh = sharding.train_state_shardings(state, mesh, zero)
    if zero and any(x.dtype != compute_dtype for x in jax.tree.leaves(state.params)):
        specs = sharding.zero_tree_specs(state.params, mesh)
        state_sh = state_sh._replace(params=jax.tree.map(
            lambda spec: jax.sharding.NamedSharding(mesh, spec), specs,
            is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
    return state_sh


def init_train_state(params: Any, tx, mesh, *, zero: int = 0, compute_dtype: Any = None) -> tuple[Any, Any]:
    """(state, state shardings): the optimizer state is created by a jit whose
    outputs already have their final (ZeRO) shardings (``state_shardings``), so no
    replicated copy of the moments ever exists. ``compute_dtype``: the model's
    (default: the params' own, i.e. no separate master weights). ``params`` is
    donated (pass a copy to keep yours)."""
    import jax

    from . import train as tr

    abstract = jax.eval_shape(lambda p: tr.init_state(p, tx), params)
    compute = jax.tree.leaves(params)[0].dtype if compute_dtype is None else compute_dtype
    state_sh = state_shardings(abstract, mesh, zero, compute)
    build = jax.jit(lambda p: tr.init_state(p, tx), out_shardings=state_sh, donate_argnums=0)
    return build(params), state_sh


def train(params: Any, config, encoded: Sequence[Any], *, steps: int, batch_size: int, grad_accum: int, seed: int,
          optimizer: Mapping[str, Any], seq_len: int, pad_id: int, mesh, zero: int = 0,
          opt_state_dtype: str = "float32", progress: Callable[[int], None] | None = None,
          packing: str = "segments", loss: str = "completion", master_dtype: str = "float32",
          accum_dtype: str = "float32", remat: bool = False, snapshots: Any = None) -> tuple[Any, list[float], int]:
    """``train.train`` (same batches, same loss, same optimizer) with ZeRO-1 and the
    optimizer-state dtype as options, multi-process safe. Returns (master params,
    losses, tokens); with ZeRO-1 fp32 masters come back split over dp."""
    import jax

    from . import model, sharding
    from . import train as tr

    if steps < 0 or batch_size < 1 or grad_accum < 1:
        raise ValueError(f"bad training shape: steps={steps} batch_size={batch_size} grad_accum={grad_accum}")
    tr.check_dtypes(config, master_dtype, accum_dtype)
    if steps == 0:
        return params, [], 0
    batches = tr.packing_batches(encoded, steps=steps, batch_size=batch_size, grad_accum=grad_accum, seed=seed,
                                 seq_len=seq_len, pad_id=pad_id, dp=sharding.dp_size(mesh), packing=packing,
                                 loss=loss, config=config)
    tx = with_state_dtype(tr.make_optimizer(optimizer, steps), opt_state_dtype)
    params = place(params, mesh)
    # A copy in the master dtype (the update donates its state; the caller's arrays must survive).
    params = jax.jit(lambda p: tr.master_params(p, master_dtype),
                     out_shardings=sharding.tree_shardings(params, mesh))(params)
    restored = None
    if snapshots is not None:  # ``resume.py``: the stage's saved state, laid out as a fresh one would be
        abstract = jax.eval_shape(lambda p: tr.init_state(p, tx), params)
        restored = snapshots.restore(abstract, state_shardings(abstract, mesh, zero, model.dtype_of(config)))
    if restored:
        state, state_sh = restored.state, jax.tree.map(lambda x: x.sharding, restored.state)
        del params
    else:
        state, state_sh = init_train_state(params, tx, mesh, zero=zero, compute_dtype=model.dtype_of(config))
    update = tr.make_update(config, tx, mesh, state_shardings=state_sh, accum_dtype=accum_dtype, remat=remat)
    batch_sh = sharding.batch_sharding(mesh, batch_axis=1, ndim=3)
    state, metrics, n_tokens = tr.run_steps(update, state, batches, mesh=mesh, progress=progress,
                                            put=lambda batch: {k: global_array(v, batch_sh) for k, v in batch.items()},
                                            snapshots=snapshots, restored=restored)
    losses = [float(to_host(x)) for x in metrics]
    return state.params, losses, n_tokens
