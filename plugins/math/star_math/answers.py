r"""Where a MATH solution or generation states its answer: the task's ``extract`` and the gold
answers of Hendrycks-layout rows. This module holds this project's own readings
(``extraction = "lenient"``, the default, and ``"boxed"``), which return bare LaTeX
(``\frac{1}{2}``, ``(-\infty, 2]``) without ``$`` delimiters or ``\boxed``; the released
evaluations' readings, exactly (``"hendrycks"``, ``"minerva"``), are in ``conventions.py``. (The
``math_verify`` checker compares the extracted answer with ``read = "extracted"``; by default it
parses the whole trimmed generation itself.)

This project's two forms (its own, NOT Hendrycks' functions nor lm-eval's: see ``conventions.py``
for where each differs):

- ``\boxed{...}``: the LAST ``\boxed`` or ``\fbox`` of the text, by position (either command; a
  command is matched whole, ``\boxedsymbol`` is none). Braced, its argument with nested braces
  matched (``\{`` and ``\}`` are escaped braces and do not count, ``\\`` is an escaped
  backslash), stripped; unbraced (``\boxed 5``), the text after it up to the next ``$`` or line
  end. An empty box is none. A braced box that never closes raises :class:`UnclosedBox`.
- The closing sentence ``Final Answer: The final answer is $X$. I hope it is correct.``: the FIRST
  "The final answer is" (any case, "Final Answer:" not required), the text after it up to
  ". I hope it is correct" or the line's end, a trailing "." dropped, its ``$...$`` (or
  ``$$...$$``, ``\(...\)``) unwrapped.
"""

from __future__ import annotations

import re

from .conventions import hendrycks_answer, minerva_answer

CLOSING = "I hope it is correct."
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_FINAL = re.compile(r"the final answer is", re.IGNORECASE)
_HOPE = re.compile(r"\.?\s*I hope it is correct", re.IGNORECASE)


class UnclosedBox(ValueError):
    """A braced ``\\boxed{`` (or ``\\fbox{``) whose argument never closes; ``offset`` is the
    index of its backslash in the text."""

    def __init__(self, offset: int, command: str = "\\boxed") -> None:
        super().__init__(f"{command}{{ at character {offset + 1} never closes")
        self.offset = offset


def _closing_brace(text: str, open_at: int) -> int | None:
    """The index of the ``}`` closing the ``{`` at ``open_at``; None when it never closes."""
    depth, i, n = 0, open_at, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # an escaped character (\{, \}, \\) or the first letter of a command
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _argument(text: str, box: re.Match) -> tuple[str, int]:
    """The argument of the box ``box`` matched in ``text`` and the index just after it."""
    i = box.end()
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _closing_brace(text, i)
        if end is None:
            raise UnclosedBox(box.start(), box.group())
        return text[i + 1:end], end + 1
    # \boxed 5$: up to the next $ or the line's end (remove_boxed's "\\boxed " form)
    content = re.split(r"[$\n]", text[i:], maxsplit=1)[0]
    return content, i + len(content)


def last_boxed(text: str) -> str | None:
    r"""The stripped argument of the last ``\boxed`` / ``\fbox`` of ``text``; None when it has none
    (or the last one is empty). Raises :class:`UnclosedBox` when that box never closes.

    ``"so $\boxed{\frac{1}{2}}$"`` -> ``"\frac{1}{2}"``; ``"$\boxed 5$"`` -> ``"5"``;
    ``"\boxed{1} or \fbox{2}"`` -> ``"2"``."""
    found = None
    for found in _BOX.finditer(text):  # noqa: B007
        pass
    if found is None:
        return None
    return _argument(text, found)[0].strip() or None


def unwrap_math(text: str) -> str:
    r"""``text`` stripped, without one pair of enclosing ``$$...$$``, ``$...$``, ``\(...\)`` or
    ``\[...\]``, and without a ``\boxed{}`` that is all of it: ``"$\frac{1}{2}$"`` ->
    ``"\frac{1}{2}"``; ``"$\boxed{5}$"`` -> ``"5"``; ``"\$5"`` stays (an escaped dollar)."""
    s = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right) \
                and not s.endswith("\\" + right):
            s = s[len(left):len(s) - len(right)].strip()
            break
    box = _BOX.match(s)
    if box is not None:
        try:
            content, end = _argument(s, box)
        except UnclosedBox:
            return s
        if end == len(s):
            return content.strip()
    return s


def final_answer(text: str) -> str | None:
    """The answer of Minerva's closing sentence (module docstring); None without one."""
    m = _FINAL.search(text)
    if m is None:
        return None
    rest = text[m.end():]
    line = rest.split("\n", 1)[0]
    hope = _HOPE.search(line)
    answer = line[: hope.start()] if hope else line
    answer = answer.strip()
    if not hope:
        answer = answer.rstrip(".").rstrip()
    if answer.startswith("$"):  # "$X$, which ..." without the closing sentence: the math span
        close = answer.find("$", 2 if answer.startswith("$$") else 1)
        while close > 0 and answer[close - 1] == "\\":
            close = answer.find("$", close + 1)
        if close > 0:
            answer = answer[: close + (2 if answer.startswith("$$") else 1)]
    return unwrap_math(answer) or None


def boxed_answer(text: str) -> str | None:
    """The last box's argument, unwrapped; None without one, or when it never closes (a
    generation cut off inside its box states no answer)."""
    try:
        found = last_boxed(text)
    except UnclosedBox:
        return None
    if found is None:
        return None
    return unwrap_math(found) or None


def extract(text: str, mode: str) -> str | None:
    """The answer of a generation under ``task.options.extraction``: ``"lenient"`` the closing
    sentence, else the last box; ``"boxed"`` the last box only (both this module's);
    ``"hendrycks"`` and ``"minerva"`` the released evaluations' (``conventions.py``)."""
    if mode == "hendrycks":
        return hendrycks_answer(text)
    if mode == "minerva":
        return minerva_answer(text)
    if mode == "boxed":
        return boxed_answer(text)
    found = final_answer(text)
    return found if found is not None else boxed_answer(text)


BOX_ONLY = ("boxed", "hendrycks")
"""The extractions that read only a box: a closing sentence written for them boxes its answer."""


def through_closing(generation: str) -> str:
    """The generation up to and including its first "I hope it is correct." (Minerva's last
    words); all of it when it has none."""
    at = generation.find(CLOSING)
    return generation if at < 0 else generation[: at + len(CLOSING)]


def closing_sentence(answer: str, boxed: bool = False) -> str:
    """Minerva's last line for ``answer`` (bare LaTeX); ``boxed``: the answer in a ``\\boxed{}``
    (for the extractions that read only a box, ``BOX_ONLY``)."""
    shown = f"\\boxed{{{answer}}}" if boxed else answer
    return f"Final Answer: The final answer is ${shown}$. {CLOSING}"
