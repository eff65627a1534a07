"""GPT-J model configuration and named presets.

Shape glossary: B batch, T time, D d_model, H heads, K head dim, V vocabulary,
F d_ff, L layers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class GPTJConfig:
    n_layer: int
    d_model: int
    n_head: int
    d_head: int
    d_ff: int
    rotary_dim: int
    n_ctx: int
    vocab: int
    ln_eps: float = 1e-5
    dtype: str = "float32"  # parameter/activation dtype; softmax and loss stay fp32

    def __post_init__(self) -> None:
        for name in ("n_layer", "d_model", "n_head", "d_head", "d_ff", "rotary_dim", "n_ctx", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTJConfig.{name} must be a positive int, got {value!r}")
        if self.rotary_dim > self.d_head or self.rotary_dim % 2:
            raise ValueError(
                f"GPTJConfig.rotary_dim must be even and <= d_head ({self.d_head}), got {self.rotary_dim}")
        if self.dtype not in DTYPES:
            raise ValueError(f"GPTJConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not self.ln_eps > 0:
            raise ValueError(f"GPTJConfig.ln_eps must be > 0, got {self.ln_eps!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GPTJConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown GPTJConfig keys: {unknown}")
        return cls(**dict(d))

    def replace(self, **changes: Any) -> "GPTJConfig":
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, GPTJConfig] = {
    # Byte tokenizer: 256 bytes + end-of-text, padded to a multiple of 8.
    "tiny": GPTJConfig(n_layer=2, d_model=128, n_head=4, d_head=32, d_ff=512, rotary_dim=16,
                       n_ctx=512, vocab=264),
    # The throughput benchmark shape (matches the HF anchor in REFERENCE.md).
    "small": GPTJConfig(n_layer=4, d_model=256, n_head=8, d_head=32, d_ff=1024, rotary_dim=16,
                        n_ctx=512, vocab=512),
    "gptj-6b": GPTJConfig(n_layer=28, d_model=4096, n_head=16, d_head=256, d_ff=16384, rotary_dim=64,
                          n_ctx=2048, vocab=50400),
}


def preset(name: str, **overrides: Any) -> GPTJConfig:
    """A preset with some fields replaced (``None`` values keep the preset's)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**{k: v for k, v in overrides.items() if v is not None})


def param_count(config: GPTJConfig, mtj_shards: int | None = None) -> int:
    """Number of parameters, counted from the model's abstract shapes (no memory used).

    ``mtj_shards=None``: unique parameters (what HF counts). ``mtj_shards=n``: the
    figure mesh-transformer-jax reports for an n-way model-parallel checkpoint, which
    stores per shard a copy of every replicated vector (each block's LayerNorm
    scale/offset and fc_out bias, the final LayerNorm) plus an embedding bias of
    size D that our model (like HF) folds into ``wte``. For GPT-J-6B with 8 shards:
    6,050,882,784 + 7 x (28 x 3 x 4096 + 2 x 4096) + 8 x 4096 = 6,053,381,344.
    """
    import jax
    import numpy as np

    from . import model

    shapes = jax.eval_shape(lambda key: model.init_params(config, key), jax.random.key(0))
    total = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))
    if mtj_shards is None:
        return total
    if mtj_shards < 1:
        raise ValueError(f"mtj_shards must be >= 1, got {mtj_shards}")
    D = config.d_model
    replicated = config.n_layer * (2 * D + D) + 2 * D  # per-block ln + fc_out bias, ln_f
    return total + (mtj_shards - 1) * replicated + mtj_shards * D  # + embedding bias per shard
