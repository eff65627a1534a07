"""Where a CommonsenseQA generation states its answer, two ways. This is the one
place the letter is read: the checkers (``mc_letter``, ``exact_lower``) compare what
the task extracted and never search the generation themselves.

``lenient`` (the project's default): the last "(x)" on the first non-blank line; when
that line has none, the first "answer is ... (x)" of the generation.
``original``: exactly as the released STaR code (``device_inference.py``, ezelikman/STaR
at 6ffd3c4, lines 39-43): the first line of the generation, cut at ``<|endoftext|>``,
and its character ``[-3]`` ("... blotter (e)." -> "e"); no other fallback. The stored
rationale of the original is that same first line (``first_line``).
"""

from __future__ import annotations

import re

EOT = "<|endoftext|>"

# A parenthesised single letter, "(e)" or "( E )"; the answer is the last one on the line.
_LETTER = re.compile(r"\(\s*([A-Za-z])\s*\)")
# "answer is <choice text> (x)" on one line, the text without parentheses.
_ANSWER_IS = re.compile(r"answer\s+is\b[^\n()]*?\(\s*([A-Za-z])\s*\)", re.IGNORECASE)


def extract_letter(generation: str) -> str | None:
    """The answer letter of a generation, lowercase, or None.

    As in the original, the first line counts (the model writes rationale and
    answer on one line; later lines are the model running on), but blank leading
    lines are skipped and the letter may be upper case or padded: the last "(x)" of
    the first non-blank line. When that line has none, the first "answer is ... (x)"
    anywhere (" I think so.\nSo the answer is blotter (e)." -> "e"); a bare
    "The answer is E." is not taken (the article "a" would make it ambiguous).
    """
    first = next((line for line in generation.split("\n") if line.strip()), "")
    found = _LETTER.findall(first)
    if found:
        return found[-1].lower()
    match = _ANSWER_IS.search(generation)
    return match.group(1).lower() if match else None


def first_line(generation: str) -> str:
    """The generation's first line, cut at the first end-of-text marker (what the
    original checks and stores: an empty first line stays empty)."""
    return generation.split("\n")[0].split(EOT)[0]


def original_letter(generation: str) -> str | None:
    """Character ``[-3]`` of :func:`first_line`, as it is (the original compares it
    lower-cased with ``answerKey``); None when the line is shorter than 3 characters
    (the original's ``IndexError``, counted wrong). Any character counts: a line that
    does not end in "(x)." gives whatever stands there, and is wrong."""
    line = first_line(generation)
    return line[-3] if len(line) >= 3 else None
