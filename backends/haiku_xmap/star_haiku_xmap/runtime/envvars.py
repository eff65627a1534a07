"""The environment variables the backend reads, each read and checked in one place: a value that
is none is one line naming the variable, and ``validate`` reads them all (``preflight.validate_run``)
before a run would meet them mid-way. No jax, no package import: the model, the runtime and the
preflight share it."""

from __future__ import annotations

import math
import os

from star_engine import UserError


def env_seconds(name: str, default: float) -> float:
    """The environment variable ``name`` as a number of seconds > 0 (``default`` when unset); a
    value that is none is one line naming the variable (``validate`` checks them all)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and seconds > 0):
        raise UserError(f"{name}: must be a number of seconds > 0, got {value!r}")
    return seconds


def star_cache_dir(name: str) -> str:
    """The folder ``name`` of star-engine's caches: ``$XDG_CACHE_HOME/star-engine/<name>``, i.e.
    ``~/.cache/star-engine/<name>`` (the compilation cache's and the kernels' default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "star-engine", name)


ATTENTION_ENV = "STAR_HAIKU_XMAP_ATTENTION"
ATTENTION_KINDS = ("auto", "reference", "xla", "cudnn")


def attention_choice() -> str:
    """``STAR_HAIKU_XMAP_ATTENTION`` as set ("auto" when unset; ``layers.attention_kind``
    resolves "auto"); another value is one line naming the variable."""
    kind = os.environ.get(ATTENTION_ENV, "auto").strip() or "auto"
    if kind not in ATTENTION_KINDS:
        raise UserError(f"{ATTENTION_ENV}: must be one of {', '.join(ATTENTION_KINDS)}, got {kind!r}")
    return kind


BARRIER_TIMEOUT = ("STAR_HAIKU_XMAP_BARRIER_TIMEOUT", 3600.0)
PEER_TIMEOUT = ("STAR_HAIKU_XMAP_PEER_TIMEOUT", 60.0)
