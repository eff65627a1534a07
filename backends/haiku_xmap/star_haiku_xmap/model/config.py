"""Model configurations (GPT-J; the Llama family: Llama 3.x, Qwen2.5, Mistral) on
one base, the architecture names they are stored under, and named presets.

The configs live here, apart from their networks (``gptj.py``, ``llama.py``, named
by ``architectures.py``), because this module is imported when the plugin is
discovered, which must not import jax (``machine.set_cpu_devices`` runs first).

Shape glossary: B batch, T time, D d_model, H heads, G key/value heads, K head
dim, V vocabulary, F d_ff, L layers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from collections.abc import Mapping

DTYPES = ("float32", "bfloat16")

C = TypeVar("C", bound="ModelConfig")


class ConfigError(ValueError):
    """A config refusing a value: ``field`` is the field at fault, ``rule`` what it demands
    (the message is ``<Class>.<field> <rule>``), so a caller names its own option by it."""

    def __init__(self, cls: type, field: str, rule: str):
        super().__init__(f"{cls.__name__}.{field} {rule}")
        self.field, self.rule = field, rule


class ModelConfig:
    """What every architecture's config (a frozen dataclass) shares: its ``NAME`` (the
    registry key), a stored dict (``to_dict``/``from_dict``: unknown keys refused),
    ``replace`` and the checks of its positive ints and dtype. Each subclass declares
    its own fields, in its own order (the stored dict's); the ones annotated here
    every architecture has (not dataclass fields of this class, which has none)."""

    NAME: ClassVar[str]
    if TYPE_CHECKING:  # each subclass is a dataclass (for dataclasses.fields, asdict, replace)
        __dataclass_fields__: ClassVar[dict[str, Any]]
    n_layer: int
    d_model: int
    n_head: int
    d_head: int
    d_ff: int
    n_ctx: int
    vocab: int
    dtype: str  # parameter/activation dtype; softmax and loss stay fp32

    @property
    def kv_heads(self) -> int:
        """Key/value heads (the KV cache's second axis): ``n_head`` unless grouped."""
        return self.n_head

    def _positive_ints(self, names: tuple[str, ...]) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(type(self), name, f"must be a positive int, got {value!r}")

    def _check_dtype(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(type(self), "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[C], d: Mapping[str, Any]) -> C:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys: {unknown}")
        return cls(**dict(d))

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class GPTJConfig(ModelConfig):
    NAME: ClassVar[str] = "gptj"
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
        self._positive_ints(("n_layer", "d_model", "n_head", "d_head", "d_ff", "rotary_dim", "n_ctx", "vocab"))
        if self.rotary_dim > self.d_head or self.rotary_dim % 2:
            raise ConfigError(type(self), "rotary_dim",
                              f"must be even and <= d_head ({self.d_head}), got {self.rotary_dim}")
        self._check_dtype()
        if not self.ln_eps > 0:
            raise ConfigError(type(self), "ln_eps", f"must be > 0, got {self.ln_eps!r}")


ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """A Llama-style decoder (``llama.py``): RMSNorm, SwiGLU MLP, grouped-query
    attention (``n_head`` query heads share ``n_kv_head`` key/value heads),
    rotary embeddings in the "rotate half" layout over the whole head with base
    ``rope_theta`` and optional Llama-3 frequency scaling (``rope_scaling``: the
    values of ``ROPE_SCALING_KEYS``), optional q/k/v biases (Qwen2), tied or
    untied embeddings, optional sliding-window attention (Mistral: a token sees
    itself and the ``sliding_window - 1`` tokens before it)."""

    NAME: ClassVar[str] = "llama"
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
        self._positive_ints(("n_layer", "d_model", "n_head", "n_kv_head", "d_head", "d_ff", "n_ctx", "vocab"))
        if self.n_head % self.n_kv_head:
            raise ConfigError(type(self), "n_kv_head", f"must divide n_head ({self.n_head}), got {self.n_kv_head}")
        if self.d_head % 2:
            raise ConfigError(type(self), "d_head", f"must be even (rotary pairs), got {self.d_head}")
        if self.architecture != "llama":
            raise ConfigError(type(self), "architecture", f"must be 'llama', got {self.architecture!r}")
        self._check_dtype()
        for name in ("rms_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(type(self), name, f"must be > 0, got {value!r}")
        for name in ("qkv_bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(type(self), name, f"must be true or false, got {getattr(self, name)!r}")
        w = self.sliding_window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w <= 0):
            raise ConfigError(type(self), "sliding_window", f"must be a positive int or null, got {w!r}")
        r = self.rope_scaling
        if r is not None:
            if isinstance(r, list):  # from JSON / msgpack
                object.__setattr__(self, "rope_scaling", r := tuple(r))
            if (not isinstance(r, tuple) or len(r) != 4 or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                                                or not x > 0 for x in r)
                    or not r[2] > r[1] or int(r[3]) != r[3]):
                raise ConfigError(type(self), "rope_scaling", f"must be null or positive ({', '.join(ROPE_SCALING_KEYS)}) "
                                 f"with high_freq_factor > low_freq_factor, got {r!r}")

    @property
    def rotary_dim(self) -> int:  # rotary embeddings span the whole head
        return self.d_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rope_scaling"] = None if self.rope_scaling is None else list(self.rope_scaling)
        return d


CONFIGS: dict[str, type[ModelConfig]] = {cls.NAME: cls for cls in (GPTJConfig, LlamaConfig)}
ARCHITECTURES = tuple(CONFIGS)


def config_from_dict(d: Mapping[str, Any]) -> ModelConfig:
    """The config a stored ``to_dict()`` describes: its ``architecture`` key picks the
    family; a config class without an ``architecture`` field (GPT-J, whose dict
    predates the key) is the one a dict without the key stands for."""
    arch = d.get("architecture", "gptj")
    cls = CONFIGS.get(arch)
    if cls is None or ("architecture" in d) != ("architecture" in {f.name for f in dataclasses.fields(cls)}):
        raise ValueError(f"unknown architecture {arch!r}; known: {list(ARCHITECTURES)}")
    return cls.from_dict(d)


def architecture(config: ModelConfig) -> str:
    """The registry name of ``config``'s architecture ("gptj", "llama")."""
    return config.NAME


_LLAMA3_ROPE = (32.0, 1.0, 4.0, 8192)
_QWEN25: dict[str, Any] = dict(rms_eps=1e-6, rope_theta=1e6, qkv_bias=True, n_ctx=32768, vocab=151936)

MAX_LAYERS = 1024
"""The most layers a model may have: its abstract shapes are traced layer by layer (a checkpoint's
forged count, ``[model] n_layer``, ``plan --n-layer`` must not take minutes or hours)."""

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
