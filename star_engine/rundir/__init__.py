"""The run directory: atomic files (``fsio``), the Parquet records (``records``, ``store``), the
per-question ledger, the metrics table, the preference pairs the records give
(``preferences``), what a directory holds and whether a rerun may resume (``layout``), its lock
(``runlock``) and the processes that share it, process 0 writing (``procs``).

Until release 0.2 the names of the former module ``star_engine/rundir.py`` are forwarded from
here with a ``DeprecationWarning``; they live in ``star_engine.rundir.layout``."""

from __future__ import annotations

from typing import Any

from ..lazy import forward

_OLD = ("CONFIG_MAX", "FILES", "FOLDERS", "RESUMABLE_CHANGES", "RunDir", "diff", "killed_at_start", "inspect",
        "with_options")


def __getattr__(name: str) -> Any:
    return forward(__name__, "star_engine.rundir.layout", _OLD, name, "0.2")
