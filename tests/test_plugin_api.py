"""The plugin API is what ``star_engine.__all__`` names, and the plugins of this repository
(the backend included) use nothing else: no ``star_engine.<module>`` import, no name the
package does not declare."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import star_engine
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
            if module != "star_engine" or (name not in star_engine.__all__):
                wrong.append(f"{path.relative_to(REPO)}:{line}: {module}.{name}")
    assert wrong == [], "\n".join(wrong)
