"""star_filters' public code for tasks: FewShotQA (prompt, extract, trim), stop_strings, and
that the other plugins reach star_filters through its public names only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import star_filters
from star_engine import PROMPT_KINDS, UserError
from star_filters import FewShotQA, stop_strings

PLUGINS = Path(__file__).resolve().parents[2]


class Toy(FewShotQA):
    read_lenient = staticmethod(lambda g: g.strip() or None)
    read_original = staticmethod(lambda g: g[-3] if len(g) >= 3 else None)
    store_original = staticmethod(lambda g: g.split("\n")[0])

    def __init__(self, extraction="lenient", stored_completion="until_stop"):
        self.extraction, self.stored_completion = extraction, stored_completion
        self.prompts = {kind: f"<{kind}>\n\n" for kind in PROMPT_KINDS}


def test_prompt_gives_each_kind_and_refuses_others():
    task = Toy()
    assert [task.prompt(k) for k in PROMPT_KINDS] == [f"<{k}>\n\n" for k in PROMPT_KINDS]
    with pytest.raises(ValueError, match="unknown prompt kind 'other'; known: rationale, direct, hint, direct_hint"):
        task.prompt("other")


def test_extract_reads_by_the_extraction_option():
    assert Toy().extract("  so (e) .\n") == "so (e) ."
    assert Toy().extract("  \n") is None
    assert Toy("original").extract("so (e).") == "e"
    assert Toy("original").extract("e.") is None


@pytest.mark.parametrize(("extraction", "stored", "generation", "kept"), [
    ("lenient", "until_stop", "so (e) .\nQ: more", "so (e) .\nQ: more"),  # all of it, as generated
    ("lenient", "original", "so (e) .\nQ: more", "so (e) ."),  # the released code's part
    ("original", "until_stop", "so (e) .\nQ: it 's", "so (e).\nQ: it's"),  # GPT-2's clean-up first
    ("original", "original", "so (e) .\nQ: more", "so (e)."),
])
def test_trim_cleans_up_under_original_then_keeps_the_stored_part(extraction, stored, generation, kept):
    assert Toy(extraction, stored).trim(generation) == kept


def test_a_task_without_its_readings_cannot_be_built():
    class Half(FewShotQA):
        read_lenient = staticmethod(lambda g: g)

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]


def test_stop_strings():
    assert stop_strings(None, ("\nQ:",)) == ("\nQ:",)
    assert stop_strings(["\n\n", "\nQ:"], ("\nQ:",)) == ("\n\n", "\nQ:")
    assert stop_strings([], ("\nQ:",)) == ()
    with pytest.raises(UserError, match=r"^stop: must be a list of non-empty strings, got \['\\n', ''\]$"):
        stop_strings(["\n", ""], ("\nQ:",))


def test_other_plugins_import_only_star_filters_public_names():
    wrong = []
    for path in sorted(PLUGINS.glob("*/star_*/**/*.py")):
        if path.is_relative_to(PLUGINS / "filters"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                mods = [(a.name, "*") for a in node.names]
            else:
                continue
            for module, name in mods:
                if module.split(".")[0] == "star_filters" and (module != "star_filters"
                                                                or name not in star_filters.__all__):
                    wrong.append(f"{path.relative_to(PLUGINS)}:{node.lineno}: {module}.{name}")
    assert wrong == [], "\n".join(wrong)
