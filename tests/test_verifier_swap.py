"""Swapping a verifier without touching the core: the experiment file names another
answer checker (a built-in one, or one from a third-party package) or adds a filter,
and the run's kept rationales change exactly as predicted.

The predictions come from the scripted model's rule (tests/star_testkit/scripted.py), not
from the run's own output: before any training it answers a question right when
``_h("a+b") % 3 == 0`` and otherwise ``a + b + off`` with ``off`` in 1..8 drawn from
the generation seed the core derives for (experiment seed, iteration, question, sample).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_testkit import REPO, TESTS, TOY_TOML
from star_testkit.scripted import ToyTask, _h
from star_engine.cli import main
from star_engine.run.stages import derive_seed

EXAMPLE = REPO / "examples" / "star-plugin-example"
SEED = 7  # the toy experiment's seed
LEAK = 2  # ScriptedBackend(leak_mod=2)
CAP = 29  # toy rationales are 27, 29, 31 or 32 characters long


@pytest.fixture
def plugins(monkeypatch):
    """The scripted plugin, the built-in checkers/filters and the example package, loaded by module name."""
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,star_filters.plugin,star_plugin_example.plugin")
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delenv("SCRIPTED_KILL", raising=False)


def run(tmp_path: Path, name: str, task_lines: str) -> list[dict]:
    """Run iteration 1 of the toy experiment with extra ``[task]`` lines; its rationale rows."""
    text = TOY_TOML.format(out=(tmp_path / name).as_posix()).replace("iterations = 3", "iterations = 1")
    text = text.replace('filters = ["toy_leak"]\n', task_lines + "\n")
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    assert main(["run", str(path), "--quiet"]) == 0
    return pq.read_table(tmp_path / name / "iterations/001/rationales.parquet").to_pylist()


def offsets() -> dict[str, int]:
    """How far off the untrained scripted model's answer is, per train question (0 = right)."""
    out = {}
    for ex in ToyTask().load("train", None):
        a, b = map(int, ex.question.split("+"))
        easy = _h(f"{a}+{b}") % 3 == 0
        out[ex.id] = 0 if easy else random.Random(derive_seed(SEED, 1, ex.id, 0, "generate")).randrange(1, 9)
    return out


def gold(qid: str) -> int:
    (ex,) = [e for e in ToyTask().load("train", None) if e.id == qid]
    return int(ex.answer)


def leaks(qid: str) -> bool:
    """Whether the scripted model's hinted answer to ``qid`` repeats the hint."""
    (ex,) = [e for e in ToyTask().load("train", None) if e.id == qid]
    return _h(f"Q: {ex.question} (hint: {ex.answer})\nA:") % LEAK == 0


def kept(rows: list[dict], hinted: bool) -> set[str]:
    return {r["question_id"] for r in rows if r["kept"] and r["was_hinted"] == hinted}


def rationalized(rows: list[dict]) -> set[str]:
    return {r["question_id"] for r in rows if r["was_hinted"]}


def test_numeric_with_tolerance_accepts_near_misses(plugins, tmp_path):
    off = offsets()
    exact = run(tmp_path, "exact", 'filters = ["toy_leak"]')  # the toy task's default checker
    tolerant = run(tmp_path, "numeric", 'filters = ["toy_leak"]\nchecker = { name = "numeric", abs_tol = 3 }')
    assert {r["checker"] for r in exact} == {"toy_exact"} and {r["checker"] for r in tolerant} == {"numeric"}

    right = {q for q, o in off.items() if o == 0}
    near = {q for q, o in off.items() if 1 <= o <= 3}
    far = {q for q, o in off.items() if o > 3}
    assert right and near and far  # the toy data exercise all three cases
    assert kept(exact, hinted=False) == right
    assert kept(tolerant, hinted=False) == right | near
    # Rows accepted by one checker and rejected by the other, by id:
    newly = {r["question_id"] for r in tolerant if r["kept"] and not r["was_hinted"]} - kept(exact, False)
    assert newly == near
    for r in exact:
        if r["question_id"] in near and not r["was_hinted"]:
            assert r["rejected_by"] == "checker" and r["predicted"] == str(gold(r["question_id"]) + off[r["question_id"]])
    # Only the questions still wrong are rationalized, and hint-leaking answers stay out.
    assert rationalized(exact) == near | far and rationalized(tolerant) == far
    assert kept(tolerant, hinted=True) == {q for q in far if not leaks(q)}


def test_checker_from_a_third_party_package(plugins, tmp_path):
    """unit_numeric comes from the example package; relative tolerance 10% on unit-less answers."""
    off = offsets()
    rows = run(tmp_path, "unit", 'filters = ["toy_leak"]\nchecker = { name = "unit_numeric", rel_tol = 0.1 }')
    assert {r["checker"] for r in rows} == {"unit_numeric"}
    # |p - g| <= 0.1 * max(p, g) with p = g + off  <=>  9 * off <= g
    accepted = {q for q, o in off.items() if 9 * o <= gold(q)}
    assert kept(rows, hinted=False) == accepted
    assert {q for q, o in off.items() if o} & accepted and {q for q, o in off.items() if o} - accepted
    assert rationalized(rows) == set(off) - accepted


def test_adding_a_length_cap_filter(plugins, tmp_path):
    off = offsets()
    base = run(tmp_path, "base", 'filters = ["toy_leak"]')
    capped = run(tmp_path, "cap", f'filters = ["toy_leak", {{ name = "length_cap", max_chars = {CAP} }}]')
    # The scripted model's rationale, when kept, is " a plus b. The answer is a+b."
    def text(qid: str) -> str:
        a, b = map(int, re.fullmatch(r"(\d+)\+(\d+)", next(e.question for e in ToyTask().load("train", None)
                                                            if e.id == qid)).groups())
        return f" {a} plus {b}. The answer is {a + b}."
    long = {q for q in off if len(text(q)) > CAP}
    before = {(r["question_id"], r["was_hinted"]) for r in base if r["kept"]}
    assert any(len(text(q)) == CAP for q, _ in before)  # the boundary itself is exercised
    after = {(r["question_id"], r["was_hinted"]) for r in capped if r["kept"]}
    assert after == {(q, h) for q, h in before if q not in long}
    assert before - after and after  # it removed some and kept some
    cut = {(r["question_id"], r["was_hinted"]) for r in capped if r["rejected_by"] == "length_cap"}
    assert cut == before - after
    for r in capped:  # the checker's and the leak filter's verdicts are untouched
        match = next(x for x in base if (x["question_id"], x["was_hinted"]) == (r["question_id"], r["was_hinted"]))
        assert r["correct"] == match["correct"] and (r["rejected_by"] == "toy_leak") == (match["rejected_by"] == "toy_leak")
