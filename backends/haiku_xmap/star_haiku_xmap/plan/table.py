"""The plan's tables, jax-free (the CLI builds the plan's options at start-up): sizes in GiB
and the short spellings of dtypes and flags."""

from __future__ import annotations

from typing import Any

GIB = 1 << 30


def short(dtype: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16"}.get(dtype, dtype)


def yes(flag: Any) -> str:
    return flag if isinstance(flag, str) else ("yes" if flag else "no")
