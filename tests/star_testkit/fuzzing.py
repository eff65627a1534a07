"""Shared pieces of the property-based (hypothesis) fuzz tests.

Every fuzz property states the same rule: an input ends either accepted or in the one-line
error (``UserError``, ``IntegrityError`` among them), never in another exception, and the
readers never allocate beyond a cap (``memory_cap``: an address-space limit, so that a
native allocation (numpy, zstd) fails as loudly as a Python one).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from hypothesis import settings
from hypothesis import strategies as st

SCALE = 20 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 1
CAP = 512 << 20  # what one reader call may add to the address space


def budget(n: int):
    """``@budget(n)``: a property's fixed number of examples (times 20 in the thorough profile)."""
    return settings(max_examples=n * SCALE)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


@contextlib.contextmanager
def memory_cap(extra: int = CAP) -> Iterator[None]:
    """Within the block, the process may grow its address space by ``extra`` bytes at most
    (Linux; elsewhere nothing is capped)."""
    if not sys.platform.startswith("linux"):
        yield
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + extra
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@st.composite
def mutated(draw, base: bytes, max_edits: int = 4) -> bytes:
    """``base`` with a few edits: bits flipped, bytes replaced, inserted or deleted, a cut."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, max_edits))):
        kind = draw(st.sampled_from(["flip", "replace", "insert", "delete", "truncate", "splice"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "replace" and data:
            blob = draw(st.binary(min_size=1, max_size=8))
            data[at:at + len(blob)] = blob
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 16))]
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice" and data:  # a piece of the file copied elsewhere in it
            n = draw(st.integers(1, 64))
            data[draw(st.integers(0, len(data))):0] = data[at:at + n]
    return bytes(data)


# JSON-like values: what a hostile file can put where a reader expects a number, a string, a table
scalars = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=True)
           | st.text(max_size=12) | st.sampled_from(["", "\x00", "../..", "/etc", "float32", "F32", "bfloat16"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
