"""A (dp, mp) device mesh and Megatron-style parameter shardings (jit + NamedSharding).

The model knows nothing of the mesh: parameters are placed with ``NamedSharding``
from a rule table and XLA's SPMD partitioner inserts the collectives. Rules map a
parameter's path (``"h_3/attn/q/w"``) to a ``PartitionSpec``:

- column-parallel (q, k, v, fc_in; the Llama family's gate, up): output dim over
  "mp" (their biases too: fc_in's, Qwen2's q/k/v biases);
- row-parallel (out, fc_out, down): input dim over "mp", their outputs are summed
  over "mp", so fc_out's bias stays replicated (added once, after the sum);
- embedding and LM head: vocabulary over "mp";
- LayerNorms and RMSNorms: replicated;
- LoRA adapters (``lora.py``): A and B split as their base matrix is, on its in or out side.

Under grouped-query attention k and v have G * K outputs, split over "mp" like
q's when mp divides G * K (replicated otherwise, by ``spec_for``).

A parameter no rule matches is an error: silently replicating a new 6B-sized
weight would only show up as an out-of-memory much later.
"""

from __future__ import annotations

import re
from typing import Any
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .layout import AXES, mesh_shape


RULES: tuple[tuple[str, P], ...] = (
    (r"^wte/embeddings$", P("mp", None)),
    (r"^h_\d+/attn/(q|k|v)/w$", P(None, "mp")),
    (r"^h_\d+/attn/(q|k|v)/b$", P("mp")),
    (r"^h_\d+/attn/out/w$", P("mp", None)),
    (r"^h_\d+/mlp/fc_in/w$", P(None, "mp")),
    (r"^h_\d+/mlp/fc_in/b$", P("mp")),
    (r"^h_\d+/mlp/fc_out/w$", P("mp", None)),
    (r"^h_\d+/mlp/fc_out/b$", P()),
    (r"^h_\d+/mlp/(gate|up)/w$", P(None, "mp")),
    (r"^h_\d+/mlp/down/w$", P("mp", None)),
    (r"^(h_\d+/ln|ln_f)/(scale|offset)$", P()),
    (r"^h_\d+/ln_(attn|mlp)/scale$", P()),
    (r"^lm_head/w$", P(None, "mp")),
    (r"^lm_head/b$", P("mp")),
    # LoRA adapters (lora.py), laid out as their base matrix: a column-parallel W's B splits
    # its outputs over "mp", a row-parallel W's A its inputs; the rank axis is never split.
    (r"^h_\d+/(attn/(q|k|v)|mlp/(fc_in|gate|up))/lora_a$", P()),
    (r"^h_\d+/(attn/(q|k|v)|mlp/(fc_in|gate|up))/lora_b$", P(None, "mp")),
    (r"^h_\d+/(attn/out|mlp/(fc_out|down))/lora_a$", P("mp", None)),
    (r"^h_\d+/(attn/out|mlp/(fc_out|down))/lora_b$", P()),
)
_COMPILED = tuple((re.compile(pattern), spec) for pattern, spec in RULES)


def make_mesh(mesh: Mapping[str, Any] | None = None, devices: Sequence[Any] | None = None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    dp, mp = mesh_shape(mesh, len(devices))
    # Auto axes: XLA propagates shardings through the model (recent JAX defaults to
    # Explicit axes, which would make every gather/matmul of the model spell out its
    # output sharding).
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    return jax.make_mesh((dp, mp), AXES, axis_types=auto, devices=devices)


def spec_for(path: str, shape: Sequence[int], mesh: Mesh | None = None) -> P:
    """The rule's spec for a parameter; raises ``KeyError`` when no rule matches.

    With a mesh, a dimension that the axis size does not divide is replicated
    instead (e.g. an odd vocabulary on mp=3): correct, just less memory-efficient.
    """
    for pattern, spec in _COMPILED:  # noqa: B007
        if pattern.match(path):
            break
    else:
        raise KeyError(f"no sharding rule matches parameter {path!r}")
    if len(spec) > len(shape):
        raise ValueError(f"sharding rule {spec} for {path!r} has more dims than its shape {tuple(shape)}")
    if mesh is None:
        return spec
    axes = [a if a is None or shape[i] % mesh.shape[a] == 0 else None for i, a in enumerate(spec)]
    return P(*axes)


def _param_path(key_path) -> str | None:
    """'module/name' from the last two dict keys of a leaf's key path (params,
    optimizer moments and gradient accumulators all end in {module: {name: leaf}})."""
    keys = [k.key for k in key_path if isinstance(k, jax.tree_util.DictKey)]
    return f"{keys[-2]}/{keys[-1]}" if len(keys) >= 2 else None


def tree_specs(tree: Any, mesh: Mesh | None = None) -> Any:
    """PartitionSpecs for a params-like tree or any tree holding params-like subtrees
    (an optax state). Scalars (step counts) are replicated; any other leaf must match
    a rule."""
    def one(key_path, leaf):
        shape = tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf)
        if len(shape) == 0:
            return P()
        path = _param_path(key_path)
        if path is None:
            raise KeyError(f"no sharding rule for leaf {jax.tree_util.keystr(key_path)}")
        return spec_for(path, shape, mesh)

    return jax.tree_util.tree_map_with_path(one, tree)


def tree_shardings(tree: Any, mesh: Mesh) -> Any:
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), tree_specs(tree, mesh),
                        is_leaf=lambda x: isinstance(x, P))


def shard_tree(tree: Any, mesh: Mesh) -> Any:
    """Place a params-like tree on the mesh according to the rules."""
    return jax.device_put(tree, tree_shardings(tree, mesh))


def needs_serial_steps(mesh: Mesh | None) -> bool:
    """True when ``mesh`` spans several XLA:CPU devices. Their collectives meet
    at blocking rendezvous (within a process), and a train step
    launched while the previous one was still in its all-reduce deadlocked
    (jax 0.10.2, 2 cores: "only 1 of 2 threads arrived", hundreds of steps in),
    so training loops wait for each step there. GPUs and TPUs keep the overlap."""
    if mesh is None or mesh.devices.size < 2:
        return False
    return all(d.platform == "cpu" for d in mesh.devices.flat)


def batch_sharding(mesh: Mesh, batch_axis: int = 0, ndim: int = 2) -> NamedSharding:
    """Arrays whose ``batch_axis`` is split over "dp" (the rest replicated)."""
    axes: list[str | None] = [None] * ndim
    axes[batch_axis] = "dp"
    return NamedSharding(mesh, P(*axes))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def dp_size(mesh: Mesh) -> int:
    return int(mesh.shape["dp"])


# ----------------------------------------------------------------------------- ZeRO-1

ZERO_STAGES = (0, 1)


def zero_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
    """``spec`` with the "dp" axis added, for optimizer state partitioned over data
    parallelism (ZeRO-1): on the largest dimension not yet sharded that dp divides,
    else on an mp-sharded dimension that mp x dp divides (as ("mp", "dp")), else
    unchanged (a small vector stays replicated over dp)."""
    dp = int(mesh.shape["dp"])
    if dp == 1 or len(shape) == 0:
        return spec
    axes = list(spec) + [None] * (len(shape) - len(spec))
    free = [i for i, a in enumerate(axes) if a is None and shape[i] % dp == 0]
    if free:
        i = max(free, key=lambda i: (shape[i], -i))
        axes[i] = "dp"
        return P(*axes)
    mp = int(mesh.shape["mp"])
    for i, a in enumerate(axes):
        if a == "mp" and shape[i] % (mp * dp) == 0:
            axes[i] = ("mp", "dp")
            return P(*axes)
    return spec


def zero_tree_specs(tree: Any, mesh: Mesh) -> Any:
    """``tree_specs`` with every leaf also split over "dp" where possible (``zero_spec``)."""
    specs = tree_specs(tree, mesh)
    return jax.tree.map(lambda spec, leaf: zero_spec(spec, np.shape(leaf) if not hasattr(leaf, "shape")
                                                     else tuple(leaf.shape), mesh),
                        specs, tree, is_leaf=lambda x: isinstance(x, P))


def train_state_shardings(state: Any, mesh: Mesh, zero: int = 0) -> Any:
    """Shardings of a ``train.TrainState``: parameters by the rule table; optimizer
    state by the rule table (``zero=0``) or additionally partitioned over "dp"
    (``zero=1``, ZeRO-1: each data-parallel replica keeps 1/dp of the moments)."""
    if zero not in ZERO_STAGES:
        raise ValueError(f"zero: must be one of {ZERO_STAGES}, got {zero!r}")
    params_sh = tree_shardings(state.params, mesh)
    specs = zero_tree_specs(state.opt_state, mesh) if zero else tree_specs(state.opt_state, mesh)
    opt_sh = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, P))
    return type(state)(params_sh, opt_sh, replicated(mesh))
