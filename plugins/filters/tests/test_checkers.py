import re

import pytest

from star_engine import Registry, UserError, Verdict
from star_filters import plugin
from star_filters.checkers import ExactChecker, LowerExactChecker, MCLetterChecker, NumericChecker, RegexChecker


def bad_option(name, options, option, key="task.checker"):
    """The error building checker ``name`` with ``options`` raises, by the registry's path (its
    declared options checked first); it names ``option`` right after the checker's key."""
    registry = Registry(autoload=False)
    registry.add(plugin)
    with pytest.raises(UserError) as e:
        registry.create("checker", name, options, key)
    assert re.match(rf"{re.escape(key)}(\.|: ){option}(:|\[| )", str(e.value)), str(e.value)
    assert e.value.key in (f"{key}.{option}", key)
    return e.value

# ----------------------------------------------------------------------------- exact


def test_exact_defaults_strip_and_case_sensitive():
    c = ExactChecker()
    assert c.check("", " 42 \n", "42") == Verdict("42", True)
    assert c.check("", "Paris", "paris") == Verdict("Paris", False)
    assert c.check("", "a  b", "a b") == Verdict("a  b", False)
    assert c.check("gen", None, "42") == Verdict(None, False)


def test_exact_options():
    assert ExactChecker(case_sensitive=False).check("", "PARIS", "paris") == Verdict("PARIS", True)
    assert ExactChecker(collapse_spaces=True).check("", " a \t b\n", "a b") == Verdict("a b", True)
    no_strip = ExactChecker(strip=False)
    assert no_strip.check("", " 42", "42") == Verdict(" 42", False)
    assert no_strip.check("", " 42", " 42") == Verdict(" 42", True)
    collapse_only = ExactChecker(strip=False, collapse_spaces=True)
    assert collapse_only.check("", "  a   b ", " a b ") == Verdict(" a b ", True)


def test_exact_empty_extraction_matches_only_empty_gold():
    c = ExactChecker()
    assert c.check("", "  ", "") == Verdict("", True)
    assert c.check("", "", "x") == Verdict("", False)


# ----------------------------------------------------------------------------- exact_lower


def test_exact_lower_is_the_original_comparison():
    c = LowerExactChecker()
    assert c.check("", "E", "e") == Verdict("E", True)          # the CQA letter, compared lower-cased
    assert c.check("", "1,080", "1,080") == Verdict("1,080", True)
    assert c.check("", "1080", "1,080") == Verdict("1080", False)  # no numeric normalisation
    assert c.check("", " 5", "5") == Verdict(" 5", False)        # nor any stripping by default
    assert c.check("", "STRASSE", "straße").correct is False     # str.lower, not casefold ...
    assert ExactChecker(case_sensitive=False).check("", "STRASSE", "straße").correct is True  # ... as exact does
    assert c.check("gen", None, "e") == Verdict(None, False)
    assert LowerExactChecker(strip=True).check("", " 5 ", "5\n") == Verdict(" 5 ", True)
    assert str(bad_option("exact_lower", {"strip": "no"}, "strip")) == \
        "task.checker.strip: expected true or false, got string 'no'"


# ----------------------------------------------------------------------------- mc_letter


@pytest.mark.parametrize("text", [
    "e", "E", "(E)", "(e)", "E)", "e.", " ( e ) ", "answer is blotter (e).",
    "Therefore, the answer is blotter (E).", "The answer is E.", "the answer is: e",
    "answer is (a) no, wait, (e)",
])
def test_mc_letter_normalises_to_e(text):
    assert MCLetterChecker().letter(text) == "e"


@pytest.mark.parametrize("text", [
    "", "blotter", "(f)", "f", "the answer is a blotter", "(see above)", "ee", "(ab)",
])
def test_mc_letter_no_choice(text):
    assert MCLetterChecker().letter(text) is None


def test_mc_letter_uses_extraction():
    c = MCLetterChecker()
    assert c.check("whatever", "E", "e") == Verdict("e", True)
    assert c.check("whatever", "(b)", "B") == Verdict("b", True)
    assert c.check("whatever", "c", "B") == Verdict("c", False)
    # an extraction that names no choice is reported as is, and is wrong
    assert c.check("... (b).", "blotter", "b") == Verdict("blotter", False)
    # gold without an answer (test split) never matches
    assert c.check("", "a", "") == Verdict("a", False)


def test_mc_letter_reads_only_the_extraction():
    """Extraction is the task's: with ``extracted`` None the verdict is wrong, whatever the
    generation says (the CQA task's ``extract`` is where "answer is ... (x)" is read)."""
    c = MCLetterChecker()
    gen = " Blotters absorb ink. Therefore, the answer is blotter (e).\n\nQ: next (a)"
    assert c.check(gen, None, "E") == Verdict(None, False)
    assert c.check(gen, "e", "E") == Verdict("e", True)
    assert c.check("No idea at all.", None, "e") == Verdict(None, False)
    # letters outside the choice set do not count
    assert c.check("It is (f).", "f", "f") == Verdict("f", False)


def test_mc_letter_custom_letters():
    c = MCLetterChecker(letters="ABCD")
    assert c.letters == "abcd"
    assert c.check("", "(D)", "d") == Verdict("d", True)
    assert c.check("", "(e)", "e") == Verdict("(e)", False)


@pytest.mark.parametrize("letters", ["", "ab1", "aab", "a b", "\u00e9", 5, None])
def test_mc_letter_bad_letters(letters):
    bad_option("mc_letter", {"letters": letters}, "letters")


# ----------------------------------------------------------------------------- numeric


@pytest.mark.parametrize("extracted, gold, predicted, correct", [
    ("18", "18", "18", True),
    ("$18", "18", "18", True),
    ("18.00", "18", "18", True),
    ("18.", "18", "18", True),
    ("1,000", "1000", "1000", True),
    ("1000", "1,000", "1000", True),
    ("-5", "-5", "-5", True),
    ("+5", "5", "5", True),
    ("5", "-5", "5", False),
    ("1/2", "0.5", "0.5", True),
    ("50%", "50", "50", True),
    ("18 dollars", "18", "18", True),
    ("17", "18", "17", False),
    ("18.0000001", "18", "18.0000001", True),  # within abs_tol 1e-6
    ("18.00001", "18", "18.00001", False),
    ("eighteen", "18", "eighteen", False),
    (" 18 or 20 ", "18", "18 or 20", False),
    ("18", "", "18", False),  # no gold answer
])
def test_numeric(extracted, gold, predicted, correct):
    assert NumericChecker().check("gen", extracted, gold) == Verdict(predicted, correct)


def test_numeric_none_extraction():
    assert NumericChecker().check("#### 18 is not extracted", None, "18") == Verdict(None, False)


def test_numeric_tolerances():
    assert NumericChecker(abs_tol=0.5).check("", "18.4", "18").correct
    assert not NumericChecker(abs_tol=0.0).check("", "18.0000001", "18").correct
    assert NumericChecker(abs_tol=0, rel_tol=0.01).check("", "1010", "1000").correct
    assert not NumericChecker(abs_tol=0, rel_tol=0.01).check("", "1011", "1000").correct


@pytest.mark.parametrize("option, value", [
    ("abs_tol", -1e-6), ("abs_tol", "1e-6"), ("abs_tol", True), ("abs_tol", float("nan")),
    ("rel_tol", -0.1), ("rel_tol", float("inf")), ("rel_tol", None),
])
def test_numeric_bad_options(option, value):
    bad_option("numeric", {option: value}, option)


# ----------------------------------------------------------------------------- regex


def test_regex_uses_last_match_and_ignores_extracted():
    c = RegexChecker(pattern=r"####\s*(\S+)")
    gen = "step\n#### 17\nmore\n#### 18\n"
    assert c.check(gen, "17", "18") == Verdict("18", True)
    assert c.check("no marker", "18", "18") == Verdict(None, False)


def test_regex_numeric_compare():
    c = RegexChecker(pattern=r"answer is (.+?)\.?$", flags="im", compare="numeric")
    assert c.check("So the Answer is $1,000.", None, "1000") == Verdict("1000", True)
    assert c.check("So the answer is lots.", None, "1000") == Verdict("lots", False)


def test_regex_exact_compare_strips():
    c = RegexChecker(pattern=r"=(.*)$", flags="m")
    assert c.check("x = 42 \ny = 7", None, "7") == Verdict("7", True)
    assert c.check("x = 42", None, "42 ") == Verdict("42", True)


def test_regex_group_zero_and_named():
    assert RegexChecker(pattern=r"\d+", group=0).check("a 1 b 22", None, "22") == Verdict("22", True)
    named = RegexChecker(pattern=r"(?P<ans>[A-E])\)", group="ans")
    assert named.check("(B) then (C)", None, "C") == Verdict("C", True)


def test_regex_skips_matches_without_the_group():
    c = RegexChecker(pattern=r"#### (\d+)|####")
    assert c.check("#### 5\n####", None, "5") == Verdict("5", True)


def test_regex_readme_example():
    c = RegexChecker(pattern=r"answer is \(?([a-e])\)?", flags="i")
    assert c.check("The answer is (B). No, the answer is C.", None, "C") == Verdict("C", True)


def test_regex_flags():
    gen = "ANSWER: 3"
    assert RegexChecker(pattern=r"answer: (\d)").check(gen, None, "3") == Verdict(None, False)
    assert RegexChecker(pattern=r"answer: (\d)", flags="i").check(gen, None, "3").correct
    dotall = RegexChecker(pattern=r"begin(.*)end", flags="s")
    assert dotall.check("begin\nx\nend", None, "\nx\n").predicted == "x"


@pytest.mark.parametrize("options, option", [
    ({"pattern": "(unclosed"}, "pattern"),
    ({"pattern": ""}, "pattern"),
    ({"pattern": 5}, "pattern"),
    ({"pattern": r"\d+"}, "group"),  # no group 1
    ({"pattern": r"(\d+)", "group": 2}, "group"),
    ({"pattern": r"(\d+)", "group": -1}, "group"),
    ({"pattern": r"(\d+)", "group": "ans"}, "group"),
    ({"pattern": r"(\d+)", "group": True}, "group"),
    ({"pattern": r"(\d+)", "group": 1.0}, "group"),
    ({"pattern": r"(\d+)", "flags": "iq"}, "flags"),
    ({"pattern": r"(\d+)", "flags": 2}, "flags"),
    ({"pattern": r"(\d+)", "compare": "fuzzy"}, "compare"),
])
def test_regex_bad_options(options, option):
    bad_option("regex", options, option)


def test_regex_requires_pattern():
    registry = Registry(autoload=False)
    registry.add(plugin)
    with pytest.raises(UserError) as e:
        registry.create("checker", "regex", {}, "evaluation.checkers[0]")
    assert str(e.value) == "evaluation.checkers[0]: checker 'regex' needs option(s) pattern"
    assert e.value.key == "evaluation.checkers[0].pattern"


@pytest.mark.parametrize("factory, option, value", [
    (ExactChecker, "strip", "yes"),
    (ExactChecker, "case_sensitive", 1),
    (ExactChecker, "collapse_spaces", None),
])
def test_exact_bad_options(factory, option, value):
    name = {v: k for k, v in plugin.CHECKERS.items()}[factory]
    assert str(bad_option(name, {option: value}, option)).startswith(f"task.checker.{option}: expected true or false")
