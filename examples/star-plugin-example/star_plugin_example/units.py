"""Units, conversions and the number formats of the unit-conversion task.

Every unit belongs to a family (length, mass, volume, time) and has a size in
the family's base unit, so any two units of a family convert exactly (values
are :class:`decimal.Decimal`). ``PAIRS`` lists the conversions the generator
asks about: a bigger unit, a smaller one and how many of the smaller make one
of the bigger, so every question has a one-step worked rationale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation


@dataclass(frozen=True)
class Unit:
    name: str  # singular, as the task writes it ("metre")
    plural: str
    family: str
    size: Decimal  # in the family's base unit
    aliases: tuple[str, ...] = ()

    def word(self, value: Decimal) -> str:
        """The unit's name as it follows ``value`` ("1 metre", "3.5 metres")."""
        return self.name if value == 1 else self.plural


UNITS: dict[str, Unit] = {u.name: u for u in (
    Unit("millimetre", "millimetres", "length", Decimal("0.001"), ("mm", "millimeter", "millimeters")),
    Unit("centimetre", "centimetres", "length", Decimal("0.01"), ("cm", "centimeter", "centimeters")),
    Unit("metre", "metres", "length", Decimal(1), ("m", "meter", "meters")),
    Unit("kilometre", "kilometres", "length", Decimal(1000), ("km", "kilometer", "kilometers")),
    Unit("milligram", "milligrams", "mass", Decimal("0.001"), ("mg",)),
    Unit("gram", "grams", "mass", Decimal(1), ("g",)),
    Unit("kilogram", "kilograms", "mass", Decimal(1000), ("kg",)),
    Unit("millilitre", "millilitres", "volume", Decimal("0.001"), ("ml", "milliliter", "milliliters")),
    Unit("litre", "litres", "volume", Decimal(1), ("l", "liter", "liters")),
    Unit("second", "seconds", "time", Decimal(1), ("s", "sec", "secs")),
    Unit("minute", "minutes", "time", Decimal(60), ("min", "mins")),
    Unit("hour", "hours", "time", Decimal(3600), ("h", "hr", "hrs")),
    Unit("day", "days", "time", Decimal(86400), ("d",)),
)}
FAMILIES = tuple(dict.fromkeys(u.family for u in UNITS.values()))

_LOOKUP: dict[str, Unit] = {}
for _u in UNITS.values():
    for _key in (_u.name, _u.plural, *_u.aliases):
        _LOOKUP[_key.casefold()] = _u

PAIRS: tuple[tuple[str, str], ...] = (  # (bigger, smaller)
    ("metre", "centimetre"), ("metre", "millimetre"), ("centimetre", "millimetre"),
    ("kilometre", "metre"), ("kilogram", "gram"), ("gram", "milligram"), ("litre", "millilitre"),
    ("hour", "minute"), ("minute", "second"), ("day", "hour"),
)


def unit(text: str) -> Unit | None:
    """The unit a word names (any case, singular, plural, US spelling or symbol)."""
    return _LOOKUP.get(text.strip().casefold())


def factor(bigger: Unit, smaller: Unit) -> Decimal:
    """How many ``smaller`` make one ``bigger``."""
    return bigger.size / smaller.size


def convert(value: Decimal, src: Unit, dst: Unit) -> Decimal:
    if src.family != dst.family:
        raise ValueError(f"cannot convert {src.plural} to {dst.plural}")
    return value * src.size / dst.size


def fmt(value: Decimal) -> str:
    """Plain decimal text without exponent or trailing zeros: "350", "2.5", "0.04"."""
    text = format(value.normalize(), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def quantity(value: Decimal, u: Unit) -> str:
    """ "3.5 metres", "1 metre"."""
    return f"{fmt(value)} {u.word(value)}"


_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
_QUANTITY = re.compile(rf"\s*({_NUMBER})\s*([A-Za-z]+)?\s*[.!]?\s*")


def parse_number(text: str) -> Decimal | None:
    """A plain decimal ("350", "1,000", "2.5", "-.5"), or None."""
    if not re.fullmatch(_NUMBER, text.strip()):
        return None
    try:
        return Decimal(text.strip().replace(",", ""))
    except InvalidOperation:
        return None


def parse_quantity(text: str) -> tuple[Decimal, str | None] | None:
    """ "350 centimetres" -> (350, "centimetres"); "350" -> (350, None); None when
    ``text`` is not a number optionally followed by one word (the unit)."""
    m = _QUANTITY.fullmatch(text)
    if m is None:
        return None
    value = parse_number(m.group(1))
    return None if value is None else (value, m.group(2))
