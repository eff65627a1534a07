"""Answer checkers and rationale filters for star-engine (plugin ``filters``), and the text
code other plugins may use (README, "For tasks"): the one number parser (``parse_number``,
``canonical_number``, ``format_number``, ``numbers_close``), GPT-2's decoding clean-up
(``clean_up_tokenization``) and what the few-shot question-answer tasks share (``FewShotQA``,
``stop_strings``). Import these from ``star_filters``; its modules are its own."""

from .checkers import ExactChecker, LowerExactChecker, MCLetterChecker, NumericChecker, RegexChecker
from .fewshot import FewShotQA, stop_strings
from .filters import DedupFilter, HintLeakFilter, LengthCapFilter
from .numbers import canonical_number, format_number, numbers_close, parse_number
from .text import clean_up_tokenization

__all__ = [
    "DedupFilter", "ExactChecker", "FewShotQA", "HintLeakFilter", "LengthCapFilter", "LowerExactChecker",
    "MCLetterChecker", "NumericChecker", "RegexChecker", "canonical_number", "clean_up_tokenization",
    "format_number", "numbers_close", "parse_number", "stop_strings",
]
