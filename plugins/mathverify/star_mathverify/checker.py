"""The ``math_verify`` checker: Hugging Face's math-verify (``parse``, then ``verify(gold,
answer)``), the comparison TRL's ``accuracy_reward``, verl, OpenCompass and lm-evaluation-harness's
MATH scoring use: ``\\frac{1}{2}`` = ``0.5`` = ``1/2``, ``10\\%`` = ``0.1``, ``\\boxed{x = 5}`` =
``5``, intervals, sets, matrices, symbolic equality.

Every call runs in a worker process (``star_mathverify.pool``), bounded by ``timeout_seconds``
wherever the caller runs: an answer past the bound is wrong, with ``Verdict.timed_out`` set (the
core counts these in the run's events and metrics), never a hang. Gold answers are parsed once
per question (``check_gold``, when the data is loaded; cached in the worker), not once per sample.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Annotated, Literal

from star_engine import NonNegInt, PosInt, UserError, Verdict, above

from .pool import PACKAGE, TimedOut, Worker
from .worker import GoldFormat

MODULES = ("math_verify", "latex2sympy2_extended", "sympy", "antlr4")  # what parsing LaTeX imports


def missing_module() -> str | None:
    """The first module of ``MODULES`` that cannot be imported, else None (nothing is imported)."""
    for name in MODULES:
        try:
            if find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


class MathVerifyChecker:
    """``math_verify``: an answer is right when math-verify verifies it against the gold answer.

    Options:

    - ``read``: ``"generation"`` (default) parses the whole generation, as TRL's
      ``accuracy_reward`` and verl do (math-verify finds the answer: the last ``\\boxed{}``, a
      final "answer is", else the last expression); ``"extracted"`` parses only what the task
      extracted (no extraction: wrong).
    - ``gold_format``: how gold answers are read: ``"auto"`` (default: text with ``$``/``\\boxed``
      as it is, a bare answer as LaTeX math, else as a plain expression), ``"latex"``, ``"expr"``.
    - ``bad_gold``: a gold answer math-verify cannot parse: ``"refuse"`` (default) the data, naming
      the file and row; ``"skip"`` the question (counted in the run's events).
    - ``timeout_seconds`` (default 5): the bound on one answer (parsing it and verifying it); past
      it the answer is wrong and counted as timed out, and the worker is restarted (about a second).
    - ``float_rounding`` (6), ``numeric_precision`` (15), ``strict`` (true),
      ``allow_set_relation_comp`` (false): ``verify``'s own options.
    - ``gold_cache`` (16384): parsed gold answers kept; ``memory_mb`` (4096): the worker's
      address-space cap in MiB (0 = none), past which an answer is wrong.
    """

    def __init__(self, *, read: Literal["generation", "extracted"] = "generation", gold_format: GoldFormat = "auto",
                 bad_gold: Literal["refuse", "skip"] = "refuse", timeout_seconds: Annotated[float, above(0)] = 5.0,
                 float_rounding: NonNegInt = 6, numeric_precision: PosInt = 15, strict: bool = True,
                 allow_set_relation_comp: bool = False, gold_cache: PosInt = 16384,
                 memory_mb: NonNegInt = 4096) -> None:
        self.read, self.bad_gold, self.timeout_seconds = read, bad_gold, timeout_seconds
        options = {"gold_format": gold_format, "float_rounding": float_rounding,
                   "numeric_precision": numeric_precision, "strict": strict,
                   "allow_set_relation_comp": allow_set_relation_comp, "gold_cache": gold_cache,
                   "memory_mb": memory_mb}
        if memory_mb and memory_mb < 512:
            raise UserError(f"memory_mb: must be 0 (no cap) or at least 512 (Python and sympy need it), "
                            f"got {memory_mb}")
        absent = missing_module()
        if absent is not None:
            raise UserError(f"math_verify needs the package '{PACKAGE}' (module '{absent}' is not installed): "
                            f"pip install '{PACKAGE}'")
        self.worker = Worker(options)

    def check_gold(self, gold: str) -> bool:
        """Parse ``gold`` (cached in the worker for the checks to come): True when math-verify reads
        an answer in it; else the question is skipped (False) or the data refused (``UserError``),
        as ``bad_gold`` says."""
        try:
            shown = self.worker.request(("gold", gold), self.timeout_seconds)
            why = "math-verify finds no answer in it"
        except TimedOut:
            shown, why = None, f"parsing it took more than timeout_seconds ({self.timeout_seconds:g} s)"
        if shown is not None:
            return True
        if self.bad_gold == "skip":
            return False
        raise UserError(f"gold answer {gold[:200]!r} does not parse: {why} (bad_gold = \"skip\" skips such "
                        f"questions)")

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        answer = generation if self.read == "generation" else extracted
        if answer is None or not answer.strip():
            return Verdict(None, False)
        try:
            predicted, correct = self.worker.request(("check", gold, answer), self.timeout_seconds)
        except TimedOut:
            return Verdict(None, False, timed_out=True)
        return Verdict(predicted, correct)

    def close(self) -> None:
        """Stop the worker process now (the checker starts another when asked again)."""
        self.worker.close()
