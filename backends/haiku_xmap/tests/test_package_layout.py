"""The package's shape: file formats, conversion and the subcommands live in
``star_haiku_xmap.convert``; the model, training and sampling modules use none of it, and
the few top-level modules that must (loading, saving or checking files) are listed here."""

from __future__ import annotations

import ast
from pathlib import Path

import star_haiku_xmap

PACKAGE = Path(star_haiku_xmap.__file__).parent
CONVERT = {"safeio", "checkpoint", "checkpoint_write", "hf_import", "hf_llama", "mtj_layout", "mtj_import",
           "mtj_export", "hf_export", "commands", "plan", "plan_models", "plan_experiment"}
# The top-level modules that import from the subpackage, and why they must.
USES_CONVERT = {
    "plugin": {"checkpoint", "commands"},  # loads checkpoints; registers the commands
    "inference": {"checkpoint", "hf_import"},  # load_model: a native checkpoint or an HF folder
    "preflight": {"checkpoint", "safeio"},  # a run's checkpoint files checked before the run starts
    "resume": {"checkpoint", "checkpoint_write"},  # a training snapshot is a checkpoint folder
    "distributed": {"checkpoint", "checkpoint_write"},  # save_checkpoint / host_leaves: a save across processes
    "tokenizer": {"safeio"},  # a tokenizer.json read with a size bound
    "lora_stage": {"checkpoint"},  # a LoRA stage reads its init's manifest and loads adapter checkpoints
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


def test_only_the_listed_modules_import_the_subpackage():
    used = {p.stem: convert_imports(p) for p in PACKAGE.glob("*.py")}
    assert {name: modules for name, modules in used.items() if modules} == USES_CONVERT


def test_conversion_modules_are_short():
    lines = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE / "convert").glob("*.py")}
    assert {name: n for name, n in lines.items() if n > MAX_LINES} == {}
