"""Text formats of the addition task (Nye et al.'s scratchpad, as STaR used it).

For 29 + 57::

    Input:
    2 9 + 5 7
    Target:
    <scratch>
    2 9 + 5 7 , C: 0
    2 + 5 , 6 C: 1
    , 8 6 C: 0
    0 8 6
    </scratch>
    8 6

The first three lines are the context; the rest, followed by ``TERMINATOR``,
is the completion. Scratchpad lines after the first show the digits still to
add, the partial sum so far and the carry; the last line is the final carry and
the digits. A 5-digit problem takes about 230 bytes, well inside a 512-byte context.
"""

from __future__ import annotations

from typing import Literal, get_args

TERMINATOR = "\n\n"
"""Ends every completion; also the stop string. Nothing inside a problem or a
scratchpad has a blank line, and few-shot examples are separated by it."""

OPEN, CLOSE = "<scratch>", "</scratch>"
HINT = "Hint: "


def spaced(digits: str) -> str:
    return " ".join(digits)


def problem(a: int, b: int) -> str:
    return f"{spaced(str(a))} + {spaced(str(b))}"


def context(a: int, b: int) -> str:
    return f"Input:\n{problem(a, b)}\nTarget:\n"


def hint_line(answer: str) -> str:
    return f"{HINT}{spaced(answer)}"


def hinted(ctx: str, answer: str) -> str:
    """A context with the hint line inserted before its final ``Target:`` line."""
    cue = "Target:\n"
    if not ctx.endswith(cue):
        raise ValueError("the context does not end with 'Target:'")
    return f"{ctx[: -len(cue)]}{hint_line(answer)}\n{cue}"


Style = Literal["nye", "columns"]
STYLES = get_args(Style)
"""Scratchpad styles: ``nye`` is the paper's (above); ``columns`` writes each step
line's column addition before the partial sum, e.g. ``2 + 5 , 9 + 7 + 0 = 1 6 , 6 C: 1``:
the digits being added (the column of a, of b, the carry in), then their sum as
two digits (carry out, sum digit). Every digit the step computes then depends
on the three digits just written, not on digits found on the line above."""


def scratchpad(a: int, b: int, style: str = "nye") -> str:
    """The scratchpad block for ``a + b`` (non-negative), ending in a newline."""
    if a < 0 or b < 0:
        raise ValueError("the addition scratchpad is for non-negative numbers")
    if style not in STYLES:
        raise ValueError(f"unknown scratchpad style {style!r}; known: {', '.join(STYLES)}")
    da, db = str(a), str(b)
    lines = [f"{problem(a, b)} , C: 0"]
    carry, digits = 0, ""
    for k in range(1, max(len(da), len(db)) + 1):
        x, y = int(da[-k] if k <= len(da) else 0), int(db[-k] if k <= len(db) else 0)
        total = x + y + carry
        column = f"{x} + {y} + {carry} = {total // 10} {total % 10} , " if style == "columns" else ""
        digits = str(total % 10) + digits
        carry = total // 10
        rest_a, rest_b = da[: max(len(da) - k, 0)], db[: max(len(db) - k, 0)]
        left = " ".join(f"{spaced(rest_a)} + {spaced(rest_b)}".split()) + " " if rest_a or rest_b else ""
        lines.append(f"{left}, {column}{spaced(digits)} C: {carry}")
    lines.append(f"{carry} {spaced(digits)}")
    return "\n".join([OPEN, *lines, CLOSE]) + "\n"


def rationale_completion(a: int, b: int, style: str = "nye") -> str:
    return scratchpad(a, b, style) + spaced(str(a + b)) + TERMINATOR


def direct_completion(a: int, b: int) -> str:
    return spaced(str(a + b)) + TERMINATOR


DIGIT_ROLES = ("copy", "sum", "carry", "result")


def digit_roles(completion: str) -> list[tuple[int, str]]:
    """(character offset, role) of every digit of a rationale completion:

    - ``sum``: the digit a step line computes (the first of its partial sum; in the
      ``columns`` style the second digit after ``=``);
    - ``carry``: the carry a step line computes (after ``C:``; in the ``columns``
      style the first digit after ``=``);
    - ``result``: the digits of the result line after the scratchpad;
    - ``copy``: every other digit (the problem, the digits still to add, the
      partial sum carried over, the final line), copied from the line above.

    Teacher-forced accuracy per role tells which part of the algorithm a model has
    learned (copying is learned long before the digit sum)."""
    out: list[tuple[int, str]] = []
    pos, inside, step = 0, False, -1
    for line in completion.split("\n"):
        is_step = inside and step >= 1 and "C:" in line
        if is_step and " = " in line:  # the columns style: "x + y + c = C S , ..."
            carry_at = line.index(" = ") + 3
            sum_at = carry_at + 2
        else:
            sum_at = line.index(", ") + 2 if is_step and ", " in line else -1
            carry_at = line.index("C: ") + 3 if is_step and "C: " in line else -1
        for i, ch in enumerate(line):
            if not ch.isdigit():
                continue
            role = ("sum" if i == sum_at else "carry" if i == carry_at else "copy") if inside else "result"
            out.append((pos + i, role))
        if line == OPEN:
            inside, step = True, 0
        elif line == CLOSE:
            inside = False
        elif inside:
            step += 1
        pos += len(line) + 1
    return out


def extract_result(generation: str) -> str | None:
    """The digits of the result line (after the scratchpad, when there is one),
    spaces removed; None when there is no such line or it is not all digits.
    An unclosed scratchpad states no answer."""
    if CLOSE in generation:
        tail = generation.rsplit(CLOSE, 1)[1]
    elif OPEN in generation:
        return None
    else:
        tail = generation
    for line in tail.split("\n"):
        if line.strip():
            answer = "".join(line.split())
            return answer if answer.isascii() and answer.isdigit() else None
    return None
