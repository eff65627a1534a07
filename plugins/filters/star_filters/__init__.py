"""Answer checkers and rationale filters for star-engine (plugin ``filters``)."""

from .checkers import ExactChecker, LowerExactChecker, MCLetterChecker, NumericChecker, RegexChecker
from .filters import DedupFilter, HintLeakFilter, LengthCapFilter
from .numbers import canonical_number, format_number, numbers_close, parse_number

__all__ = [
    "DedupFilter", "ExactChecker", "HintLeakFilter", "LengthCapFilter", "LowerExactChecker", "MCLetterChecker",
    "NumericChecker", "RegexChecker", "canonical_number", "format_number", "numbers_close", "parse_number",
]
