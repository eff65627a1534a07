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
    assert len(modules) > 30 and modules["star_engine.runner"].imports  # the graph is read, not empty
    assert house_report.cycles(modules) == []
