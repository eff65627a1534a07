"""The repository's shape: the core's modules and the benchmark scripts import each other without a cycle."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from star_testkit import REPO

sys.path.insert(0, str(REPO / "scripts"))
import house_report  # noqa: E402


def imports_of(path: Path, local: set[str]) -> set[str]:
    """The sibling modules ``path`` imports, at top level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & local


def test_benchmark_scripts_import_without_a_cycle():
    folder = REPO / "benchmarks"
    graph = {p.stem: imports_of(p, {q.stem for q in folder.glob("*.py")}) for p in folder.glob("*.py")}
    assert graph["hf_peer"] and graph["gptj_throughput"]  # the graph is read, not empty

    def cycle_from(node: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        if node in path:
            return path[path.index(node):] + (node,)
        return next((c for nxt in sorted(graph[node]) if (c := cycle_from(nxt, path + (node,)))), None)

    cycles = [c for start in sorted(graph) if (c := cycle_from(start, ()))]
    assert cycles == [], " -> ".join(cycles[0])


def test_core_modules_import_without_a_cycle():
    """Counting every import, a function's too (scripts/house_report.py reads them). The package
    itself, ``star_engine/__init__.py``, is left out: it is the plugin API's facade, whose names
    load on first use (its imports are for type checkers), so it imports no module at run time."""
    modules = {name: m for name, m in house_report.read_modules(REPO).items()
               if name.startswith("star_engine.")}
    for m in modules.values():
        m.imports &= set(modules)
    assert len(modules) > 30 and modules["star_engine.run.runner"].imports  # the graph is read, not empty
    assert house_report.cycles(modules) == []


# Underscore names that are public by convention: a NamedTuple's methods, os._exit (a child
# process's exit without the parent's cleanup).
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_exit"}


def package_dirs() -> list[Path]:
    """Every package of the project: the core, the backend, each plugin."""
    plugins = [p for p in sorted((REPO / "plugins").glob("*/star_*")) if (p / "__init__.py").is_file()]
    backends = [p for p in sorted((REPO / "backends").glob("*/star_*")) if (p / "__init__.py").is_file()]
    return [REPO / "star_engine", *backends, *plugins]


def private_reaches(source: str) -> list[str]:
    """Where ``source`` uses another object's or module's private name: ``from m import _x``, or
    ``obj._x`` with ``obj`` anything but ``self``/``cls`` (``self.backend._load`` included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import {a.name}"
                      for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
              and node.attr not in PUBLIC_UNDERSCORE
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_private_reach_check_sees_each_form():
    code = ("from .plugin import _load\nimport m\nx = m._helper()\nbackend._keep_written(1)\n"
            "self.backend._load(2)\nself._own()\ncls._own\nt._replace(a=1)\n")
    assert [r.split(": ", 1)[1] for r in private_reaches(code)] == [
        "from .plugin import _load", "m._helper", "backend._keep_written", "self.backend._load"]


def test_no_module_calls_another_module_s_private_name():
    """A module uses its own underscore names only (issue #40: the preference and LoRA stages
    called the backend's ``_load`` and ``_keep_written``, the tuner ``Stages._generate``): what
    another module needs is public, named without the underscore."""
    dirs = package_dirs()
    assert len(dirs) >= 14  # the core, the backend, twelve plugins: the tree is read
    reaches = [f"{path.relative_to(REPO)} {r}" for d in dirs for path in sorted(d.rglob("*.py"))
               for r in private_reaches(path.read_text())]
    assert reaches == []


def test_the_type_checker_covers_every_package():
    """pyproject.toml's mypy ``files`` names every package (a new plugin is checked too) and the
    benchmarks' and scripts' folders, with ``check_untyped_defs`` (one setting for all)."""
    import tomllib

    mypy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy.get("check_untyped_defs") is True
    assert {str(d.relative_to(REPO)) for d in package_dirs()} | {"benchmarks", "scripts"} <= set(mypy["files"])
    # mypy names a script by its stem (the module it is when it runs): two of one name would stop it.
    stems = [p.stem for folder in ("benchmarks", "scripts") for p in (REPO / folder).rglob("*.py")]
    assert len(stems) > 10 and sorted(s for s in set(stems) if stems.count(s) > 1) == []


# The core's floors, lowest first (docs/house.md draws them): a module imports only from its own
# floor or below. The door's modules are floor 0 but for the command boundary and the command line.
FLOORS = {"config": 1, "rundir": 2, "report": 3, "boundary": 4, "run": 5, "cli": 6, "__main__": 6}


def floor_of(module: str) -> int:
    return FLOORS.get(module.split(".")[1], 0)


def upward_imports(imports: dict[str, set[str]]) -> list[str]:
    return [f"{n} -> {i}" for n, found in sorted(imports.items()) for i in sorted(found)
            if i in imports and floor_of(i) > floor_of(n)]


def test_the_core_wings_import_downwards_only():
    modules = {name: m for name, m in house_report.read_modules(REPO).items() if name.startswith("star_engine.")}
    assert {floor_of(n) for n in modules} == set(range(7))  # every floor holds a module
    assert upward_imports({n: m.imports for n, m in modules.items()}) == []


def test_the_floor_check_sees_an_upward_import():
    graph = {"star_engine.rundir.store": {"star_engine.run.stages", "star_engine.errors"},
             "star_engine.run.stages": {"star_engine.rundir.store"}, "star_engine.errors": set()}
    assert upward_imports(graph) == ["star_engine.rundir.store -> star_engine.run.stages"]
