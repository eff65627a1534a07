"""The architecture registry: each name a stored config carries (``config.NAME``)
maps to its config class and its Haiku network (``gptj.network``,
``llama.network``: one contract, see ``gptj.network``). ``model.py`` runs a config
through its entry; nothing else picks an architecture's code by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import gptj
from . import llama
from .config import GPTJConfig, LlamaConfig, ModelConfig


@dataclass(frozen=True)
class Architecture:
    """One architecture: its registry ``name``, ``config`` class and ``network``
    (config, tokens_BT, positions_BT, key_mask_BS, cache, start, last_only=False,
    segments_BT=None, head=True) -> (logits (B, T, V) fp32, or with ``head=False`` the final
    hidden states (B, T, D), KVCache), run inside ``hk.transform``."""

    name: str
    config: type[ModelConfig]
    network: Callable[..., Any]


REGISTRY: dict[str, Architecture] = {a.name: a for a in (
    Architecture(GPTJConfig.NAME, GPTJConfig, gptj.network),
    Architecture(LlamaConfig.NAME, LlamaConfig, llama.network),
)}


def architecture_of(config: ModelConfig) -> Architecture:
    """``config``'s entry (its class's ``NAME``)."""
    return REGISTRY[config.NAME]
