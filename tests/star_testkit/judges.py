"""A test-only plugin for the checkers' optional parts (``Checker.check_gold``, ``Verdict.timed_out``)
and the ``[evaluation] checkers``: a toy task whose data file states each gold answer as written,
and toy checkers that screen gold answers or give up on some answers. Load it beside the scripted
plugin: ``STAR_ENGINE_PLUGINS=star_testkit.scripted,star_testkit.judges``.
"""

from __future__ import annotations

import re
from pathlib import Path

from typing import Literal

from star_engine import Example, UserError, Verdict, hookimpl

from .scripted import ToyTask


class ToyGoldTask(ToyTask):
    """The toy task reading ``a+b`` or ``a+b=GOLD`` lines: the gold answer is the sum, or GOLD as
    written (which may be no number at all); the scripted model still answers with the sum."""

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is None:
            return super().load(split, path)
        out = []
        for i, line in enumerate(Path(path).read_text().splitlines(), 1):
            m = re.fullmatch(r"(\d+)\+(\d+)(?:=(.*))?", line.strip())
            if not m:
                raise UserError(f"{path}:{i}: expected 'a+b' or 'a+b=gold'")
            a, b = int(m.group(1)), int(m.group(2))
            gold = m.group(3) if m.group(3) is not None else str(a + b)
            out.append(Example(f"{split}-{i}", f"{a}+{b}", gold, str(len(str(max(a, b))))))
        return out


class DigitsChecker:
    """``toy_digits``: right when the extraction equals the gold; gold answers that are not
    digits are refused (``bad_gold = "refuse"``) or skipped (``"skip"``) by ``check_gold``, which
    counts its calls (``calls``) so tests can see it runs once per question."""

    def __init__(self, *, bad_gold: Literal["refuse", "skip"] = "refuse"):
        self.bad_gold = bad_gold
        self.calls: list[str] = []

    def check_gold(self, gold: str) -> bool:
        self.calls.append(gold)
        if gold.isdigit():
            return True
        if self.bad_gold == "skip":
            return False
        raise UserError(f"gold answer {gold!r} is not digits")

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        return Verdict(extracted, extracted is not None and extracted == gold)


class OddGivesUp:
    """``toy_gives_up``: gives up (``timed_out``, wrong) on every answer whose extraction is odd;
    judges the others as ``toy_exact`` does. ``rule = "last_digit"`` reads the generation's last
    digit instead of the task's extraction (a rule of its own)."""

    def __init__(self, *, rule: Literal["extracted", "last_digit"] = "extracted"):
        self.rule = rule

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        if self.rule == "last_digit":
            digits = re.findall(r"\d", generation)
            return Verdict(digits[-1] if digits else None, bool(digits) and gold.endswith(digits[-1]))
        if extracted is not None and int(extracted) % 2:
            return Verdict(None, False, timed_out=True)
        return Verdict(extracted, extracted == gold)


@hookimpl
def register_tasks(register):
    register("toy_gold", ToyGoldTask)


@hookimpl
def register_checkers(register):
    register("toy_digits", DigitsChecker)
    register("toy_gives_up", OddGivesUp)
