"""Parsing of numeric answers as models and datasets write them: the one number
parser of star-engine. The ``numeric`` checker reads answers with it, and the GSM8K
task (``star_gsm8k.answers``) reads its gold answers and normalises extracted ones
with it, so a task and its checker never disagree on what a number is.

Rule: a text is a number when it holds exactly one number token; any other text
around it (currency symbols, units such as "dollars" or "%", a trailing period,
words like "Answer:") is ignored. A text with two or more numbers ("18 or 20",
"2 + 3 = 5", "3 1/2") is ambiguous and does not parse: a model that hedges between
two answers has given none (were the first number taken, "18 or 20" would count as
right for the gold 18 and wrong for 20, rewarding whichever guess comes first).

A number token is an optional sign (``-``, ``+`` or the Unicode minus), an optional
currency symbol before or after the sign, and then one of
- an integer, plain ("1000") or with correct thousands groups ("1,000", "1,000,000"),
- a decimal ("18.00", ".5"; "18." is the integer 18 followed by a period),
- a fraction of integers ("1/2", "-3/4"; a zero denominator does not parse).

A percent sign is a unit like any other: "50%" parses as 50, not 0.5, so that a
model writing "50%" for the GSM8K gold "50" is right. Scientific notation and
mixed numbers are not supported. Values are exact (:class:`fractions.Fraction`).
"""

from __future__ import annotations

import re
from fractions import Fraction

_SIGNS = "-+\u2212"
_CURRENCY = "$\u20ac\u00a3\u00a5"

_TOKEN = re.compile(
    rf"""
    (?<![\w.])                                  # not glued to a word or a decimal point
    (?P<sign1>[{_SIGNS}])?\s?
    (?:[{_CURRENCY}]\s?)?
    (?P<sign2>[{_SIGNS}])?
    (?P<num>(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?|\.\d+)
    (?!\d|,\d)                                  # no broken thousands group
    (?:\s*/\s*(?P<den>\d+)(?![\d.,]\d))?         # fraction
    """,
    re.VERBOSE | re.ASCII,
)
_DIGIT = re.compile(r"\d")


def parse_number(text: str | None) -> Fraction | None:
    """The one number in ``text`` as an exact value, or None (none, several, or malformed)."""
    if text is None:
        return None
    matches = list(_TOKEN.finditer(text))
    if len(matches) != 1:
        return None
    match = matches[0]
    rest = text[: match.start()] + text[match.end():]
    if _DIGIT.search(rest):  # a digit outside the token: "1,0000", "1.2.3"
        return None
    value = Fraction(match["num"].replace(",", ""))
    if match["den"] is not None:
        den = int(match["den"])
        if den == 0:
            return None
        value /= den
    negatives = sum(1 for s in (match["sign1"], match["sign2"]) if s in ("-", "\u2212"))
    return -value if negatives % 2 else value


def canonical_number(text: str | None) -> str | None:
    """The canonical text (:func:`format_number`) of the one number in ``text``, or None
    when :func:`parse_number` finds none: "$1,080.00" -> "1080", "36/2" -> "18",
    "18 or 20" -> None."""
    value = parse_number(text)
    return None if value is None else format_number(value)


def _decimal_places(denominator: int) -> int | None:
    """Digits after the point of a reduced fraction with this denominator, or None
    when its decimal expansion does not end (a prime other than 2 and 5 divides it)."""
    twos = fives = 0
    while denominator % 2 == 0:
        denominator //= 2
        twos += 1
    while denominator % 5 == 0:
        denominator //= 5
        fives += 1
    return max(twos, fives) if denominator == 1 else None


def format_number(value: Fraction) -> str:
    """Canonical text of a parsed value: "1000", "-5", "0.5", "0.00001" (a decimal that
    ends is written exactly, never in scientific notation), "0.3333333333333333" (one
    that does not: the nearest float's shortest repr)."""
    if value.denominator == 1:
        return str(value.numerator)
    places = _decimal_places(value.denominator)
    if places is None:
        return repr(float(value))
    digits = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
    return f"{'-' if value < 0 else ''}{digits[:-places]}.{digits[-places:]}"


def numbers_close(a: Fraction, b: Fraction, abs_tol: float, rel_tol: float) -> bool:
    """``|a - b| <= max(abs_tol, rel_tol * max(|a|, |b|))``, computed exactly."""
    bound = max(Fraction(abs_tol), Fraction(rel_tol) * max(abs(a), abs(b)))
    return abs(a - b) <= bound
