"""Model configurations (GPT-J; the Llama family: Llama 3.x, Qwen2.5, Mistral)
and named presets.

Shape glossary: B batch, T time, D d_model, H heads, G key/value heads, K head
dim, V vocabulary, F d_ff, L layers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

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
    def from_dict(cls, d: Mapping[str, Any]) -> GPTJConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown GPTJConfig keys: {unknown}")
        return cls(**dict(d))

    def replace(self, **changes: Any) -> GPTJConfig:
        return dataclasses.replace(self, **changes)


ARCHITECTURES = ("gptj", "llama")
ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _positive_ints(cls: str, obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{cls}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-style decoder (``llama.py``): RMSNorm, SwiGLU MLP, grouped-query
    attention (``n_head`` query heads share ``n_kv_head`` key/value heads),
    rotary embeddings in the "rotate half" layout over the whole head with base
    ``rope_theta`` and optional Llama-3 frequency scaling (``rope_scaling``: the
    values of ``ROPE_SCALING_KEYS``), optional q/k/v biases (Qwen2), tied or
    untied embeddings, optional sliding-window attention (Mistral: a token sees
    itself and the ``sliding_window - 1`` tokens before it)."""

    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    d_head: int
    d_ff: int
    n_ctx: int
    vocab: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[float, float, float, int] | None = None
    qkv_bias: bool = False
    tie_embeddings: bool = False
    sliding_window: int | None = None
    dtype: str = "float32"
    architecture: str = "llama"

    def __post_init__(self) -> None:
        _positive_ints("LlamaConfig", self, ("n_layer", "d_model", "n_head", "n_kv_head", "d_head", "d_ff",
                                             "n_ctx", "vocab"))
        if self.n_head % self.n_kv_head:
            raise ValueError(f"LlamaConfig.n_kv_head must divide n_head ({self.n_head}), got {self.n_kv_head}")
        if self.d_head % 2:
            raise ValueError(f"LlamaConfig.d_head must be even (rotary pairs), got {self.d_head}")
        if self.architecture != "llama":
            raise ValueError(f"LlamaConfig.architecture must be 'llama', got {self.architecture!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"LlamaConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("rms_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"LlamaConfig.{name} must be > 0, got {value!r}")
        for name in ("qkv_bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LlamaConfig.{name} must be true or false, got {getattr(self, name)!r}")
        w = self.sliding_window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w <= 0):
            raise ValueError(f"LlamaConfig.sliding_window must be a positive int or null, got {w!r}")
        r = self.rope_scaling
        if r is not None:
            if isinstance(r, list):  # from JSON / msgpack
                object.__setattr__(self, "rope_scaling", r := tuple(r))
            if (not isinstance(r, tuple) or len(r) != 4 or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                                                or not x > 0 for x in r)
                    or not r[2] > r[1] or int(r[3]) != r[3]):
                raise ValueError(f"LlamaConfig.rope_scaling must be null or positive ({', '.join(ROPE_SCALING_KEYS)}) "
                                 f"with high_freq_factor > low_freq_factor, got {r!r}")

    @property
    def rotary_dim(self) -> int:  # rotary embeddings span the whole head
        return self.d_head

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rope_scaling"] = None if self.rope_scaling is None else list(self.rope_scaling)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LlamaConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown LlamaConfig keys: {unknown}")
        return cls(**dict(d))

    def replace(self, **changes: Any) -> LlamaConfig:
        return dataclasses.replace(self, **changes)


ModelConfig = GPTJConfig | LlamaConfig


def config_from_dict(d: Mapping[str, Any]) -> ModelConfig:
    """The config a stored ``to_dict()`` describes: its ``architecture`` key picks the
    family (GPT-J's dict has none, as before this key existed)."""
    arch = d.get("architecture", "gptj")
    if arch == "llama":
        return LlamaConfig.from_dict(d)
    if arch != "gptj" or "architecture" in d:
        raise ValueError(f"unknown architecture {arch!r}; known: {list(ARCHITECTURES)}")
    return GPTJConfig.from_dict(d)


def architecture(config: ModelConfig) -> str:
    return getattr(config, "architecture", "gptj")


_LLAMA3_ROPE = (32.0, 1.0, 4.0, 8192)
_QWEN25 = dict(rms_eps=1e-6, rope_theta=1e6, qkv_bias=True, n_ctx=32768, vocab=151936)

PRESETS: dict[str, ModelConfig] = {
    # Byte tokenizer: 256 bytes + end-of-text, padded to a multiple of 8.
    "tiny": GPTJConfig(n_layer=2, d_model=128, n_head=4, d_head=32, d_ff=512, rotary_dim=16,
                       n_ctx=512, vocab=264),
    # The throughput benchmark shape (matches the HF anchor in REFERENCE.md).
    "small": GPTJConfig(n_layer=4, d_model=256, n_head=8, d_head=32, d_ff=1024, rotary_dim=16,
                        n_ctx=512, vocab=512),
    "gptj-6b": GPTJConfig(n_layer=28, d_model=4096, n_head=16, d_head=256, d_ff=16384, rotary_dim=64,
                          n_ctx=2048, vocab=50400),
    # The Llama family (shapes of the public config.json files; n_ctx as used here, not the
    # longest the model supports). Tiny ones for tests, smoke runs and the benchmark.
    "llama-tiny": LlamaConfig(n_layer=2, d_model=128, n_head=4, n_kv_head=2, d_head=32, d_ff=384, n_ctx=512,
                              vocab=264, rope_theta=500000.0, rope_scaling=(8.0, 1.0, 4.0, 64)),
    "llama-small": LlamaConfig(n_layer=4, d_model=256, n_head=8, n_kv_head=4, d_head=32, d_ff=768, n_ctx=512,
                               vocab=512, rope_theta=500000.0),
    "qwen2.5-0.5b": LlamaConfig(n_layer=24, d_model=896, n_head=14, n_kv_head=2, d_head=64, d_ff=4864,
                                tie_embeddings=True, **_QWEN25),
    "qwen2.5-1.5b": LlamaConfig(n_layer=28, d_model=1536, n_head=12, n_kv_head=2, d_head=128, d_ff=8960,
                                tie_embeddings=True, **_QWEN25),
    "llama-3.2-1b": LlamaConfig(n_layer=16, d_model=2048, n_head=32, n_kv_head=8, d_head=64, d_ff=8192,
                                n_ctx=131072, vocab=128256, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE,
                                tie_embeddings=True),
    "llama-3.2-3b": LlamaConfig(n_layer=28, d_model=3072, n_head=24, n_kv_head=8, d_head=128, d_ff=8192,
                                n_ctx=131072, vocab=128256, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE,
                                tie_embeddings=True),
    "llama-3.1-8b": LlamaConfig(n_layer=32, d_model=4096, n_head=32, n_kv_head=8, d_head=128, d_ff=14336,
                                n_ctx=131072, vocab=128256, rope_theta=500000.0, rope_scaling=(8.0, 1.0, 4.0, 8192)),
    "mistral-7b": LlamaConfig(n_layer=32, d_model=4096, n_head=32, n_kv_head=8, d_head=128, d_ff=14336,
                              n_ctx=32768, vocab=32000, sliding_window=4096),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A preset with some fields replaced (``None`` values keep the preset's)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**{k: v for k, v in overrides.items() if v is not None})


def param_count(config: ModelConfig, mtj_shards: int | None = None) -> int:
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
    if architecture(config) != "gptj":
        raise ValueError("mtj_shards: mesh-transformer-jax checkpoints hold GPT-J only")
    if mtj_shards < 1:
        raise ValueError(f"mtj_shards must be >= 1, got {mtj_shards}")
    D = config.d_model
    replicated = config.n_layer * (2 * D + D) + 2 * D  # per-block ln + fc_out bias, ln_f
    return total + (mtj_shards - 1) * replicated + mtj_shards * D  # + embedding bias per shard
