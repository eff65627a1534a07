"""Final answers of GSM8K: the ``#### <number>`` line and numeric normalisation.

Two readings of a generation. ``final_answer`` (the project's default): the text
after ``####`` on the first line that has it, normalised as a number.
``original_answer``: exactly as the released STaR code (``device_inference.py``,
ezelikman/STaR at 6ffd3c4, lines 44-52): the lines up to and including the first
line containing ``####`` (``answer_lines``, also what the original stores), cut at
``<|endoftext|>``, then the text after their last ``####``, stripped, compared as a
string (lower-cased) with the gold's text after ``"#### "``.

What a number is, is decided in one place, :mod:`star_filters.numbers` (the parser
of the ``numeric`` checker): a text holds a number when it holds exactly one
("18 apples." is 18; "18 or 20" is no number).
"""

from __future__ import annotations

from star_filters import canonical_number


def normalize_number(text: str) -> str | None:
    """The canonical form of the one number in ``text`` (``star_filters.numbers``),
    else the stripped text; None for blank text.

    "1,080" -> "1080", "$18.00" -> "18", "-5" -> "-5", "0.50" -> "0.5", "36/2" -> "18",
    "7/2" -> "3.5", "18 apples." -> "18"; "18 or 20" stays "18 or 20" (two numbers:
    none), as does "twelve".
    """
    s = text.strip()
    if not s:
        return None
    number = canonical_number(s)
    return s if number is None else number


def final_answer(generation: str) -> str | None:
    """The text after ``####`` on the first line that has it, normalised; None
    when no line has ``####`` (the original reads lines up to that line)."""
    for line in generation.split("\n"):
        if "####" in line:
            return normalize_number(line.split("####", 1)[1])
    return None


EOT = "<|endoftext|>"


def _through_answer_line(generation: str) -> str | None:
    lines = generation.split("\n")
    for i, line in enumerate(lines):
        if "####" in line:
            return "\n".join(lines[: i + 1]).split(EOT)[0]
    return None


def answer_lines(generation: str) -> str:
    """The generation up to and including its first line containing ``####``, cut at
    ``<|endoftext|>`` (what the original stores); all of it, so cut, when no line has
    ``####`` (such a generation has no answer and is never stored)."""
    kept = _through_answer_line(generation)
    return generation.split(EOT)[0] if kept is None else kept


def original_answer(generation: str) -> str | None:
    """The original's prediction: the text after the last ``####`` of
    :func:`answer_lines`, stripped, not normalised ("1,080" stays "1,080"); None when
    no line has ``####`` (the original's empty prediction, which matches no gold)."""
    kept = _through_answer_line(generation)
    return None if kept is None else kept.split("####")[-1].strip()
