r"""``task.options.extraction``: the four conventions on the audit's edge cases, the gold answers
each reads from a solution (or the row it refuses), the prompts each is shown, and a misspelt name.

How the expected values were made (by hand, from the definitions, not by running the code cited):

- ``hendrycks``: hendrycks/math at 985bdc1696e8, ``modeling/dataset/util.py:last_boxed_only_string``
  then ``modeling/eval_math_gpt.py:remove_boxed``, traced line by line: ``idx = rfind("\\boxed")``
  (else ``rfind("\\fbox")``, else None); from ``idx`` count every ``{`` +1 and ``}`` -1 and stop at
  the first ``}`` that makes the count 0 (none: None); ``remove_boxed`` returns ``s[7:-1]`` when
  ``s`` starts ``\boxed{`` and ends ``}``, else (or on None, its bare ``except``) None.
  E.g. ``\boxed{1} or \fbox{2}``: rfind finds ``\boxed`` at 0, ``{`` at 6 makes 1, ``}`` at 8
  makes 0: ``\boxed{1}``, hence ``1``. ``\boxed{\left\{ x \right.}``: ``{`` 1, the ``{`` of ``\{``
  2, ``}`` 1, the end: None.
- ``minerva``: EleutherAI/lm-evaluation-harness at 4e7e0d47f33b, ``lm_eval/tasks/minerva_math/
  utils.py``. Generation: ``get_unnormalized_answer``: the text + ``"I hope it is correct."``,
  ``re.search(r"Final Answer: The final answer is(.*?). I hope it is correct.")`` (no DOTALL, so one
  line; each ``.`` any character), ``group(1).strip()``; no match is ``[invalidanswer]``, None here.
  E.g. ``... is 12 I hope it is correct.``: the lazy group grows until one character then
  `` I hope it is correct`` follow: group `` 1``, the ``2`` taken by the regex's ``.``: ``1``.
  Gold: ``remove_boxed(last_boxed_only_string(solution))`` with utils.py's copies: when
  ``"\boxed "`` is anywhere in the text, ``"\boxed " + text.split("\boxed ")[-1].split("$")[0]``,
  and ``remove_boxed`` drops the ``"\boxed "``; else Hendrycks' scan, and ``remove_boxed`` asserts
  ``\boxed{...}`` (an ``\fbox``, or None, stops lm-eval: refused here).
- ``lenient`` / ``boxed``: this project's readings, as ``star_math.answers`` documents them
  (unchanged from before the option had the two released conventions).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from star_engine.errors import UserError
from star_engine.config.registry import Registry
from star_math import plugin
from star_math.answers import extract
from star_math.task import MATHTask
from star_testkit import TESTS

ROOT = Path(__file__).resolve().parents[3]
CONVENTIONS = ("hendrycks", "minerva", "lenient", "boxed")
S = "Final Answer: The final answer is"

# text, then what hendrycks, minerva, lenient, boxed extract (None: no answer)
GENERATIONS = [
    (r"so $\boxed{1}$ or $\fbox{2}$", "1", None, "2", "2"),  # Hendrycks: the last \boxed before any \fbox
    (r"$\fbox{1}$ and $\boxed 2$", None, None, "2", "2"),  # ... even unbraced: no fallback to the \fbox
    (r"we get $\fbox{2}$.", None, None, "2", "2"),  # remove_boxed takes only \boxed{
    (r"so $\boxed 5$.", None, None, "5", "5"),
    (r"so $\boxed {5}$.", None, None, "5", "5"),
    (r"so $\boxed{}$.", "", None, None, None),
    (r"so $\boxed{5$.", None, None, None, None),  # unclosed
    (r"no box here, 5.", None, None, None, None),
    (r"$\boxed{ 5 }$", " 5 ", None, "5", "5"),  # Hendrycks strips nothing
    (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}", None, r"\frac{1}{2}", r"\frac{1}{2}"),
    (r"$\boxed{\left\{ x \right.}$", None, None, r"\left\{ x \right.", r"\left\{ x \right."),  # \{ counts there
    (r"$\boxedsymbol{5}$", None, None, None, None),  # rfind finds \boxed in \boxedsymbol
    (r"$\boxed{1}$ then $\boxed{2$", None, None, None, None),  # the last box unclosed: no fallback
    (f"{S} $5$. I hope it is correct.", None, "$5$", "5", None),
    (f"{S} $\\boxed{{7}}$. I hope it is correct.", "7", "$\\boxed{7}$", "7", "7"),
    ("The final answer is $5$. I hope it is correct.", None, None, "5", None),  # no "Final Answer:"
    ("final answer: the final answer is $5$. I hope it is correct.", None, None, "5", None),  # case
    (f"{S} $5$.", None, None, "5", None),  # cut off before the closing words
    (f"{S} $5$. I hope it is correct", None, "$5$", "5", None),  # the appended words end it
    (f"{S} $5$\nI hope it is correct.", None, None, "5", None),  # not on one line
    (f"{S} 12 I hope it is correct.", None, "1", "12", None),  # the regex's "." eats the "2"
    (f"{S}. I hope it is correct.", None, "", None, None),
    (f"{S} $4$. I hope it is correct.\n{S} $5$. I hope it is correct.", None, "$4$", "4", None),  # the first
    (f"$\\boxed{{3}}$\n{S} $4$. I hope it is correct. And $\\boxed{{5}}$", "5", "$4$", "4", "5"),
]


@pytest.mark.parametrize("row", GENERATIONS, ids=[f"g{i}" for i in range(len(GENERATIONS))])
def test_edge_cases_by_convention(row):
    text, expected = row[0], dict(zip(CONVENTIONS, row[1:]))
    assert {c: extract(text, c) for c in CONVENTIONS} == expected
    assert {c: MATHTask(extraction=c, stored_completion="until_stop").extract(text) for c in CONVENTIONS} == expected


NOT_BOXED = "is not \\boxed{...}"
UNCLOSED = "no brace closes the last \\boxed (or \\fbox)"
NONE = "no \\boxed or \\fbox"
# solution, then the gold answer (a str) or the refusal's words under hendrycks, minerva, lenient
GOLDS = [
    (r"It is $\boxed{2}$.", "2", "2", "2"),
    (r"It is $\fbox{2}$.", NOT_BOXED, NOT_BOXED, "2"),
    (r"It is $\boxed 2$.", UNCLOSED, "2", "2"),
    (r"So $\boxed 4$, not $\boxed{5}$.", "5", "4", "5"),  # lm-eval: after the last "\boxed ", up to "$"
    (r"It is $\boxed {5}$.", NOT_BOXED, "{5}", "5"),
    (r"It is $\boxed{}$.", "empty", "empty", "has no \\boxed{...} answer"),
    (r"It is $\boxed{5$.", UNCLOSED, UNCLOSED, "never closes"),
    (r"It is five.", NONE, NONE, "has no \\boxed{...} answer"),
    (r"$\boxed{\left\{ x \right.}$", UNCLOSED, UNCLOSED, r"\left\{ x \right."),
    (r"$\boxed{ 5 }$", " 5 ", " 5 ", "5"),
]
ROW = {"problem": "What is $1 + 1$?", "solution": "It is $\\boxed{2}$.", "level": "Level 1", "type": "Prealgebra"}


def write(tmp_path: Path, *rows: dict) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("row", GOLDS, ids=[f"s{i}" for i in range(len(GOLDS))])
def test_gold_answers_by_convention(tmp_path, row):
    """Hendrycks layout; a solution the convention reads no answer from is refused in one line."""
    path = write(tmp_path, ROW, {**ROW, "solution": row[0]})
    for convention, expected in zip(("hendrycks", "minerva", "lenient"), row[1:]):
        task = MATHTask(extraction=convention)
        if expected in (NOT_BOXED, UNCLOSED, NONE, "empty", "never closes", "has no \\boxed{...} answer"):
            with pytest.raises(UserError) as e:
                task.load("train", str(path))
            message = str(e.value)
            assert message.startswith(f"{path}:2: field 'solution'") and expected in message, (convention, message)
            assert "\n" not in message
            if convention != "lenient":
                assert message.endswith(f"(task.options.extraction = '{convention}')")
        else:
            assert [ex.answer for ex in task.load("train", str(path))] == ["2", expected], convention


def test_math500_gold_under_each_convention(tmp_path):
    """lm-eval's minerva_math500 reads the solution's box, not MATH-500's ``answer``; so does hendrycks here."""
    row = {"problem": "x?", "solution": "It is $\\boxed{3}$.", "answer": "2", "subject": "Algebra", "level": 1,
           "unique_id": "test/algebra/1.json"}
    path = write(tmp_path, row)
    assert [MATHTask(extraction=c).load("dev", str(path))[0].answer for c in CONVENTIONS] == ["3", "3", "2", "2"]
    path = write(tmp_path, {**row, "solution": "It is $\\fbox{3}$."})
    with pytest.raises(UserError, match=r"rows\.jsonl:1: field 'solution': its last box '\\\\fbox\{3\}' is not"):
        MATHTask(extraction="hendrycks").load("dev", str(path))
    assert MATHTask(extraction="lenient").load("dev", str(path))[0].answer == "2"


def solution_part(block: str) -> str:
    return block.split("\nSolution:", 1)[1]


def shown(convention: str, answer: str) -> str:
    """What a convention extracts from a closing sentence or box stating ``answer``."""
    return f"${answer}$" if convention == "minerva" else answer


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_prompts_and_gold_completions_state_what_the_convention_extracts(tmp_path, convention):
    task = MATHTask(extraction=convention)
    for kind in ("rationale", "direct", "hint", "direct_hint"):
        blocks = task.prompt(kind)[:-2].split("\n\nProblem:\n")
        answers = ["9\\sqrt{3}", "\\frac{1}{9}", "(-\\infty, -2) \\cup (1, \\infty)", "2"]
        assert [task.extract(solution_part(b)) for b in blocks] == [shown(convention, a) for a in answers], kind
        # a direct example boxes its answer only for the box-only conventions
        assert ("$\\boxed{2}$. I hope" in blocks[-1]) == (kind.startswith("direct") and convention in ("boxed",
                                                                                                       "hendrycks"))
    path = write(tmp_path, {**ROW, "solution": "As $1 + 1 = 2$, it is $\\boxed{2}$."})
    (ex,) = task.load("train", str(path))
    for direct in (False, True):
        assert task.extract(task.gold_completion(ex, direct)) == shown(convention, "2")


@pytest.mark.parametrize("convention, example, reads", [
    ("minerva", "It is $\\boxed{9}$.", False),
    ("minerva", "The final answer is $9$. I hope it is correct.", False),
    ("minerva", "Final Answer: The final answer is $9$. I hope it is correct.", True),
    ("hendrycks", "Final Answer: The final answer is $9$. I hope it is correct.", False),
    ("hendrycks", "It is $\\fbox{9}$.", False),
    ("hendrycks", "It is $\\boxed{9}$.", True),
    ("boxed", "It is $\\fbox{9}$.", True),
    ("lenient", "Final Answer: The final answer is $9$. I hope it is correct.", True),
])
def test_prompt_files_must_state_what_the_convention_reads(tmp_path, convention, example, reads):
    path = tmp_path / "prompts.txt"
    path.write_text(f"Problem:\nWhat is $3^2$?\n\nSolution:\n{example}\n")
    if reads:
        assert MATHTask(extraction=convention, prompts_file=str(path)).prompt("rationale").startswith("Problem:")
        return
    with pytest.raises(UserError) as e:
        MATHTask(extraction=convention, prompts_file=str(path))
    assert str(e.value).startswith(f"{path}:1: task.options.extraction = '{convention}' reads no answer in the "
                                   f"solution of this rationale prompt example (")
    assert "\n" not in str(e.value)


def test_a_misspelt_convention_through_the_registry():
    reg = Registry(autoload=False)
    assert reg.add(plugin).error is None
    with pytest.raises(UserError, match=r"^task\.options\.extraction: must be one of lenient, boxed, hendrycks, "
                                        r"minerva, got 'hendryks' \(did you mean 'hendrycks'\?\)$"):
        reg.create("task", "math", {"extraction": "hendryks"}, "task.dataset", "task.options")


def cli(*args: str, cwd: Path, scripted: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    if scripted:  # the scripted backend stands in for a model (as test_cli.py)
        env.update({"STAR_ENGINE_PLUGINS": "star_testkit.scripted", "STAR_ENGINE_BLOCK_PLUGINS": "tracking,haiku_xmap",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH", "")]))})
    return subprocess.run([sys.executable, "-m", "star_engine", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def test_a_misspelt_convention_on_the_command_line(tmp_path):
    """``star-engine validate experiments/math_qwen.toml --set ...``: one line naming the key, exit 2,
    before the experiment's data or checkpoint is looked for."""
    res = cli("validate", str(ROOT / "experiments" / "math_qwen.toml"), "--set",
              'task.options.extraction="minerwa"', cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr == ("error: --set task.options.extraction=\"minerwa\": task.options.extraction: must be one "
                          "of lenient, boxed, hendrycks, minerva, got 'minerwa' (did you mean 'minerva'?)\n")
    assert res.stdout == "" and list(tmp_path.iterdir()) == []


def test_a_row_the_convention_cannot_read_stops_run(tmp_path):
    bad = write(tmp_path, ROW, {**ROW, "solution": "It is $\\fbox{2}$."})
    toml = tmp_path / "exp.toml"
    toml.write_text(f'[experiment]\nname = "conv"\niterations = 1\noutput_dir = "{(tmp_path / "run").as_posix()}"\n'
                    f'[task]\ndataset = "math"\nchecker = "exact"\ndata = {{ train = "{bad.as_posix()}", '
                    f'dev = "{bad.as_posix()}" }}\noptions = {{ extraction = "hendrycks" }}\n'
                    f'[model]\nbackend = "scripted"\n')
    res = cli("validate", str(toml), cwd=tmp_path, scripted=True)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr == (f"error: {bad}:2: field 'solution': its last box '\\\\fbox{{2}}' is not \\boxed{{...}}: "
                          f"Hendrycks' remove_boxed reads no answer (task.options.extraction = 'hendrycks')\n")
    assert not (tmp_path / "run").exists()
