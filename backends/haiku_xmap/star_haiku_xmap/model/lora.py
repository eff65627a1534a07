"""LoRA adapters (Hu et al. 2021) as peft computes them, for every architecture the
backend runs (GPT-J, and the Llama family: Llama, Qwen2, Mistral).

A target projection ``y = x W`` (W: (in, out), the base's, frozen) becomes
``y = x W + s (x A) B`` with A (in, r) drawn as peft's kaiming-uniform (a = sqrt 5:
U(-1/sqrt(in), 1/sqrt(in))), B (r, out) zeros, so a fresh adapter is the identity,
and s = alpha / r (``rslora``: alpha / sqrt r). The adapter path runs in fp32 and
is added to the base's output; the adapters and their Adam state are fp32 whatever
the base's dtype.

Targets carry peft's / Hugging Face's module names (``TARGETS``); ``[training]
adapter = { kind = "lora", rank = 32, alpha = 64, targets = [...] }``, default targets
every attention and MLP projection. The adapter tree is params-like,
``{"h_3/attn/q": {"lora_a": A, "lora_b": B}}``, so the sharding rule table and the
checkpoint format take it as they take parameters.

Training runs the unmerged form through a Haiku method interceptor on the target
``Linear`` modules (``apply_forward``), so the model's modules know nothing of
adapters; generation merges first (``merge``: W + s A B in fp32, cast to the compute
dtype), so it runs at the plain model's speed.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from star_engine import UserError

from . import network as model
from .config import ModelConfig, architecture, config_from_dict
from .layers import Linear
from .lora_options import LoraOptions

# peft's target names -> this backend's module path inside block h_{i}.
TARGETS: dict[str, dict[str, str]] = {
    "gptj": {"q_proj": "attn/q", "k_proj": "attn/k", "v_proj": "attn/v", "out_proj": "attn/out",
             "fc_in": "mlp/fc_in", "fc_out": "mlp/fc_out"},
    "llama": {"q_proj": "attn/q", "k_proj": "attn/k", "v_proj": "attn/v", "o_proj": "attn/out",
              "gate_proj": "mlp/gate", "up_proj": "mlp/up", "down_proj": "mlp/down"},
}


@dataclass(frozen=True)
class LoraSpec:
    """One adapter configuration (hashable: a static argument of the jit'd steps)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    rslora: bool = False

    @property
    def scale(self) -> float:
        return self.alpha / (np.sqrt(self.rank) if self.rslora else self.rank)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "lora", "rank": self.rank, "alpha": self.alpha, "targets": list(self.targets),
                "rslora": self.rslora}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LoraSpec:
        return cls(int(d["rank"]), float(d["alpha"]), tuple(d["targets"]), bool(d.get("rslora", False)))


@functools.lru_cache(maxsize=16)
def _shapes(config: ModelConfig) -> dict:
    """The model's parameter shapes (abstract; traced once per config: the table's check, the
    adapters' init, specs and loading all ask)."""
    return model.param_shapes(config)


def check_table(table: Any, config: ModelConfig, key: str) -> LoraSpec:
    """The ``adapter`` table at TOML key ``key`` (a table, or a ``LoraOptions`` already checked)
    as the ``LoraSpec`` trained on the model ``config``: its options checked as declared
    (``options.LoraOptions``), then against the model (``adapter_spec``); a ``UserError``
    naming ``key.<option>``."""
    return adapter_spec(LoraOptions.from_table(table, key), config, key)


def adapter_spec(table: LoraOptions, config: ModelConfig, key: str) -> LoraSpec:
    """The ``LoraSpec`` of ``table`` on the model ``config``: the targets are distinct
    projections of its architecture, the rank at most each target matrix's smaller side;
    alpha defaults to twice the rank, the targets to every projection. A ``UserError``
    naming ``key.<option>`` otherwise."""
    alpha = 2 * table.rank if table.alpha is None else table.alpha
    names = TARGETS[architecture(config)]
    targets = list(names) if table.targets is None else list(table.targets)
    if len(set(targets)) != len(targets):
        raise UserError(f"{key}.targets: must be a non-empty list of distinct names from {list(names)}, "
                        f"got {targets!r}", key=f"{key}.targets")
    for t in targets:
        if t not in names:
            close = difflib.get_close_matches(t, names, n=1)
            raise UserError(f"{key}.targets: {t!r} is not a projection of this {architecture(config)} model"
                            + (f"; did you mean {close[0]!r}?" if close else "") + f" (targets: {list(names)})",
                            key=f"{key}.targets")
    spec = LoraSpec(int(table.rank), float(alpha), tuple(targets), table.rslora)
    shapes = _shapes(config)
    for t in spec.targets:
        n_in, n_out = shapes["h_0/" + names[t]]["w"].shape
        if spec.rank > min(n_in, n_out):
            raise UserError(f"{key}.rank: {spec.rank} is above {t}'s smaller side ({n_in} x {n_out})",
                            key=f"{key}.rank")
    return spec


def module_paths(config: ModelConfig, spec: LoraSpec) -> list[str]:
    names = TARGETS[architecture(config)]
    return [f"h_{i}/{names[t]}" for i in range(config.n_layer) for t in spec.targets]


def adapter_specs(config: ModelConfig, spec: LoraSpec) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    """{key path: (shape, dtype)} of the adapters (a checkpoint's expected leaves)."""
    shapes = _shapes(config)
    out: dict[tuple[str, ...], tuple[tuple[int, ...], str]] = {}
    for path in module_paths(config, spec):
        n_in, n_out = shapes[path]["w"].shape
        out[(path, "lora_a")] = ((n_in, spec.rank), "float32")
        out[(path, "lora_b")] = ((spec.rank, n_out), "float32")
    return out


def checkpoint_specs(model_config: Mapping[str, Any], extra: Mapping[str, Any]) -> dict:
    """The leaves a LoRA checkpoint must hold (``adapter_specs``) by its manifest: the model
    config and ``extra`` (its ``lora`` spec, the base's id ``base`` and ``base_path``);
    ValueError / UserError when these are not a LoRA checkpoint's."""
    if not (isinstance(extra.get("base"), str) and isinstance(extra.get("base_path"), str)):
        raise ValueError("extra.base and extra.base_path must name the base checkpoint")
    config = config_from_dict(model_config)
    spec = LoraSpec.from_dict(extra["lora"])
    check_table(spec.to_dict(), config, "extra.lora")
    return adapter_specs(config, spec)


def init_adapters(config: ModelConfig, spec: LoraSpec, key: jax.Array) -> dict:
    """Fresh adapters: A as peft's kaiming-uniform, B zeros (the identity), fp32; module i
    of ``module_paths`` draws with ``fold_in(key, i)``."""
    shapes = _shapes(config)
    tree: dict = {}
    for i, path in enumerate(module_paths(config, spec)):
        n_in, n_out = shapes[path]["w"].shape
        bound = 1.0 / np.sqrt(n_in)
        a = jax.random.uniform(jax.random.fold_in(key, i), (n_in, spec.rank), jnp.float32, -bound, bound)
        tree[path] = {"lora_a": a, "lora_b": jnp.zeros((spec.rank, n_out), jnp.float32)}
    return tree


# ----------------------------------------------------------------------------- forward


def _interceptor(adapters: Mapping[str, Mapping[str, jax.Array]], scale: float):
    def intercept(next_f, args, kwargs, context):
        out = next_f(*args, **kwargs)
        if context.method_name != "__call__" or not isinstance(context.module, Linear):
            return out
        ad = adapters.get(context.module.module_name)
        if ad is None:
            return out
        x_NI = args[0].astype(jnp.float32)
        delta_NO = (x_NI @ ad["lora_a"].astype(jnp.float32)) @ ad["lora_b"].astype(jnp.float32)
        return (out.astype(jnp.float32) + jnp.float32(scale) * delta_NO).astype(out.dtype)

    return intercept


def apply_forward(base: Any, adapters: Any, tokens_BT: jax.Array, config: ModelConfig, spec: LoraSpec,
                  positions_BT: jax.Array | None = None, mask: jax.Array | None = None,
                  segments: jax.Array | None = None, head: bool = True) -> jax.Array:
    """``model.apply_forward`` of the adapted model, unmerged: each target's output gains
    s (x A) B (fp32). ``head=False``: the final hidden states (the head is never a target)."""
    with hk.intercept_methods(_interceptor(adapters, spec.scale)):
        return model.apply_forward(base, tokens_BT, config, positions_BT, mask, segments, head)


forward = jax.jit(apply_forward, static_argnames=("config", "spec", "head"))
"""``apply_forward`` jit'd (``config`` and ``spec`` static)."""


@functools.partial(jax.jit, static_argnames=("spec", "dtype"))
def merge(base: Any, adapters: Any, spec: LoraSpec, dtype: str | None = None) -> Any:
    """The base with every target's W replaced by W + s A B (in fp32, then cast to
    ``dtype``; default each leaf's own), the rest cast to ``dtype``: a plain model."""
    cast = (lambda x: x) if dtype is None else (lambda x: x.astype(jnp.dtype(dtype)))
    out = {m: {n: cast(v) for n, v in leaves.items()} for m, leaves in base.items()}
    for path, ad in adapters.items():
        w = base[path]["w"]
        merged = w.astype(jnp.float32) + jnp.float32(spec.scale) * (ad["lora_a"] @ ad["lora_b"])
        out[path]["w"] = merged.astype(jnp.dtype(dtype) if dtype is not None else w.dtype)
    return out
