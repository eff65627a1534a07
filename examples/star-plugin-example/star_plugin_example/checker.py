"""``unit_numeric``: the stated quantity equals the gold one, within a tolerance,
in the gold's unit or (with ``convert``) any unit of the same family."""

from __future__ import annotations

from decimal import Decimal

from star_engine import NonNegFloat, Verdict

from . import units


class UnitNumericChecker:
    """Compares ``<number> [unit]`` answers ("350 centimetres", "3.5 m", "1,200 g").

    Options:
    - ``abs_tol``, ``rel_tol``: close means ``|p - g| <= max(abs_tol, rel_tol * max(|p|, |g|))``
      after conversion to the gold's unit (exact decimal arithmetic);
    - ``require_unit``: a bare number is wrong when the gold has a unit (default);
      when false it is read in the gold's unit;
    - ``convert``: accept another unit of the gold's family, converted (default);
      when false only the gold's own unit (any of its names or its symbol) counts.

    ``predicted`` is the answer as understood, canonically written ("3.5 metres",
    "350"), or the raw stripped text when it does not parse.
    """

    def __init__(self, *, abs_tol: NonNegFloat = 1e-9, rel_tol: NonNegFloat = 0.0, require_unit: bool = True,
                 convert: bool = True) -> None:
        self.abs_tol = Decimal(str(abs_tol))
        self.rel_tol = Decimal(str(rel_tol))
        self.require_unit = require_unit
        self.convert = convert

    def close(self, a: Decimal, b: Decimal) -> bool:
        return abs(a - b) <= max(self.abs_tol, self.rel_tol * max(abs(a), abs(b)))

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        if extracted is None:
            return Verdict(None, False)
        said = units.parse_quantity(extracted)
        if said is None:
            return Verdict(extracted.strip(), False)
        value, word = said
        said_unit = units.unit(word) if word else None
        predicted = units.quantity(value, said_unit) if said_unit else (
            units.fmt(value) if word is None else f"{units.fmt(value)} {word}")
        expected = units.parse_quantity(gold)
        if expected is None:
            return Verdict(predicted, False)
        gold_value, gold_word = expected
        gold_unit = units.unit(gold_word) if gold_word else None
        if word is not None and said_unit is None:  # a word that is no unit we know
            return Verdict(predicted, False)
        if gold_unit is None:  # a unit-less gold: compare numbers (a stated unit is ignored)
            return Verdict(predicted, self.close(value, gold_value))
        if said_unit is None:
            return Verdict(predicted, not self.require_unit and self.close(value, gold_value))
        if said_unit is not gold_unit:
            if not self.convert or said_unit.family != gold_unit.family:
                return Verdict(predicted, False)
            value = units.convert(value, said_unit, gold_unit)
        return Verdict(predicted, self.close(value, gold_value))
