"""``--smoke`` (``experiment.smoke = true``): any experiment as a quick check that every stage of
the loop runs, on a CPU, in a minute or two.

What it changes in the configuration (``apply``: the file's values, before ``--set``, which
still wins; ``config.json`` records the result):

- ``[model]`` becomes ``{ backend = <the file's backend> }``: the backend's defaults, which
  should be a small model that runs on a CPU (haiku_xmap: the tiny byte-level GPT-J on the
  local devices);
- ``experiment.iterations = 1``; ``experiment.output_dir`` gets ``_smoke`` appended (a smoke
  run never touches the real run's folder); ``experiment.limit`` is ``LIMIT`` questions per
  split (unless ``--limit`` says otherwise, or the file asks for fewer);
- ``base_training.steps`` is at most ``STEPS``.

What it changes in the run (``loop.run_star`` reads ``experiment.smoke``):

- each STaR iteration trains at least 1 and at most ``STEPS`` steps (``steps``), so that the
  training stage runs whatever the schedule says for a small set;
- an iteration that kept nothing (a tiny random model rarely answers right) trains on the
  task's gold completions instead (``loop.smoke_gold``) (``Task.gold_completion``; the direct ones when the task has
  no gold rationales), stored as ``iterations/NNN/smoke_gold.parquet``: ``metrics.parquet``'s
  ``trained_on`` is ``"gold_fallback"``, the events have a ``smoke_gold_fallback`` warning and
  the summary says so. ``kept`` stays what the checker and the filters kept (0).
"""

from __future__ import annotations

import copy
from typing import Any

from .schema import is_int

LIMIT = 8
STEPS = 4


def requested(data: dict[str, Any], overrides: list[str], apply_overrides: Any) -> bool:
    """Whether the file, with its ``--set`` overrides, asks for a smoke run (``experiment.smoke``)."""
    probe = copy.deepcopy(data)
    apply_overrides(probe, overrides)
    exp = probe.get("experiment")
    return isinstance(exp, dict) and exp.get("smoke") is True


def apply(data: dict[str, Any], limit: int | None) -> None:
    """The smoke settings written over the file's ``data`` (in place; malformed tables are left
    for validation to name). ``limit``: the ``--limit`` given, if any."""
    exp = data.setdefault("experiment", {})
    if isinstance(exp, dict):
        exp["smoke"] = True
        exp["iterations"] = 1
        out = exp.get("output_dir") or f"runs/{exp.get('name', 'experiment')}"
        if isinstance(out, str):
            exp["output_dir"] = out.rstrip("/") + "_smoke"
        if limit is None:
            given = exp.get("limit")
            exp["limit"] = min(given, LIMIT) if is_int(given) and given > 0 else LIMIT
    model = data.get("model")
    if isinstance(model, dict) and "backend" in model:
        data["model"] = {"backend": model["backend"]}
    bt = data.get("base_training")
    if isinstance(bt, dict) and is_int(bt.get("steps")):
        bt["steps"] = min(bt["steps"], STEPS)


def steps(scheduled: int) -> int:
    """A smoke iteration's optimizer steps: the schedule's, at least 1 and at most ``STEPS``."""
    return min(max(scheduled, 1), STEPS)
