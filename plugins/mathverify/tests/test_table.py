"""``math_verify`` on a table of answer pairs written here, each with the verdict math-verify 0.9.0
itself gives (every row was run against the real library; a row whose verdict is not what a
reader might expect says so in its note).

Each row: (gold answer as a data set states it, the model's text, right?, note). The checker is
the default ``convention = "star_engine"`` and reads the whole text (``read = "generation"``) with
math-verify's default extraction, as lm-evaluation-harness's ``minerva_math`` does: the last
``\\boxed{}``, else an "answer is", else the last expression (``test_conventions.py``: where
the libraries' calls disagree).
"""

from __future__ import annotations

import pytest

from star_mathverify.checker import MathVerifyChecker

T = True
F = False
B = "$\\boxed{%s}$"  # a boxed answer

TABLE = [
    # fractions, \frac against decimals, \dfrac / \tfrac
    ("\\frac{1}{2}", B % "\\frac{1}{2}", T, ""),
    ("\\frac{1}{2}", B % "\\frac12", T, "\\frac12 without braces"),
    ("\\frac{1}{2}", "The answer is $\\boxed{0.5}$.", T, "decimal for a fraction"),
    ("\\frac{1}{2}", B % "1/2", T, ""),
    ("\\frac{1}{2}", B % "\\dfrac{1}{2}", T, ""),
    ("\\frac{1}{2}", B % "\\tfrac{1}{2}", T, ""),
    ("\\frac{1}{2}", B % "\\frac{2}{4}", T, "unreduced"),
    ("\\frac{1}{2}", B % "0.51", F, ""),
    ("\\frac{1}{3}", B % "0.333333", T, "equal after rounding to 6 places (float_rounding)"),
    ("\\frac{1}{3}", B % "0.33", F, "a rounded decimal is not the fraction"),
    ("\\frac{2}{3}", B % "\\frac{3}{2}", F, ""),
    ("\\dfrac{3}{4}", B % "0.75", T, "\\dfrac gold"),
    ("0.75", B % "\\frac{3}{4}", T, ""),
    ("-\\frac{1}{2}", B % "-0.5", T, ""),
    ("-\\frac{1}{2}", B % "\\frac{-1}{2}", T, ""),
    ("\\frac{\\sqrt{3}}{2}", B % "\\frac{1}{2}\\sqrt{3}", T, "symbolic equality"),
    ("\\frac{\\sqrt{3}}{2}", B % "0.866025", T, "surprising: a 6-place decimal of an irrational gold is right"),
    ("\\sqrt{2}", B % "\\frac{2}{\\sqrt{2}}", T, ""),
    ("\\pi", B % "3.14", F, ""),
    # percentages
    ("50\\%", B % "50\\%", T, ""),
    ("50\\%", B % "0.5", T, "a percent gold accepts the fraction"),
    ("50\\%", B % "50", T, "surprising: ... and the bare number too"),
    ("10\\%", "The answer is $10\\%$.", T, ""),
    ("0.1", B % "10\\%", T, ""),
    ("25", "The answer is 25%.", T, "a plain-text percent sign is dropped"),
    # units
    ("5", B % "5 \\text{ cm}", T, "a \\text{} unit is dropped"),
    ("5", B % "5\\,\\mathrm{cm}", T, "a \\mathrm{} unit too"),
    ("5\\text{ cm}", B % "5", T, "and from the gold"),
    ("90^\\circ", B % "90", T, "degrees"),
    ("90", B % "90^{\\circ}", T, ""),
    ("72", "She earns $\\$72.00$ a day, so the answer is $\\boxed{\\$72}$.", T, "currency"),
    ("18", "She makes 9 * 2 = $18 every day.\n#### 18", T, "GSM8K's format: the last number"),
    # thousands separators
    ("1000", B % "1,000", T, ""),
    ("1000", "The answer is 1,000.", T, ""),
    ("1080", "#### 1,080", T, ""),
    ("1000000", B % "1{,}000{,}000", T, "LaTeX's {,} separator"),
    ("1000", B % "1\\,000", F, "surprising: a thin-space separator is not read as one"),
    ("1.5", B % "1,5", F, "a decimal comma is not a decimal point"),
    # intervals
    ("[1,2)", B % "[1,2)", T, ""),
    ("[1,2)", B % "[1,2]", F, "closed is not half-open"),
    ("(1,2)", B % "(1,2)", T, ""),
    ("(-\\infty, 3]", B % "(-\\infty,3]", T, ""),
    ("(-\\infty, 3]", B % "x \\le 3", F, "an inequality for an interval gold is wrong"),
    ("1<x<2", B % "(1,2)", T, "gold 1<x<2 accepts the interval ..."),
    ("(1,2)", B % "1<x<2", F, "... not the reverse (verify is asymmetric)"),
    ("[0,1]\\cup[2,3]", B % "[2,3]\\cup[0,1]", T, "unions in any order"),
    # sets
    ("\\{1,2\\}", B % "\\{2,1\\}", T, ""),
    ("\\{1,2\\}", B % "\\{1,2,3\\}", F, ""),
    ("\\{1,2\\}", B % "1,2", T, "a bare list for a set"),
    ("1,2", B % "2, 1", T, "lists compare as sets"),
    ("\\{1,2\\}", B % "(1,2)", T, "surprising: a tuple is accepted for a set, even with strict = true"),
    ("(3,4)", B % "(3, 4)", T, ""),
    ("(3,4)", B % "(4, 3)", F, "but a point's order counts"),
    # matrices
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", B % "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", T, ""),
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", B % "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", T, "bmatrix"),
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", B % "\\begin{pmatrix}1&3\\\\2&4\\end{pmatrix}", F, "transposed"),
    ("\\begin{pmatrix}0.5\\\\1\\end{pmatrix}", B % "\\begin{pmatrix}\\frac{1}{2}\\\\1\\end{pmatrix}", T, ""),
    # \text{}
    ("\\text{(A)}", B % "\\text{(A)}", T, ""),
    ("\\text{(A)}", B % "A", T, "a choice letter with or without \\text{()}"),
    ("\\text{Monday}", B % "\\text{Monday}", T, ""),
    ("\\text{Monday}", B % "\\text{Tuesday}", F, ""),
    ("\\text{even}", "The answer is $\\boxed{\\text{even}}$.", T, ""),
    # expressions and equations
    ("x+1", B % "1+x", T, ""),
    ("2x+2", B % "2(x+1)", T, ""),
    ("x^2-1", B % "(x-1)(x+1)", T, ""),
    ("5", B % "x = 5", T, "an assignment's value"),
    ("x=5", B % "5", T, ""),
    ("y=2x+1", B % "y = 1 + 2x", T, ""),
    ("3", B % "3.0", T, ""),
    ("3", B % "3.000001", F, "past the 6 places of float_rounding"),
    ("2, -2", B % "-2, 2", T, ""),
    ("\\pm 2", B % "2, -2", T, "\\pm expands to both roots"),
    ("1+2i", B % "2i+1", T, "complex numbers"),
    ("18", "no answer here", F, "nothing to parse: wrong"),
    ("18", "", F, ""),
]


@pytest.fixture(scope="module")
def checker():
    c = MathVerifyChecker(timeout_seconds=30.0)  # generous: a cold worker on a busy machine
    yield c
    c.close()


def test_the_table_is_large_and_covers_every_kind():
    assert len(TABLE) >= 40
    text = " ".join(g + p for g, p, _, _ in TABLE)
    for needle in ("\\frac", "\\dfrac", "\\%", "\\text{ cm}", "1,000", "[1,2)", "\\{1,2\\}", "pmatrix", "\\text{"):
        assert needle in text, needle
    assert {v for _, _, v, _ in TABLE} == {True, False}


@pytest.mark.parametrize("gold,text,right,note", TABLE, ids=[f"{i}:{g}|{t}" for i, (g, t, _, _) in enumerate(TABLE)])
def test_table(checker, gold, text, right, note):
    assert checker.check_gold(gold)
    v = checker.check(text, None, gold)
    assert v.correct is right, note
    assert not v.timed_out
    assert (v.predicted is None) == (not text.strip() or text == "no answer here")


def test_extracted_reads_only_the_tasks_extraction(checker):
    c = MathVerifyChecker(read="extracted", timeout_seconds=30.0)
    try:
        gen = "3 + 4 = 7 ... #### 1,080\nQ: next question, 5 apples"
        assert c.check(gen, "1,080", "1080").correct  # the task's extraction
        assert not checker.check(gen, "1,080", "1080").correct  # the whole text ends in 5
        assert c.check(gen, None, "1080").predicted is None and not c.check(gen, None, "1080").correct
    finally:
        c.close()


def test_gold_formats():
    """A bare gold is LaTeX math by default ("abc" is a product of symbols); ``expr`` reads plain
    expressions only (no ``\\frac``)."""
    expr = MathVerifyChecker(gold_format="expr", bad_gold="skip", timeout_seconds=30.0)
    try:
        assert expr.check_gold("1/2") and expr.check("$\\boxed{0.5}$", None, "1/2").correct
        assert not expr.check_gold("\\frac{1}{2}")
    finally:
        expr.close()


def test_each_gold_is_parsed_once_and_the_cache_is_bounded():
    """check_gold parses a gold answer; the samples checked against it later reuse the parse. At
    most ``gold_cache`` are kept (the least recently used dropped): one dropped is parsed again."""
    c = MathVerifyChecker(gold_cache=2, timeout_seconds=30.0)
    try:
        golds = ["\\frac{1}{2}", "0.25", "\\{1,2\\}"]
        for gold in golds[:2]:
            assert c.check_gold(gold)
        for _ in range(5):  # five samples per question
            assert c.check("$\\boxed{0.5}$", None, golds[0]).correct
            assert not c.check("$\\boxed{0.5}$", None, golds[1]).correct
        assert c.worker.request(("stats",), 30.0) == {"gold_parses": 2, "cached": 2}
        assert c.check_gold(golds[2])  # the third: golds[0], used least recently, is dropped
        assert c.worker.request(("stats",), 30.0) == {"gold_parses": 3, "cached": 2}
        assert c.check("$\\boxed{0.5}$", None, golds[0]).correct
        assert c.worker.request(("stats",), 30.0) == {"gold_parses": 4, "cached": 2}
    finally:
        c.close()
