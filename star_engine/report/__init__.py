"""What a run shows: the report (``report``, ``plot``), the table of rationales (``show``), a run's
state (``status``), many runs side by side (``compare``, ``compare_plot``), the export of kept
rationales (``export``) and ``data check`` (``datacheck``).

Until release 0.2 the names of the former module ``star_engine/report.py`` are forwarded from
here with a ``DeprecationWarning``; they live in ``star_engine.report.report``."""

from __future__ import annotations

from typing import Any

from ..lazy import forward

_OLD = ("MAX_ROWS", "MAX_BYTES", "read_metrics", "class_table", "reading", "sampling_table", "successors_table",
        "checker_tables", "markdown", "directory_labels", "run_labels", "Report", "comparison_stem", "write_report")


def __getattr__(name: str) -> Any:
    return forward(__name__, "star_engine.report.report", _OLD, name, "0.2")
