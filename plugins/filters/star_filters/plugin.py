"""Hook implementations: registers the checkers and the rationale filters."""

from __future__ import annotations

from star_engine import hookimpl

from .checkers import ExactChecker, LowerExactChecker, MCLetterChecker, NumericChecker, RegexChecker
from .filters import DedupFilter, HintLeakFilter, LengthCapFilter

CHECKERS = {
    "exact": ExactChecker,
    "exact_lower": LowerExactChecker,
    "mc_letter": MCLetterChecker,
    "numeric": NumericChecker,
    "regex": RegexChecker,
}
FILTERS = {
    "hint_leak": HintLeakFilter,
    "dedup": DedupFilter,
    "length_cap": LengthCapFilter,
}


@hookimpl
def register_checkers(register):
    for name, factory in CHECKERS.items():
        register(name, factory)


@hookimpl
def register_filters(register):
    for name, factory in FILTERS.items():
        register(name, factory)
