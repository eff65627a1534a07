"""How a question's gold reaches the checker.

``Checker.check`` receives the gold as one string, ``Example.answer``, and a reasoning-gym
``score_answer(answer, entry)`` needs the whole entry (its metadata: the numbers of a
countdown, the board of a puzzle). So the reasoning_gym task's gold answer is a reference to
its entry, as compact JSON::

    {"answer":"-4","dataset":"chain_sum","config":{"max_terms":3},"seed":536870912,
     "size":200,"index":17,"reasoning_gym":"0.1.25"}

``answer`` is the dataset's own answer (readable in every record), ``dataset``, ``config`` (the
plain form, ``star_rgym.config.plain``), ``seed`` and ``size`` rebuild the very dataset object
the task drew from, and ``index`` is the entry's position in it: reasoning-gym draws item
``index`` from ``Random(seed + index)``, so the entry is a function of the reference. The
checker gets the entry from :func:`entry`, whose cache the task filled while it drew the
splits (in another process, or after the cache forgot it, the entry is drawn again and its
answer checked against ``answer``). ``reasoning_gym`` records the version that drew it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from star_engine import UserError
from star_engine.helpers import is_int

from .config import build, canonical, typed
from .library import quiet, version

KEYS = ("answer", "dataset", "config", "seed", "size", "index", "reasoning_gym")
MAX_DATASETS = 64
"""Dataset objects kept (one per split and configuration)."""


@dataclass(frozen=True)
class Ref:
    """Where a gold answer's entry comes from: the dataset ``name`` built with the plain
    configuration ``config`` (canonical JSON), ``seed`` and ``size``, item ``index``."""

    answer: str
    name: str
    config: str
    seed: int
    size: int
    index: int
    version: str

    def encode(self) -> str:
        body = {"answer": self.answer, "dataset": self.name, "config": json.loads(self.config), "seed": self.seed,
                "size": self.size, "index": self.index, "reasoning_gym": self.version}
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def decode(gold: str) -> Ref:
    """The reference a gold answer holds; ValueError when ``gold`` is not one."""
    try:
        body = json.loads(gold)
    except (TypeError, ValueError):
        raise ValueError("not JSON") from None
    if not isinstance(body, dict) or sorted(body) != sorted(KEYS):
        raise ValueError(f"not an object with the keys {', '.join(KEYS)}")
    ints = [body[k] for k in ("seed", "size", "index")]
    if not all(is_int(v) and v >= 0 for v in ints) \
            or body["index"] >= body["size"]:
        raise ValueError("seed, size and index must be integers >= 0, index < size")
    if not all(isinstance(body[k], str) for k in ("answer", "dataset", "reasoning_gym")) \
            or not isinstance(body["config"], dict):
        raise ValueError("answer, dataset and reasoning_gym must be strings, config an object")
    return Ref(body["answer"], body["dataset"], canonical(body["config"]), body["seed"], body["size"],
               body["index"], body["reasoning_gym"])


_datasets: dict[tuple[str, str, int, int], Any] = {}


def dataset(name: str, plain_config: str, seed: int, size: int, key: str = "config", size_key: str = "size") -> Any:
    """The dataset object of (``name``, ``plain_config``, ``seed``, ``size``), built once."""
    k = (name, plain_config, seed, size)
    if k not in _datasets:
        if len(_datasets) >= MAX_DATASETS:
            _datasets.clear()
        options = typed(name, json.loads(plain_config), key)
        _datasets[k] = build(name, options, seed, size, key, size_key)
    return _datasets[k]


@lru_cache(maxsize=1 << 16)
def entry(name: str, plain_config: str, seed: int, size: int, index: int) -> dict[str, Any]:
    """Item ``index`` of that dataset (shared: never modify it)."""
    ds = dataset(name, plain_config, seed, size)
    with quiet():
        return ds[index]


def resolve(gold: str, who: str) -> tuple[Any, dict[str, Any]]:
    """(dataset, entry) of a gold answer; UserError, naming ``who``, for a gold that is not a
    reasoning_gym task's or whose entry no longer draws the same."""
    try:
        ref = decode(gold)
    except ValueError as e:
        shown = gold if len(gold) <= 60 else gold[:57] + "..."
        raise UserError(f"{who}: the gold answer {shown!r} is not a reasoning_gym task's ({e}): this checker "
                        f"scores the questions of task.dataset = \"reasoning_gym\" only") from None
    ds = dataset(ref.name, ref.config, ref.seed, ref.size)
    item = entry(ref.name, ref.config, ref.seed, ref.size, ref.index)
    if str(item["answer"]) != ref.answer:
        raise UserError(f"{who}: reasoning-gym dataset {ref.name!r} (seed {ref.seed}, size {ref.size}) item "
                        f"{ref.index} now has the answer {str(item['answer'])!r}, not the gold {ref.answer!r}: "
                        f"it was drawn by reasoning-gym {ref.version}, this is {version()}")
    return ds, item
