"""The plugin API is what ``star_engine.__all__`` (the nouns) and ``star_engine.helpers.__all__``
(the helpers) name, and the plugins of this repository (the backend included) use nothing else:
no other ``star_engine.<module>`` import, no name those do not declare. The helpers' old names
in ``star_engine`` keep working until 0.2, with a DeprecationWarning."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import star_engine
import star_engine.helpers as helpers
from star_testkit import REPO


def plugin_packages() -> list[Path]:
    found = []
    for parent in ("plugins", "backends", "examples"):
        for project in sorted((REPO / parent).glob("*/pyproject.toml")):
            found += [init.parent for init in sorted(project.parent.glob("*/__init__.py"))
                      if init.parent.name != "tests"]
    return found


def core_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) for every import of the core in ``path``, wherever it stands."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, "*") for a in node.names if a.name.split(".")[0] == "star_engine"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "star_engine":
            out += [(node.lineno, node.module, a.name) for a in node.names]
    return out


def test_the_api_is_declared_and_every_name_resolves():
    assert {"hookimpl", "__version__", "Example", "UserError", "Section", "at_least"} <= set(star_engine.__all__)
    assert len(star_engine.__all__) == len(set(star_engine.__all__))
    for name in star_engine.__all__:
        assert getattr(star_engine, name) is not None, name
    with pytest.raises(AttributeError):
        star_engine.not_a_name  # noqa: B018


@pytest.mark.parametrize("package", plugin_packages(), ids=lambda p: p.name)
def test_plugins_import_only_the_declared_api(package: Path):
    files = sorted(package.rglob("*.py"))
    assert files
    wrong = []
    for path in files:
        for line, module, name in core_imports(path):
            if not ((module == "star_engine" and name in star_engine.__all__)
                    or (module == "star_engine.helpers" and name in helpers.__all__)):
                wrong.append(f"{path.relative_to(REPO)}:{line}: {module}.{name}")
    assert wrong == [], "\n".join(wrong)


def test_the_helpers_are_declared_and_resolve():
    assert len(helpers.__all__) == len(set(helpers.__all__)) == len(helpers.HELPERS)
    for name in helpers.__all__:
        assert getattr(helpers, name) is not None, name
    assert not set(helpers.__all__) & set(star_engine.__all__)  # a name is a noun or a helper, never both
    with pytest.raises(AttributeError):
        helpers.not_a_name  # noqa: B018


OLD_PLUGIN = '''
from star_engine import hookimpl, read_jsonl, get, derive_seed


class OldTask:
    """A task written against 0.1.0: its helpers imported from star_engine."""

    default_checker = "exact"
    default_hint = "x"
    stop = ("\\n",)

    def load(self, split, path):
        return [(where, get(row, "q", str, where), derive_seed(0, 0, where)) for where, row in read_jsonl(path)]


@hookimpl
def register_tasks(register):
    register("old_task", OldTask)
'''


def test_a_plugin_written_against_the_old_names_runs_and_is_warned(tmp_path, monkeypatch):
    """The deprecation path (docs/plugins.md, "Moved names"): ``from star_engine import
    read_jsonl`` still gives the helper, with a DeprecationWarning naming star_engine.helpers."""
    (tmp_path / "old_plugin.py").write_text(OLD_PLUGIN)
    (tmp_path / "rows.jsonl").write_text('{"q": "a"}\n{"q": "b"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(DeprecationWarning, match=r"star_engine\.read_jsonl moved to star_engine\.helpers\.read_jsonl"):
        import old_plugin
    rows = old_plugin.OldTask().load("train", str(tmp_path / "rows.jsonl"))
    assert [q for _, q, _ in rows] == ["a", "b"] and rows[0][0].endswith("rows.jsonl:1")
    assert old_plugin.read_jsonl is helpers.read_jsonl and old_plugin.get is helpers.get


def test_a_moved_module_path_warns_and_is_the_new_module():
    """Issue #40 moved the core's modules into folders by concern; their old paths work until 0.2."""
    import importlib
    import sys
    import warnings

    import star_engine.rundir.store as new
    sys.modules.pop("star_engine.store", None)  # imported by an earlier test, maybe
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("star_engine.store")
        from star_engine.config import load_experiment  # the old module config.py's name
    assert old is new and old.RunStore is new.RunStore
    from star_engine.config.load import load_experiment as moved
    assert load_experiment is moved
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any("star_engine.store moved to star_engine.rundir.store" in m for m in messages), messages
    assert any("star_engine.config.load_experiment moved to star_engine.config.load" in m for m in messages)
    with pytest.raises(AttributeError):
        import star_engine.config as package
        package.no_such_name  # noqa: B018
