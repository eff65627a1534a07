"""Final answers of GSM8K: the ``#### <number>`` line and numeric normalisation."""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

_CURRENCY = re.compile(r"[$\u20ac\u00a3\u00a5]")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
# Not glued to a word, a decimal point or a broken thousands group ("1,0000").
_NUMBER = re.compile(r"(?<![\w.,])[-+]?\s?(?:\d+(?:\.\d+)?|\.\d+)(?:\s?/\s?\d+)?(?![\d,]\d)")


def normalize_number(text: str) -> str | None:
    """The first number in ``text`` in a canonical form, else the stripped text;
    None for blank text.

    "1,080" -> "1080", "$18.00" -> "18", "-5" -> "-5", "0.50" -> "0.5",
    "36/2" -> "18" (whole fractions only: "7/2" stays "7/2"), "18 apples." -> "18".
    """
    s = text.strip().replace("\u2212", "-")
    if not s:
        return None
    cleaned = _THOUSANDS.sub("", _CURRENCY.sub("", s))
    m = _NUMBER.search(cleaned)
    if m is None:
        return s
    token = re.sub(r"\s", "", m.group())
    if "/" in token:
        num, den = token.split("/")
        if int(den) == 0:
            return token
        value = Fraction(Decimal(num)) / int(den)
        return str(value.numerator) if value.denominator == 1 else token
    dec = Decimal(token)
    if dec == dec.to_integral_value():
        return str(int(dec))
    return format(dec.normalize(), "f")


def final_answer(generation: str) -> str | None:
    """The text after ``####`` on the first line that has it, normalised; None
    when no line has ``####`` (the original reads lines up to that line)."""
    for line in generation.split("\n"):
        if "####" in line:
            return normalize_number(line.split("####", 1)[1])
    return None
