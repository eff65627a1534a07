"""Answer checkers: ``check(generation, extracted, gold) -> Verdict``.

``extracted`` is the task's own extraction of the answer from ``generation`` (None
when the task found none). Extraction is the task's alone (``Task.extract``): a
checker here interprets and compares ``extracted`` and never searches
``generation`` for an answer of its own, except ``regex``, whose pattern *is* a
user's extraction rule replacing the task's. Every class here is a factory: its
keyword-only ``__init__`` parameters declare the checker's TOML options (types and ranges,
checked by the registry before the checker is built).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from star_engine import NON_EMPTY, NonNegFloat, UserError, Verdict

from .numbers import format_number, numbers_close, parse_number


class ExactChecker:
    """``extracted`` equals ``gold`` after the same normalisation of both.

    ``strip`` removes surrounding whitespace, ``collapse_spaces`` turns each run of
    whitespace into one space, ``case_sensitive = false`` compares case-folded text.
    ``predicted`` is the normalised extraction, in its own case.
    """

    def __init__(self, *, strip: bool = True, case_sensitive: bool = True,
                 collapse_spaces: bool = False) -> None:
        self.strip, self.case_sensitive, self.collapse_spaces = strip, case_sensitive, collapse_spaces

    def _normalise(self, text: str) -> str:
        if self.collapse_spaces:
            text = re.sub(r"\s+", " ", text)
        if self.strip:
            text = text.strip()
        return text

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        if extracted is None:
            return Verdict(None, False)
        predicted = self._normalise(extracted)
        expected = self._normalise(gold)
        if self.case_sensitive:
            return Verdict(predicted, predicted == expected)
        return Verdict(predicted, predicted.casefold() == expected.casefold())


class LowerExactChecker:
    """``extracted.lower() == gold.lower()``: the comparison of the released STaR code
    (``device_inference.py`` at 6ffd3c4, line 72), to pair with a task's
    ``extraction = "original"``. Nothing else is normalised unless ``strip = true``
    (surrounding whitespace off both; the original strips its GSM8K prediction, not
    the gold). ``predicted`` is ``extracted`` as it is. (``exact`` with
    ``case_sensitive = false`` case-folds instead, which differs from ``str.lower``
    for a few non-ASCII letters such as "ß".)"""

    def __init__(self, *, strip: bool = False) -> None:
        self.strip = strip

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        if extracted is None:
            return Verdict(None, False)
        a, b = (extracted.strip(), gold.strip()) if self.strip else (extracted, gold)
        return Verdict(extracted, a.lower() == b.lower())


class MCLetterChecker:
    """Multiple-choice letter, compared case-insensitively with ``gold``.

    The extracted text (and the gold) names a choice when it is a bare letter ("e",
    "E", "(E)", "E)", "e.") or contains one in parentheses ("answer is blotter (e).":
    the last such letter) or ends in "answer is e" style ("The answer is E."). Only
    letters of ``letters`` count. When ``extracted`` is None (the task found no
    answer) the verdict is wrong: the generation is not searched again. The predicted
    value is the lower-case letter, or the raw stripped extraction when it names no
    choice.
    """

    def __init__(self, *, letters: Annotated[str, NON_EMPTY] = "abcde") -> None:
        letters = letters.lower()
        if not letters.isalpha() or not letters.isascii():
            raise UserError(f"letters: must be ASCII letters only, got {letters!r}")
        if len(set(letters)) != len(letters):
            raise UserError(f"letters: must not repeat a letter, got {letters!r}")
        self.letters = letters
        cls = f"[{re.escape(letters)}]"
        self._bare = re.compile(rf"\(?\s*({cls})\s*\)?\s*[.,;:!]?", re.IGNORECASE)
        self._paren = re.compile(rf"\(\s*({cls})\s*\)", re.IGNORECASE)
        self._stated = re.compile(rf"answer\s+is\s*:?\s*\(?({cls})\)?\s*[.,;:!]?\s*$",
                                  re.IGNORECASE)

    def letter(self, text: str) -> str | None:
        """The choice letter ``text`` names, lower-case, or None."""
        text = text.strip()
        match = self._bare.fullmatch(text)
        if match is None:
            found = self._paren.findall(text)
            if found:
                return found[-1].lower()
            match = self._stated.search(text)
        return match.group(1).lower() if match else None

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        if extracted is None:
            return Verdict(None, False)
        predicted = self.letter(extracted) or extracted.strip()
        expected = self.letter(gold)
        return Verdict(predicted, expected is not None and predicted == expected)


class NumericChecker:
    """``extracted`` and ``gold`` parse to numbers within tolerance.

    Parsing is :func:`star_filters.numbers.parse_number` ("1,000", "$18", "18.00",
    "-5", "1/2", "50%" = 50, "18."; exactly one number: "18 or 20" does not parse and
    is wrong), the parser the GSM8K task uses too. Close means
    ``|p - g| <= max(abs_tol, rel_tol * max(|p|, |g|))``. ``predicted`` is the
    canonical number ("1000"), or the raw stripped text when it does not parse.
    """

    def __init__(self, *, abs_tol: NonNegFloat = 1e-6, rel_tol: NonNegFloat = 0.0) -> None:
        self.abs_tol, self.rel_tol = abs_tol, rel_tol

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        if extracted is None:
            return Verdict(None, False)
        value = parse_number(extracted)
        if value is None:
            return Verdict(extracted.strip(), False)
        expected = parse_number(gold)
        correct = expected is not None and numbers_close(value, expected, self.abs_tol,
                                                         self.rel_tol)
        return Verdict(format_number(value), correct)


_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE,
          "a": re.ASCII}


class RegexChecker:
    """The answer is ``group`` of the last match of ``pattern`` in the generation.

    ``extracted`` is ignored. ``flags`` is a string of letters: i (ignore case),
    m (multiline), s (dot matches newline), x (verbose), a (ASCII). ``group`` is a
    group number or name; matches where that group did not take part are skipped.
    ``compare = "exact"`` compares the stripped group with the stripped gold;
    ``"numeric"`` compares as the ``numeric`` checker does with its defaults.
    """

    def __init__(self, *, pattern: Annotated[str, NON_EMPTY], group: int | str = 1, flags: str = "",
                 compare: Literal["exact", "numeric"] = "exact") -> None:
        bad = sorted(set(flags) - set(_FLAGS))
        if bad:
            raise UserError(f"flags: unknown flag(s) {''.join(bad)!r}; allowed: "
                            f"{''.join(_FLAGS)}")
        value = 0
        for letter in flags:
            value |= _FLAGS[letter]
        try:
            self.regex = re.compile(pattern, value)
        except re.error as exc:
            raise UserError(f"pattern: invalid regular expression {pattern!r}: {exc}") from None
        if isinstance(group, int) and not 0 <= group <= self.regex.groups:
            raise UserError(f"group: pattern {pattern!r} has {self.regex.groups} group(s), "
                            f"got {group}")
        if isinstance(group, str) and group not in self.regex.groupindex:
            raise UserError(f"group: pattern {pattern!r} has no group named {group!r}")
        self.group = group
        self.compare = compare
        self._numeric = NumericChecker() if self.compare == "numeric" else None

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        found = None
        for match in self.regex.finditer(generation):
            if match.group(self.group) is not None:
                found = match.group(self.group)
        if found is None:
            return Verdict(None, False)
        if self._numeric is not None:
            return self._numeric.check(generation, found, gold)
        predicted = found.strip()
        return Verdict(predicted, predicted == gold.strip())
