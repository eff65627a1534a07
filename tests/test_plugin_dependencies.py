"""A task package declares the distributions its defaults come from: the checker and the
hint formatter a task names as ``default_checker`` / ``default_hint`` are its own, or
registered by a distribution in its ``Requires-Dist`` (so ``pip install`` of the task
package alone gives a task that runs with its defaults)."""

from __future__ import annotations

import re
from importlib import metadata

import pytest

from star_engine.config.registry import Registry

BUILT_IN_TASKS = {"cqa", "gsm8k", "addition", "math", "reasoning_gym"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(distribution: str) -> set[str]:
    return {canonical(re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0]) for r in metadata.requires(distribution) or []}


def undeclared(registry: Registry, task_name: str) -> list[str]:
    """``kind 'name' from distribution`` for each default of the task its package does not declare."""
    comp = registry.components["task"][task_name]
    own = canonical(comp.plugin.distribution)
    declared = requirements(comp.plugin.distribution) | {own}
    out = []
    for kind, attr in (("checker", "default_checker"), ("hint", "default_hint")):
        default = getattr(comp.factory, attr)
        provider = registry.components[kind].get(default)
        dist = canonical(provider.plugin.distribution) if provider else "<not installed>"
        if dist not in declared:
            out.append(f"{kind} {default!r} from {dist}")
    return out


@pytest.fixture(scope="module")
def registry():
    reg = Registry(autoload=True, blocked=set())
    assert BUILT_IN_TASKS <= set(reg.components["task"]), "the built-in task packages are installed"
    return reg


@pytest.mark.parametrize("task_name", sorted(BUILT_IN_TASKS))
def test_task_package_declares_its_default_checker_and_hint(registry, task_name):
    assert undeclared(registry, task_name) == [], registry.components["task"][task_name].plugin.distribution


def test_the_check_can_fail(registry, monkeypatch):
    comp = registry.components["task"]["gsm8k"]
    real = metadata.requires
    monkeypatch.setattr(metadata, "requires", lambda dist: [] if dist == comp.plugin.distribution else real(dist))
    assert undeclared(registry, "gsm8k") == ["checker 'numeric' from star-engine-filters"]
