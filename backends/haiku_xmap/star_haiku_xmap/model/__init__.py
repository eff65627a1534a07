"""The networks (GPT-J: ``gptj``, the Llama family: ``llama``; ``layers`` theirs in common,
``architectures`` the table of both), their config (``config``), the entry points the rest of the
backend calls (``network``: init, forward, shapes) and LoRA adapters (``lora``).

Importing the package imports no jax. Until release 0.2 it also lends the names of the old
module star_haiku_xmap.model (now network), with a DeprecationWarning.
"""

from __future__ import annotations

from typing import Any

from .. import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
