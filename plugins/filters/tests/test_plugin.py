import inspect
import tomllib
from importlib import metadata
from pathlib import Path

import pluggy
import pytest

from star_engine import hooks
from star_engine.api import Candidate, Verdict
from star_filters import plugin

ROOT = Path(__file__).resolve().parents[1]


def collect(hook_name):
    pm = pluggy.PluginManager("star_engine")
    pm.add_hookspecs(hooks)
    pm.register(plugin, name="filters")
    pm.check_pending()
    found = {}
    getattr(pm.hook, hook_name)(register=lambda name, factory: found.setdefault(name, factory))
    return found


def test_registers_checkers_and_filters():
    assert sorted(collect("register_checkers")) == ["exact", "exact_lower", "mc_letter", "numeric", "regex"]
    assert sorted(collect("register_filters")) == ["dedup", "hint_leak", "length_cap"]
    assert collect("register_schedules") == {}


@pytest.mark.parametrize("name, factory", [*plugin.CHECKERS.items(), *plugin.FILTERS.items()])
def test_factories_take_explicit_keyword_options(name, factory):
    params = inspect.signature(factory).parameters.values()
    assert params, name
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), name


@pytest.mark.parametrize("name, factory", plugin.CHECKERS.items())
def test_checkers_build_with_defaults(name, factory):
    checker = factory(pattern=r"(\d+)") if name == "regex" else factory()
    generation, extracted, gold = ("(e)", "e", "E") if name == "mc_letter" else ("7", "7", "7")
    verdict = checker.check(generation, extracted, gold)
    assert isinstance(verdict, Verdict) and verdict.correct, name


@pytest.mark.parametrize("name, factory", plugin.FILTERS.items())
def test_filters_build_with_defaults(name, factory):
    candidate = Candidate("q", 1, 0, "Q: ?\nA:", " (e).", "e", "e", True, False)
    assert factory().keep([candidate], []) == [True], name


def test_entry_point_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "star-engine-filters"
    assert project["entry-points"]["star_engine"] == {"filters": "star_filters.plugin"}
    try:
        dist = metadata.distribution("star-engine-filters")
    except metadata.PackageNotFoundError:
        return  # not installed: the declaration above is what installing publishes
    eps = [e for e in dist.entry_points if e.group == "star_engine"]
    assert [(e.name, e.value) for e in eps] == [("filters", "star_filters.plugin")]
