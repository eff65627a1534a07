"""The package's shape: import and export live in ``star_haiku_xmap.convert`` (the native
checkpoint format in ``star_haiku_xmap.checkpoint``, the plan command in
``star_haiku_xmap.plan``, sampling in ``star_haiku_xmap.sampling``); the model, training and
sampling modules use none of convert, and the few top-level modules that must are listed
here; the package has no import cycle, counting imports inside functions."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import star_haiku_xmap

PACKAGE = Path(star_haiku_xmap.__file__).parent
CONVERT = {"hf_import", "hf_llama", "mtj_layout", "mtj_import", "mtj_export", "hf_export", "peft_export",
           "commands", "actions"}
SUBPACKAGES = {"checkpoint": {"format", "write", "safeio"}, "plan": {"command", "memory", "models", "experiment", "table"},
               "sampling": {"static", "continuous", "slots", "text"},
               "model": {"config", "gptj", "llama", "layers", "architectures", "network", "lora", "lora_options"},
               "train": {"trainer", "step_lr", "loss", "chunked_ce", "fused_ce", "packing", "packplan", "resume", "lora_stage",
                         "preference"},
               "runtime": {"hugepages", "layout", "coordination", "sharding", "envvars", "speed", "hostcopy"},
               "session": {"machine", "distributed", "weights"}}
# the door and the modules between the floors; the rest is by concern
TOP = {"__init__", "plugin", "engine", "options", "tokenizer", "preflight", "inference"}
# The top-level modules that import from the subpackage, and why they must.
USES_CONVERT = {
    "plugin": {"commands", "hf_export", "peft_export"},  # registers the commands; exports for a server engine
    "inference": {"hf_import"},  # load_model: a native checkpoint or an HF folder
}
MAX_LINES = 400


def convert_imports(path: Path) -> set[str]:
    """The modules of ``star_haiku_xmap.convert`` that top-level module ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.startswith("star_haiku_xmap."):
                module = module.removeprefix("star_haiku_xmap.")
            elif node.level != 1:
                continue
            if module == "convert":
                found |= {a.name for a in node.names}
            elif module.startswith("convert."):
                found.add(module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("star_haiku_xmap.convert.")}
    return found


def test_conversion_modules_live_in_the_subpackage():
    assert {p.stem for p in (PACKAGE / "convert").glob("*.py")} - {"__init__"} == CONVERT
    assert not CONVERT & {p.stem for p in PACKAGE.glob("*.py")}  # no module left (or shimmed) at the old path
    for package, modules in SUBPACKAGES.items():
        assert {p.stem for p in (PACKAGE / package).glob("*.py")} - {"__init__", "__main__"} == modules
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP
    old = {"checkpoint_write", "safeio", "plan_models", "plan_experiment", "sample", "continuous", "text"}
    assert not old & ({p.stem for p in PACKAGE.glob("*.py")} | {p.stem for p in (PACKAGE / "convert").glob("*.py")})


def test_only_the_listed_modules_import_the_subpackage():
    used = {p.stem: convert_imports(p) for p in PACKAGE.glob("*.py")}
    assert {name: modules for name, modules in used.items() if modules} == USES_CONVERT


def test_subpackage_modules_are_short():
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
             for folder in ("convert", *SUBPACKAGES) for p in (PACKAGE / folder).glob("*.py")}
    assert {name: n for name, n in lines.items() if n > MAX_LINES} == {}


def _house_report():
    spec = importlib.util.spec_from_file_location("house_report", PACKAGE.parents[2] / "scripts" / "house_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_the_package_has_no_import_cycle():
    # house_report counts every import, those inside functions too (a deferred import
    # hides a cycle, it does not remove it).
    house = _house_report()
    modules = house.read_modules(PACKAGE.parents[2])
    ours = [m for name, m in modules.items() if name.split(".")[0] == "star_haiku_xmap"]
    assert len(ours) > 30 and any(m.imports for m in ours)  # the graph is read, not empty
    assert [group for group in house.cycles(modules) if group[0].startswith("star_haiku_xmap")] == []


def test_old_module_paths_warn_and_give_the_new_module():
    # Each module that moved into a folder imports by its old path until 0.2: the same module
    # object, with a DeprecationWarning; the old model and train modules (now packages) lend
    # their names alike. In a fresh interpreter, so that nothing is imported yet.
    code = ("import importlib, warnings\n"
            "from star_haiku_xmap import MOVED\n"
            "for old, new in MOVED.items():\n"
            "    with warnings.catch_warnings(record=True) as caught:\n"
            "        warnings.simplefilter('always')\n"
            "        module = importlib.import_module('star_haiku_xmap.' + old)\n"
            "    assert module is importlib.import_module('star_haiku_xmap.' + new), old\n"
            "    assert [w.category for w in caught] == [DeprecationWarning], (old, caught)\n"
            "    assert 'star_haiku_xmap.' + new in str(caught[0].message)\n"
            "from star_haiku_xmap import model, train\n"
            "from star_haiku_xmap.model import network\n"
            "from star_haiku_xmap.train import trainer\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    assert model.forward is network.forward and train.train is trainer.train\n"
            "assert [w.category for w in caught] == [DeprecationWarning] * 2\n"
            "print(len(MOVED))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(len(star_haiku_xmap.MOVED))


def test_discovery_and_the_cli_import_no_jax():
    # The plugin, the commands and the plan's options load when the CLI starts; jax (and
    # haiku) load when a backend is built or a command runs.
    code = ("import sys\n"
            "import star_haiku_xmap.plugin, star_haiku_xmap.convert.commands, star_haiku_xmap.plan.command\n"
            "import star_haiku_xmap.model, star_haiku_xmap.train, star_haiku_xmap.runtime, star_haiku_xmap.model.config\n"
            "import star_haiku_xmap.model.lora_options, star_haiku_xmap.runtime.layout, star_haiku_xmap.runtime.hugepages\n"
            "print(sorted(m for m in ('jax', 'haiku', 'optax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# The backend's floors, lowest first (docs/house.md draws them): a module imports only from its
# own floor or below.
FLOORS = ["__init__", "runtime", "kernels", "model", "checkpoint", "tokenizer", "options", "session", "preflight", "train",
          "sampling", "engine", "plan", "convert", "inference", "plugin"]


def floor_of(module: str) -> int:
    parts = module.split(".")
    return 0 if len(parts) == 1 else FLOORS.index(parts[1])


def test_the_backend_imports_downwards_only():
    import sys

    from star_testkit import REPO

    sys.path.insert(0, str(REPO / "scripts"))
    import house_report

    modules = {n: m for n, m in house_report.read_modules(REPO).items() if n.startswith("star_haiku_xmap")}
    assert len({floor_of(n) for n in modules}) == len(FLOORS)  # every floor holds a module
    upward = [f"{n} -> {i}" for n, m in sorted(modules.items()) for i in sorted(m.imports)
              if i in modules and floor_of(i) > floor_of(n)]
    assert upward == []
