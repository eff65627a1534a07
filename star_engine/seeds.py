"""Seeds of every random choice: derived from the text of what the choice is about (experiment
seed, iteration, question, sample, purpose), never from batch position or time, so results do not
depend on batching or on where a run was interrupted."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from the parts' text: stable across runs, machines and batching."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def coin(p: float, *parts: Any) -> bool:
    return derive_seed(*parts) / 0x80000000 < p
