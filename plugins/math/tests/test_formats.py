"""What the model sees and writes: contexts, the Minerva-style prompts (built in and from files),
gold completions, trim, and the math_answer hint with its leak strings."""

from __future__ import annotations

import re
from fractions import Fraction
from itertools import product
from pathlib import Path

import pytest

from star_engine.errors import UserError
from star_math.answers import closing_sentence, last_boxed
from star_math.prompts import EXAMPLES
from star_math.task import AnswerHint, MATHTask

DATA = Path(__file__).parent / "data"
TRAIN = DATA / "math_train_sample.jsonl"
MATH500 = DATA / "math500_sample.jsonl"


def cut(generation: str, stop: tuple[str, ...]) -> str:
    """What a backend returns: the generation cut before the first stop string."""
    ends = [generation.find(s) for s in stop if s in generation]
    return generation[: min(ends)] if ends else generation


def blocks(prompt: str) -> list[str]:
    assert prompt.endswith("\n\n") and not prompt.endswith("\n\n\n")
    return re.split(r"\n\n(?=Problem:\n)", prompt[:-2])


@pytest.fixture(scope="module")
def task() -> MATHTask:
    return MATHTask()


def test_context_and_what_the_model_is_asked(task):
    ex = task.load("dev", str(MATH500))[0]
    assert task.context(ex) == "Problem:\nIf $f(x) = 2x + 3$, what is $f(f(1))$?\n\nSolution:"
    asked = task.prompt("rationale") + task.context(ex)
    assert asked.count("Problem:\n") == 5 and asked.endswith("I hope it is correct.\n\n" + task.context(ex))


def test_builtin_prompts(task):
    rationale, direct, hint, direct_hint = (blocks(task.prompt(k)) for k in ("rationale", "direct", "hint",
                                                                              "direct_hint"))
    assert len(rationale) == len(direct) == len(hint) == len(direct_hint) == len(EXAMPLES) == 4
    for r, d, h, dh, (_, problem, solution, answer) in zip(rationale, direct, hint, direct_hint, EXAMPLES):
        assert r == f"Problem:\n{problem}\n\nSolution:\n{solution}\n{closing_sentence(answer)}"
        assert d == f"Problem:\n{problem}\n\nSolution:\n{closing_sentence(answer)}"
        assert h == r.replace("\n\nSolution:", f"\n(Answer: ${answer}$)\n\nSolution:", 1)
        assert dh == d.replace("\n\nSolution:", f"\n(Answer: ${answer}$)\n\nSolution:", 1)
        assert last_boxed(solution) == answer  # the box and the closing sentence agree
        for mode in ("lenient", "boxed", "hendrycks"):
            assert MATHTask(extraction=mode).extract(r.split("\nSolution:", 1)[1]) == answer
        assert MATHTask(extraction="minerva").extract(r.split("\nSolution:", 1)[1]) == f"${answer}$"  # unnormalized
        assert cut(r, task.stop) == r
    with pytest.raises(ValueError):
        task.prompt("cot")


def test_the_worked_examples_are_right():
    """The four problems written for the prompt, solved here another way."""
    assert EXAMPLES[0][3] == "9\\sqrt{3}" and 6 ** 2 * 3 ** 0.5 / 4 == pytest.approx(9 * 3 ** 0.5)
    sums = [a + b for a, b in product(range(1, 7), repeat=2)]
    assert EXAMPLES[1][3] == "\\frac{1}{9}" and Fraction(sums.count(9), len(sums)) == Fraction(1, 9)
    grid = [Fraction(x, 4) for x in range(-40, 41) if x != -8]
    assert all(((x - 1) / (x + 2) > 0) == (x < -2 or x > 1) for x in grid)
    assert EXAMPLES[2][3] == "(-\\infty, -2) \\cup (1, \\infty)"
    assert EXAMPLES[3][3] == "2" and pow(2, 100, 7) == 2


def test_prompt_files(tmp_path):
    path = tmp_path / "minerva.txt"
    path.write_text("Problem:\nWhat is $1+1$?\n\nSolution:\n$1+1=2$.\nFinal Answer: The final answer is $2$. "
                    "I hope it is correct.   \n\n\nProblem:\nWhat is $3^2$?\n\nSolution:\nIt is $\\boxed{9}$.\n")
    task = MATHTask(prompts_file=str(path))
    assert task.prompt("rationale") == ("Problem:\nWhat is $1+1$?\n\nSolution:\n$1+1=2$.\nFinal Answer: The final "
                                        "answer is $2$. I hope it is correct.\n\nProblem:\nWhat is $3^2$?\n\n"
                                        "Solution:\nIt is $\\boxed{9}$.\n\n")
    assert blocks(task.prompt("hint"))[1] == "Problem:\nWhat is $3^2$?\n(Answer: $9$)\n\nSolution:\nIt is $\\boxed{9}$."
    assert task.prompt("direct") == MATHTask().prompt("direct")  # the other kinds stay built in


@pytest.mark.parametrize("text, line, message", [
    ("Some preamble.\nProblem:\nx?\n\nSolution:\n$\\boxed{1}$", 1, "must start with a line 'Problem:'"),
    ("Problem:\nx?\n\nSolution:\n$\\boxed{1}$\n\nProblem:\ny?\n\nAnswer: 2", 7,
     "has no line starting with 'Solution:'"),
    ("Problem:\nx?\n\nSolution:\nIt is two.", 1, "states no answer"),
    ("\n\n", None, "no examples (the file is empty)"),
])
def test_bad_prompt_files(tmp_path, text, line, message):
    path = tmp_path / "prompts.txt"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        MATHTask(hint_prompts_file=str(path))
    assert str(e.value).startswith(f"{path}:{line}: " if line else f"{path}: ") and message in str(e.value)


def test_gold_completions(task):
    for ex in task.load("train", str(TRAIN)) + task.load("dev", str(MATH500)):
        for direct in (False, True):
            done = task.gold_completion(ex, direct)
            assert done.startswith("\n") and done.endswith(closing_sentence(ex.answer))
            assert task.extract(done) == ex.answer and cut(done, task.stop) == done and task.trim(done) == done
            assert (ex.fields["solution"] in done) != direct
    assert task.seed_examples() == []


def test_a_gold_solution_with_the_stop_string_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"problem": "x?", "solution": "a\\nProblem: b\\n$\\\\boxed{1}$", "level": "Level 1", '
                    '"type": "Algebra"}\n')
    (ex,) = MATHTask().load("train", str(path))
    with pytest.raises(UserError, match=re.escape("math: the gold completion of example 'train-0' contains the stop "
                                                  "string '\\nProblem:'")):
        MATHTask().gold_completion(ex, direct=False)
    assert MATHTask(stop=["\n\n\n"]).gold_completion(ex, direct=False).startswith("\na\nProblem: b")


def test_trim_and_stop(task):
    raw = ("\n$2+2=\\boxed{4}$.\nFinal Answer: The final answer is $4$. I hope it is correct.\nExtra words."
           "\n\nProblem:\nWhat is $5+5$?")
    kept = cut(raw, task.stop)
    assert task.trim(kept) == "\n$2+2=\\boxed{4}$.\nFinal Answer: The final answer is $4$. I hope it is correct."
    assert MATHTask(stored_completion="until_stop").trim(kept) == kept and kept.endswith("Extra words.\n")
    assert task.extract(task.trim(kept)) == "4"


def test_hint_answer(task):
    hint = AnswerHint()
    ex = task.load("dev", str(MATH500))[2]
    hinted = hint.context(task, ex)
    assert hinted == task.context(ex).replace("\n\nSolution:", "\n(Answer: $(-1,5]$)\n\nSolution:")
    assert "(Answer:" not in task.context(ex)  # the stored context stays hint-free
    assert hint.leak_strings(task, ex) == ("(Answer: $(-1,5]$)", "(Answer:")
    assert task.prompt("hint").count("(Answer: $") == 4  # the hinted prompt shows hints the same way


def test_hint_solution(task):
    hint = AnswerHint(show="solution")
    ex = task.load("train", str(TRAIN))[0]
    assert hint.context(task, ex) == ("Problem:\nWhat is the value of $x$ if $\\frac{x}{3} + 4 = 10$?\n"
                                      "(Reference solution: Subtracting $4$ from both sides gives $\\frac{x}{3} = 6$, "
                                      "so $x = \\boxed{18}$.)\n\nSolution:")
    assert hint.leak_strings(task, ex)[1] == "(Reference solution:"


def test_no_leak_string_in_a_right_rationale(task):
    """The hint_leak filter rejects a rationale holding a leak string: a rationale that merely
    states the answer (as every right one does) must hold none."""
    from star_engine.api import Candidate
    from star_filters.filters import HintLeakFilter

    for ex in task.load("train", str(TRAIN)) + task.load("dev", str(MATH500)):
        for hint in (AnswerHint(), AnswerHint(show="solution")):
            def candidate(text):
                return Candidate(ex.id, 1, 0, task.context(ex), text, ex.answer, ex.answer, True, True,  # noqa: B023
                                 hint.leak_strings(task, ex))  # noqa: B023
            copied = task.gold_completion(ex, False) + "\n" + hint.text(ex)
            assert HintLeakFilter().keep([candidate(task.gold_completion(ex, False)), candidate(copied)], []) \
                == [True, False]


def test_hint_without_an_answer_is_an_error(task):
    from star_engine.api import Example

    with pytest.raises(UserError, match="math_answer: example 'x' has no gold answer to hint"):
        AnswerHint().context(task, Example(id="x", question="q", answer=""))
