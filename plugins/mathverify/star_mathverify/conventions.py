r"""How the field's libraries call math-verify: the ``convention`` option of the ``math_verify``
checker. Each library name is that library's call exactly: the extraction and normalization
configs of the gold answer and of the answer, ``extraction_mode``, the order of ``verify``'s
arguments, the library's own timeouts, and what an unparsed gold answer means. Read from:

- ``lm_eval``: EleutherAI/lm-evaluation-harness ``lm_eval/tasks/minerva_math/utils.py::
  process_results`` (commit 4e7e0d47; the file last changed in 18d2face):
  ``verify(gold=parse(doc["solution"]), target=parse(candidates))``, math-verify's defaults
  throughout (both parsed with ``[LatexExtractionConfig(), ExprExtractionConfig()]``,
  ``extraction_mode="any_match"``, ``parsing_timeout=5``; ``verify``'s ``timeout_seconds=5``). It
  never tests the gold: an empty gold parse verifies nothing (wrong).
- ``verl``: volcengine/verl ``verl/utils/reward_score/math_verify.py::compute_score`` (commit
  b178a3cd, version 0.8.0.dev; the file last changed in b00f77d8): ``math_metric(
  gold_extraction_target=(LatexExtractionConfig(),), pred_extraction_target=(ExprExtractionConfig(),
  LatexExtractionConfig()))`` on ``["\\boxed{" + ground_truth + "}"]`` and ``[model_output]``.
  ``math_metric`` (math-verify 0.9.0 ``metric.py``) parses both with ``parse``'s other defaults and
  calls ``verify(gold, pred, 6)`` (``float_rounding``); an empty gold parse raises ``ValueError``,
  which verl catches: score 0 (wrong).
- ``trl``: huggingface/trl ``trl/rewards/accuracy_rewards.py::accuracy_reward`` (commit f2cd5771,
  version 1.10.0.dev0): the gold ``parse(solution, parsing_timeout=10)``, an empty one rewarded
  ``None`` (the example skipped); the completion ``parse(content, extraction_config=[
  LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
  try_extract_without_anchor=False)], extraction_mode="first_match", parsing_timeout=10)``: LaTeX
  only, the first match, boxed tried first; ``verify(gold, answer, timeout_seconds=5)``. (10 and 5
  are its main-thread values; it turns them off elsewhere. The worker is a main thread.)
- ``open_r1``: huggingface/open-r1 ``src/open_r1/rewards.py::accuracy_reward`` (commit c1e11922;
  this call since 4f5b21e, PR #566, 2025-04-01): the gold ``parse(sol, extraction_mode="first_match")``,
  an empty one rewarded ``None``; the completion parsed as TRL does but with
  ``NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True, equations=True,
  boxed="all", units=True)`` and math-verify's default ``parsing_timeout=5``;
  ``verify(gold, answer)`` with its defaults (an exception there is rewarded ``None``; in a main
  thread ``verify`` raises none).
- ``open_r1_reversed``: the same file's ``accuracy_reward`` from e8c2673 (2025-02-06) up to
  9915e06 (the parent of 4f5b21e): the gold ``parse(sol, extraction_mode="first_match",
  extraction_config=[LatexExtractionConfig()])``, an empty one rewarded 1.0 ("to skip this
  example"); the completion as ``open_r1``; ``verify(answer, gold)``: the arguments reversed, which
  flips asymmetric comparisons (a gold ``(1,2)`` accepts ``1<x<2``). ``len_reward`` and
  ``get_cosine_scaled_reward`` at c1e11922 still call ``verify(answer, gold)`` this way (with
  ``boxed=True`` in their normalization: not this convention).

``star_engine`` is this project's own call (no library's): the answer parsed as ``lm_eval`` does
(math-verify's defaults) but with math-verify's timeouts off (the worker's bound alone), the gold
read by the checker's ``gold_format`` (a bare answer as LaTeX math), and a gold answer counted as
unparsed when math-verify reads no expression in it (not only when it reads nothing).

Only ``build`` imports math-verify (in the worker process); the rest is plain data the checker
reads in the parent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Convention = Literal["star_engine", "lm_eval", "verl", "trl", "open_r1", "open_r1_reversed"]
GoldFormat = Literal["auto", "latex", "expr"]  # how ``star_engine`` reads gold answers
DELIMITERS = ("$", "\\(", "\\[", "\\boxed", "\\fbox")

# (gold parse, answer parse, one verify comparison): the library's own bounds in seconds, None = off
LIBRARY_SECONDS: dict[str, tuple[int | None, int | None, int | None]] = {
    "star_engine": (None, None, None), "lm_eval": (5, 5, 5), "verl": (5, 5, 5), "trl": (10, 10, 5),
    "open_r1": (5, 5, 5), "open_r1_reversed": (5, 5, 5)}
STAR_ENGINE_SECONDS = 5.0  # ``star_engine``'s bound on one request (its library timeouts are off)


def default_seconds(convention: str) -> tuple[float, float]:
    """The bound on (parsing one gold answer, checking one answer) when ``timeout_seconds`` is
    not set: ``star_engine``'s 5 s; for a library, the sum of its own bounds on the calls one
    request makes, plus 1 s, so that its bounds decide and ours stops only what they cannot (a
    computation that stays inside C). A check may parse its gold again (a cache miss)."""
    gold, answer, compare = LIBRARY_SECONDS[convention]
    if gold is None or answer is None or compare is None:
        return STAR_ENGINE_SECONDS, STAR_ENGINE_SECONDS
    return gold + 1.0, gold + answer + compare + 1.0


@dataclass(frozen=True)
class Call:
    """One convention's call: ``parse_gold(gold)``, ``parse_answer(text)``, ``verify(gold_parse,
    answer_parse) -> bool`` and ``gold_read(gold_parse)``: whether the gold counts as parsed."""

    parse_gold: Callable[[str], list]
    parse_answer: Callable[[str], list]
    verify: Callable[[list, list], bool]
    gold_read: Callable[[list], bool]


def has_expression(parsed: list) -> bool:
    """math-verify read an expression (not only a raw string it could not parse)."""
    return any(not isinstance(x, str) for x in parsed)


def build(options: Mapping[str, Any]) -> Call:
    """The call of ``options["convention"]``, with ``verify``'s options (``float_rounding``,
    ``numeric_precision``, ``strict``, ``allow_set_relation_comp``: at their defaults, every
    library's values) from ``options``."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    name = options["convention"]
    opts = {k: options[k] for k in ("float_rounding", "numeric_precision", "strict", "allow_set_relation_comp")}
    gold_s, answer_s, compare_s = LIBRARY_SECONDS[name]
    latex, expr = LatexExtractionConfig(), ExprExtractionConfig()
    nonempty: Callable[[list], bool] = lambda parsed: len(parsed) != 0  # noqa: E731

    def in_order(gold: list, answer: list) -> bool:
        return bool(verify(gold, answer, timeout_seconds=compare_s, **opts))

    if name == "star_engine":
        return Call(lambda gold: star_engine_gold(gold, options["gold_format"], parse),
                    lambda text: parse(text, [latex, expr], parsing_timeout=None), in_order, has_expression)
    if name == "lm_eval":
        return Call(lambda gold: parse(gold, parsing_timeout=gold_s),
                    lambda text: parse(text, parsing_timeout=answer_s), in_order, nonempty)
    if name == "verl":
        return Call(lambda gold: parse("\\boxed{" + gold + "}", (latex,), parsing_timeout=gold_s),
                    lambda text: parse(text, (expr, latex), parsing_timeout=answer_s), in_order, nonempty)
    norm = (NormalizationConfig(units=True) if name == "trl" else
            NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True, equations=True,
                                boxed="all", units=True))
    answer_config = [LatexExtractionConfig(normalization_config=norm, boxed_match_priority=0,
                                           try_extract_without_anchor=False)]

    def parse_answer(text: str) -> list:
        return parse(text, extraction_config=answer_config, extraction_mode="first_match", parsing_timeout=answer_s)

    if name == "trl":
        return Call(lambda gold: parse(gold, parsing_timeout=gold_s), parse_answer, in_order, nonempty)
    if name == "open_r1":
        return Call(lambda gold: parse(gold, extraction_mode="first_match", parsing_timeout=gold_s),
                    parse_answer, in_order, nonempty)
    if name == "open_r1_reversed":
        return Call(lambda gold: parse(gold, extraction_mode="first_match", extraction_config=[latex],
                                       parsing_timeout=gold_s),
                    parse_answer, lambda gold, answer: bool(verify(answer, gold, timeout_seconds=compare_s, **opts)),
                    nonempty)
    raise ValueError(f"unknown convention {name!r}")


def star_engine_gold(gold: str, gold_format: str, parse: Callable[..., list]) -> list:
    """``gold`` as the ``star_engine`` convention reads it. ``"auto"``: text with math delimiters
    (``$``, ``\\(``, ``\\[``, ``\\boxed``) as it is, LaTeX and plain expressions alike; a bare
    answer (``\\frac{1}{2}``, ``[1,2)``, ``18``) as LaTeX math, else as a plain expression.
    ``"latex"``: LaTeX only (a bare answer in ``$...$``); ``"expr"``: plain expressions only."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    latex, expr = [LatexExtractionConfig()], [ExprExtractionConfig()]
    delimited = any(d in gold for d in DELIMITERS)
    if gold_format == "expr":
        return parse(gold, extraction_config=expr, parsing_timeout=None)
    if gold_format == "latex" or not delimited:
        parsed = parse(gold if delimited else f"${gold}$", extraction_config=latex, parsing_timeout=None)
        if not parsed and gold_format == "auto":
            parsed = parse(gold, extraction_config=expr, parsing_timeout=None)
        return parsed
    return parse(gold, extraction_config=latex + expr, parsing_timeout=None)
