"""The ``math_verify`` checker: Hugging Face's math-verify (``parse`` the gold answer and the
generation, then ``verify``) called as one of the field's libraries calls it, or as this project
does (``convention``; ``star_mathverify.conventions`` cites each library's file, function and
commit): ``\\frac{1}{2}`` = ``0.5`` = ``1/2``, ``10\\%`` = ``0.1``, ``\\boxed{x = 5}`` = ``5``,
intervals, sets, matrices, symbolic equality.

Every call runs in a worker process (``star_mathverify.pool``), bounded by ``timeout_seconds``
wherever the caller runs: an answer past the bound is wrong, with ``Verdict.timed_out`` set (the
core counts these in the run's events and metrics), never a hang. Gold answers are parsed once
per question (``check_gold``, when the data is loaded; cached in the worker), not once per sample.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Annotated, Literal

from star_engine import NonNegInt, PosInt, UserError, Verdict, above

from .conventions import Convention, GoldFormat, default_seconds
from .pool import PACKAGE, TimedOut, Worker

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

    - ``convention``: how math-verify is called (the gold's parse, the answer's parse, ``verify``'s
      argument order, the library's own timeouts, when a gold counts as unparsed):
      ``"star_engine"`` (default: this project's own call, the behaviour before conventions were
      named), ``"lm_eval"`` (lm-evaluation-harness ``minerva_math``), ``"verl"``, ``"trl"`` (TRL's
      ``accuracy_reward``: LaTeX answers only, boxed first), ``"open_r1"`` (open-r1's
      ``accuracy_reward`` since 2025-04-01), ``"open_r1_reversed"`` (before: ``verify(answer,
      gold)``). ``star_mathverify.conventions`` cites each source.
    - ``read``: ``"generation"`` (default) parses the whole generation, as every convention's
      library does; ``"extracted"`` parses only what the task extracted (no extraction: wrong), a
      departure from all of them.
    - ``gold_format`` (``star_engine`` only): how gold answers are read: ``"auto"`` (the default:
      text with ``$``/``\\boxed`` as it is, a bare answer as LaTeX math, else as a plain
      expression), ``"latex"``, ``"expr"``. A library's convention reads them as that library does.
    - ``bad_gold``: a gold answer the convention counts as unparsed: ``"refuse"`` (default) the
      data, naming the file and row; ``"skip"`` the question (counted in the run's events: TRL's
      and open-r1's ``None`` reward); ``"wrong"`` every answer to it (lm-eval, verl); ``"right"``
      every answer to it (``open_r1_reversed``'s reward 1.0).
    - ``timeout_seconds``: the bound on one answer (parsing it and verifying it) and on one gold
      parse; past it the answer is wrong and counted as timed out, and the worker is restarted
      (about a second). Unset: 5 s for ``star_engine``; for a library, the sum of its own
      math-verify timeouts plus 1 s (``conventions.default_seconds``), so that they decide.
    - ``float_rounding`` (6), ``numeric_precision`` (15), ``strict`` (true),
      ``allow_set_relation_comp`` (false): ``verify``'s own options, at every library's values by
      default (another value departs from the convention).
    - ``gold_cache`` (16384): parsed gold answers kept; ``memory_mb`` (4096): the worker's
      address-space cap in MiB (0 = none), past which an answer is wrong.
    """

    def __init__(self, *, convention: Convention = "star_engine",
                 read: Literal["generation", "extracted"] = "generation", gold_format: GoldFormat | None = None,
                 bad_gold: Literal["refuse", "skip", "wrong", "right"] = "refuse",
                 timeout_seconds: Annotated[float, above(0)] | None = None,
                 float_rounding: NonNegInt = 6, numeric_precision: PosInt = 15, strict: bool = True,
                 allow_set_relation_comp: bool = False, gold_cache: PosInt = 16384,
                 memory_mb: NonNegInt = 4096) -> None:
        if gold_format is not None and convention != "star_engine":
            raise UserError(f"gold_format: applies only with convention = \"star_engine\"; convention = "
                            f"\"{convention}\" reads gold answers as its library does")
        self.convention, self.read, self.bad_gold = convention, read, bad_gold
        self.timeout_seconds = timeout_seconds
        options = {"convention": convention, "gold_format": gold_format or "auto", "float_rounding": float_rounding,
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

    def bounds(self) -> tuple[float, float]:
        """The bounds in seconds on (parsing one gold answer, checking one answer)."""
        if self.timeout_seconds is not None:
            return self.timeout_seconds, self.timeout_seconds
        return default_seconds(self.convention)

    def check_gold(self, gold: str) -> bool:
        """Parse ``gold`` (cached in the worker for the checks to come): True when the convention
        reads an answer in it, or when ``bad_gold`` keeps the question anyway (``"wrong"``,
        ``"right"``); else the question is skipped (False) or the data refused (``UserError``)."""
        seconds = self.bounds()[0]
        try:
            shown = self.worker.request(("gold", gold), seconds)
            why = "math-verify finds no answer in it"
        except TimedOut:
            shown = None
            why = (f"parsing it took more than timeout_seconds ({seconds:g} s)" if self.timeout_seconds is not None
                   else f"parsing it took more than {seconds:g} s (convention \"{self.convention}\"'s bound)")
        if shown is not None or self.bad_gold in ("wrong", "right"):
            return True
        if self.bad_gold == "skip":
            return False
        raise UserError(f"gold answer {gold[:200]!r} does not parse: {why} (bad_gold = \"skip\" skips such "
                        f"questions)")

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        answer = generation if self.read == "generation" else extracted
        if answer is None:
            return Verdict(None, False)
        try:
            predicted, correct, gold_read = self.worker.request(("check", gold, answer), self.bounds()[1])
        except TimedOut:
            return Verdict(None, False, timed_out=True)
        if not gold_read:  # only with bad_gold "wrong" or "right" (the others screen such golds out)
            correct = self.bad_gold == "right"
        return Verdict(predicted, correct)

    def close(self) -> None:
        """Stop the worker process now (the checker starts another when asked again)."""
        self.worker.close()
