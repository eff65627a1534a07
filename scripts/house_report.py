"""The repository's shape in figures: import cycles, function-level imports, long functions.

    python scripts/house_report.py [--root DIR] [--top N] [--json]

Reads every package of the repository (the core, the backend, the plugins) as text with
``ast`` (nothing is imported) and prints:

- the import graph's cycles: strongly connected groups of two or more modules, counting an
  import wherever it stands (a function-level import hides a cycle, it does not remove it)
  but under ``if TYPE_CHECKING:`` (read by type checkers only);
- function-level imports per package (``import`` statements inside a function body);
- the longest functions (lines) and the widest signatures (parameters), ``--top`` of each.

Used for the before/after figures of docs/house.md; ``tests/test_layout.py`` checks the
cycles.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Package:
    """One importable package: its name and the folder that holds it."""

    name: str
    folder: Path


@dataclass
class Module:
    name: str
    path: Path
    imports: set[str] = field(default_factory=set)
    local_imports: int = 0


def packages(root: Path) -> list[Package]:
    """The core, the backend and every plugin folder's package."""
    found = [Package("star_engine", root / "star_engine")]
    for parent in ("plugins", "backends"):
        for project in sorted((root / parent).glob("*/pyproject.toml")):
            for init in sorted(project.parent.glob("*/__init__.py")):
                if init.parent.name != "tests":
                    found.append(Package(init.parent.name, init.parent))
    return found


def module_name(pkg: Package, path: Path) -> str:
    rel = path.relative_to(pkg.folder).with_suffix("")
    parts = [pkg.name, *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def read_modules(root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for pkg in packages(root):
        for path in sorted(pkg.folder.rglob("*.py")):
            name = module_name(pkg, path)
            modules[name] = Module(name, path)
    for mod in modules.values():
        tree = ast.parse(mod.path.read_text(), filename=str(mod.path))
        is_package = mod.path.name == "__init__.py"
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        mod.local_imports = sum(
            isinstance(n, (ast.Import, ast.ImportFrom)) for f in functions for n in ast.walk(f)
        )
        for node in _runtime_nodes(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod.name, is_package, node)
                names = [f"{base}.{a.name}" for a in node.names]
                # ``from pkg import sub`` imports the submodule; the package only for its own names
                targets = names + ([base] if any(n not in modules for n in names) else [])
            for target in targets:
                hit = _owner(target, modules)
                if hit and hit != mod.name:
                    mod.imports.add(hit)
    return modules


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:`` (imports for type checkers only)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _owner(target: str, modules: dict[str, Module]) -> str | None:
    """The longest known module that ``target`` names or lies in."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in modules:
            return name
    return None


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(modules[v].imports):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(modules):
        if v not in index:
            visit(v)
    return sorted(groups)


def functions(modules: dict[str, Module]) -> list[dict]:
    rows = []
    for mod in modules.values():
        tree = ast.parse(mod.path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                params = [p for p in params if p.arg not in ("self", "cls")]
                rows.append({
                    "function": f"{mod.name}.{node.name}",
                    "line": node.lineno,
                    "lines": (node.end_lineno or node.lineno) - node.lineno + 1,
                    "params": len(params) + bool(a.vararg) + bool(a.kwarg),
                })
    return rows


def report(root: Path, top: int) -> dict:
    modules = read_modules(root)
    rows = functions(modules)
    per_package: dict[str, int] = {}
    for mod in modules.values():
        key = mod.name.split(".")[0]
        per_package[key] = per_package.get(key, 0) + mod.local_imports
    return {
        "modules": len(modules),
        "cycles": cycles(modules),
        "function_level_imports": dict(sorted(per_package.items())),
        "longest": sorted(rows, key=lambda r: (-r["lines"], r["function"]))[:top],
        "widest": sorted(rows, key=lambda r: (-r["params"], r["function"]))[:top],
        "over_60_lines": sum(r["lines"] > 60 for r in rows),
        "over_10_params": sum(r["params"] > 10 for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    data = report(args.root, args.top)
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"modules: {data['modules']}")
    print(f"import cycles: {len(data['cycles'])}")
    for group in data["cycles"]:
        print("  " + " <-> ".join(group))
    print("function-level imports: " + ", ".join(f"{k} {v}" for k, v in data["function_level_imports"].items()))
    print(f"functions over 60 lines: {data['over_60_lines']}; over 10 parameters: {data['over_10_params']}")
    print("\n| longest function | lines |\n|---|---|")
    for r in data["longest"]:
        print(f"| `{r['function']}` | {r['lines']} |")
    print("\n| widest signature | parameters |\n|---|---|")
    for r in data["widest"]:
        print(f"| `{r['function']}` | {r['params']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
