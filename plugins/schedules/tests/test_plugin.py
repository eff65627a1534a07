import inspect
import tomllib
from importlib import metadata
from pathlib import Path

import pluggy
import pytest

from star_engine import hooks
from star_schedules import plugin

ROOT = Path(__file__).resolve().parents[1]


def collect(hook_name):
    pm = pluggy.PluginManager("star_engine")
    pm.add_hookspecs(hooks)
    pm.register(plugin, name="schedules")
    pm.check_pending()
    found = {}
    getattr(pm.hook, hook_name)(register=lambda name, factory: found.setdefault(name, factory))
    return found


def test_registers_schedules():
    assert collect("register_schedules") == {
        "epochs": plugin.SCHEDULES["epochs"],
        "steady_grow": plugin.SCHEDULES["steady_grow"],
        "exponential_grow": plugin.SCHEDULES["exponential_grow"],
    }
    assert collect("register_checkers") == {}


@pytest.mark.parametrize("name, factory", plugin.SCHEDULES.items())
def test_factories_take_explicit_keyword_options(name, factory):
    params = inspect.signature(factory).parameters.values()
    assert params and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), name
    assert "max_steps" in inspect.signature(factory).parameters


@pytest.mark.parametrize("name, factory", plugin.SCHEDULES.items())
def test_factories_build_with_defaults(name, factory):
    assert factory().steps(1, 400, 8, 1) == (50 if name == "epochs" else 40)


def test_entry_point_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "star-engine-schedules"
    assert project["entry-points"]["star_engine"] == {"schedules": "star_schedules.plugin"}
    try:
        dist = metadata.distribution("star-engine-schedules")
    except metadata.PackageNotFoundError:
        return  # not installed: the declaration above is what installing publishes
    eps = [e for e in dist.entry_points if e.group == "star_engine"]
    assert [(e.name, e.value) for e in eps] == [("schedules", "star_schedules.plugin")]
