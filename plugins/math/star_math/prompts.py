r"""Few-shot prompts for MATH in the Minerva style (Lewkowycz et al. 2022, appendix D.2; the
format of lm-evaluation-harness's ``minerva_math``)::

    Problem:
    <problem>

    Solution:
    <worked solution, its answer in \boxed{}>
    Final Answer: The final answer is $<answer>$. I hope it is correct.

The four built-in examples are written for this project (not MATH problems). A prompt file
holds examples in that form, each starting with a line ``Problem:``.
"""

from __future__ import annotations

import re
from pathlib import Path

from star_engine import UserError
from star_engine.helpers import DATA_MAX, read_capped

from .answers import closing_sentence, extract

SHOWN = {"boxed": "a \\boxed{...}", "hendrycks": "a last \\boxed{...}",
         "minerva": "a line 'Final Answer: The final answer is X. I hope it is correct.'"}
"""What each extraction but the lenient one needs to find in a prompt example's solution."""

CUE = "\n\nSolution:"
"""What a context ends with; a completion continues it on the next line."""

# (subject, problem, solution, answer); each solution ends in its \boxed{answer}.
EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    ("Geometry",
     "An equilateral triangle has side length $6$. What is its area? Express your answer in simplest "
     "radical form.",
     "An altitude splits the triangle into two $30^\\circ$-$60^\\circ$-$90^\\circ$ triangles with "
     "hypotenuse $6$ and shorter leg $3$, so the altitude is $3\\sqrt{3}$. The area is "
     "$\\frac{1}{2} \\cdot 6 \\cdot 3\\sqrt{3} = \\boxed{9\\sqrt{3}}$.",
     "9\\sqrt{3}"),
    ("Counting & Probability",
     "Two fair six-sided dice are rolled. What is the probability that the sum of the two numbers "
     "rolled is $9$? Express your answer as a common fraction.",
     "There are $6 \\cdot 6 = 36$ equally likely outcomes. The outcomes with a sum of $9$ are $(3,6)$, "
     "$(4,5)$, $(5,4)$ and $(6,3)$, so there are $4$ of them. The probability is "
     "$\\frac{4}{36} = \\boxed{\\frac{1}{9}}$.",
     "\\frac{1}{9}"),
    ("Intermediate Algebra",
     "Solve the inequality\n\\[\\frac{x - 1}{x + 2} > 0.\\]\nExpress your answer in interval notation.",
     "The fraction is positive exactly when its numerator and denominator have the same sign. Both "
     "are positive when $x > 1$, and both are negative when $x < -2$. At $x = 1$ the fraction is $0$ "
     "and at $x = -2$ it is undefined, so neither endpoint is included. The solution is "
     "$x \\in \\boxed{(-\\infty, -2) \\cup (1, \\infty)}$.",
     "(-\\infty, -2) \\cup (1, \\infty)"),
    ("Number Theory",
     "What is the remainder when $2^{100}$ is divided by $7$?",
     "Since $2^3 = 8 \\equiv 1 \\pmod{7}$, the powers of $2$ repeat modulo $7$ every three steps. "
     "As $100 = 3 \\cdot 33 + 1$,\n$$2^{100} = \\left(2^3\\right)^{33} \\cdot 2 \\equiv 1^{33} \\cdot 2 "
     "\\equiv 2 \\pmod{7}.$$\nThe remainder is $\\boxed{2}$.",
     "2"),
)


def context(problem: str) -> str:
    return f"Problem:\n{problem}{CUE}"


def completion(solution: str | None, answer: str, boxed: bool = False) -> str:
    """A worked completion (``solution`` given) or a direct one: the solution, then the closing
    sentence (its answer boxed when ``boxed``), on the line after the ``Solution:`` cue."""
    sentence = closing_sentence(answer, boxed)
    return f"\n{solution}\n{sentence}" if solution else f"\n{sentence}"


def hint_text(answer: str) -> str:
    return f"(Answer: ${answer}$)"


def add_hint(block: str, hint: str) -> str:
    """``block`` with ``hint`` on its own line after the problem, before the blank line and the line
    ``Solution:``: a context's last line (``CUE``), a prompt example's first line that starts with
    it. Raises ValueError without one."""
    if block.endswith(CUE):
        return f"{block[: -len(CUE)].rstrip()}\n{hint}{CUE}"
    m = re.search(r"^Solution:", block, re.MULTILINE)
    if m is None:
        raise ValueError("no line starting with 'Solution:'")
    return f"{block[: m.start()].rstrip()}\n{hint}\n\n{block[m.start():]}"


def builtin(kind: str, boxed: bool = False) -> list[tuple[str, str, str]]:
    """The built-in examples of ``kind`` ("rationale" or "direct") as (where, text, answer); a
    direct example's closing sentence boxes its answer when ``boxed`` (a rationale's solution
    already ends in its box)."""
    direct = kind == "direct"
    return [(f"built-in example {i + 1}",
             context(problem) + completion(None if direct else solution, answer, boxed and direct), answer)
            for i, (_, problem, solution, answer) in enumerate(EXAMPLES)]


def read_prompt_file(path: str, kind: str, mode: str = "lenient") -> list[tuple[str, str, str]]:
    """The examples of a prompt file as (file:line, text, answer): each starts at a line
    ``Problem:``, has a line ``Solution:``, and states its answer (the closing sentence or a
    ``\\boxed{}``, the lenient reading) in a form that extraction ``mode`` reads too, so that the
    prompt shows the model what the task will extract; trailing blanks of an example are dropped."""
    p = Path(path)
    try:
        text = read_capped(p, DATA_MAX).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{p}: not valid UTF-8") from None
    lines = text.replace("\r\n", "\n").split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith("Problem:")]
    first_text = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first_text is None:
        raise UserError(f"{p}: no examples (the file is empty)")
    if not starts or first_text < starts[0]:
        raise UserError(f"{p}:{first_text + 1}: a {kind} prompt example must start with a line 'Problem:'")
    out = []
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        where = f"{p}:{a + 1}"
        block = "\n".join(line.rstrip() for line in lines[a:b]).rstrip()
        m = re.search(r"^Solution:", block, re.MULTILINE)
        if m is None:
            raise UserError(f"{where}: this {kind} prompt example has no line starting with 'Solution:'")
        answer = extract(block[m.end():], "lenient")
        if answer is None:
            raise UserError(f"{where}: the solution of this {kind} prompt example states no answer "
                            f"('The final answer is ...' or \\boxed{{...}})")
        if mode != "lenient" and not extract(block[m.end():], mode):
            raise UserError(f"{where}: task.options.extraction = {mode!r} reads no answer in the solution of this "
                            f"{kind} prompt example ({SHOWN[mode]})")
        out.append((where, block, answer))
    return out
