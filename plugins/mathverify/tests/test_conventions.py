r"""``math_verify``'s ``convention``: a table of (gold, generation) rows on which the field's
libraries disagree, with each convention's verdict.

How the verdicts were obtained: the library columns by running math-verify 0.9.0 (with
latex2sympy2_extended 1.11.0) in this process, called exactly as each library's source calls it
(``LIBRARY`` below: the calls of ``star_mathverify.conventions``' sources, written out here from
those files, not from the plugin; ``test_the_table_is_what_each_library_call_gives`` runs them
again, so a math-verify that changes its verdicts fails there, not silently in the plugin's test);
the ``star_engine`` column by running the checker as it was before conventions were named (its
worker's ``Verifier`` at the last commit): ``star_engine`` is that behaviour, unchanged.

Verdict letters, in the order of ``CONVENTIONS``: ``T`` right, ``F`` wrong, ``S`` the gold counts as
unparsed and the library skips the example (TRL's and open-r1's ``None`` reward: ``check_gold``
returns False with ``bad_gold = "skip"``). lm-eval and verl judge an unparsed gold's answers wrong
(``bad_gold = "wrong"``), open-r1 before 2025-04-01 right (its reward 1.0: ``bad_gold = "right"``),
so those columns are ``F``/``T`` there.

Star-engine's golds are bare answers (``1000``, ``\frac{1}{2}``, ``(1,2)``): the libraries that
parse the gold with math-verify's LaTeX extraction alone (verl wraps it in ``\boxed{}`` first, so
not verl) read a bare ``(1,2)`` or ``\frac12`` as nothing; ``open_r1_reversed`` reads every bare
gold as nothing (its LaTeX-only gold parse needs ``$``), so it rewards everything there. The
delimited golds (``$1<x<2$``) show its reversed ``verify``.
"""

from __future__ import annotations

import inspect
import logging

import pytest
from star_testkit import TESTS, TOY_TOML

from star_engine.cli import main
from star_mathverify.checker import MathVerifyChecker
from star_mathverify.conventions import default_seconds

CONVENTIONS = ("star_engine", "lm_eval", "verl", "trl", "open_r1", "open_r1_reversed")
OWN_BAD_GOLD = {"star_engine": "skip", "lm_eval": "wrong", "verl": "wrong", "trl": "skip", "open_r1": "skip",
                "open_r1_reversed": "right"}  # each library's own treatment of an unparsed gold

TABLE = [  # (gold, generation, verdicts in CONVENTIONS' order)
    # plain-text answers: TRL and open-r1 read LaTeX only (no anchor-free extraction)
    ("1000", "The answer is 1,000.", "TTTFFT"),
    ("18", "She makes 9 * 2 = $18 every day.\n#### 18", "TTTFFT"),
    ("25", "The answer is 25%.", "TTTFFT"),
    ("\\frac{1}{2}", "The answer is 1/2", "TTTFFF"),
    ("3", "$x = 3$ so the answer is 3", "TTTFFT"),
    ("72", "She earns $\\$72.00$.", "TTTFFT"),
    # intervals and inequalities: verify is asymmetric; open_r1_reversed swaps its arguments
    ("1<x<2", "$\\boxed{(1,2)}$", "TFTFFT"),
    ("(1,2)", "$\\boxed{1<x<2}$", "FFFSST"),
    ("$1<x<2$", "$\\boxed{(1,2)}$", "TTTTTF"),
    ("$(1,2)$", "$\\boxed{1<x<2}$", "FFFFFT"),
    ("$x \\le 3$", "$\\boxed{(-\\infty, 3]}$", "TTTTTF"),
    ("$(-\\infty, 3]$", "$\\boxed{x \\le 3}$", "FFFFFT"),
    # boxed or not, several boxes, \fbox
    ("5", "\\boxed{5}", "TTTTTT"),
    ("5", "The answer is $5$.", "TTTTTT"),
    ("5", "$\\boxed{3}$ no wait, $\\boxed{5}$", "TTTTTT"),
    ("5", "$\\boxed{5}$ no wait, $\\boxed{3}$", "FFFFFT"),
    ("2", "$\\boxed{2}$ and $x=3$", "TTTTTT"),
    ("5", "\\fbox{5}", "FFFFFT"),
    ("5", "$\\fbox{5}$", "TTTFFT"),
    # percent, thousands separators
    ("50\\%", "$\\boxed{0.5}$", "TFTFFT"),
    ("25", "$\\boxed{25\\%}$", "TTTTTT"),
    ("1000", "$\\boxed{1,000}$", "TTTTTT"),
    ("1000", "$\\boxed{1{,}000}$", "TTTTTT"),
    # gold forms: bare LaTeX, a dollar sign, sets, \text, boxed, a whole solution
    ("\\frac12", "$\\boxed{0.5}$", "TFTSST"),
    ("\\$18", "$\\boxed{18}$", "SFTSST"),
    ("1,2", "$\\boxed{2,1}$", "TFTFFT"),
    ("\\{1,2\\}", "$\\boxed{(1,2)}$", "TFTSST"),
    ("\\text{(A)}", "$\\boxed{A}$", "TFTSST"),
    ("\\boxed{7}", "$\\boxed{7}$", "TTTTTT"),
    ("So $x = \\boxed{\\frac{1}{2}}$.", "$\\boxed{0.5}$", "TTTTTT"),
    ("$\\frac{1}{$ or $5$", "$\\boxed{5}$", "TTFTFF"),  # open-r1 parses the gold's first match only
    # golds nothing (or no expression) is read in; an empty generation
    ("?", "$\\boxed{5}$", "SFFSST"),
    ("five", "$\\boxed{5}$", "FFFSST"),
    ("\\frac{1}{", "$\\boxed{1}$", "SFFSST"),
    ("5", "", "FFFFFT"),
]
IDS = [f"{i}:{g}|{t[:30]}" for i, (g, t, _) in enumerate(TABLE)]


def library_calls():
    """Each library's call, in this process, as its source writes it (``conventions``' docstring
    names the files and commits); a verdict ``True``/``False``, or ``"S"`` for a skipped example."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.metric import math_metric

    def lm_eval(gold, text):  # minerva_math/utils.py::process_results
        return bool(verify(gold=parse(gold), target=parse(text)))

    def verl(gold, text):  # reward_score/math_verify.py::compute_score
        verify_func = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                                  pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
        try:
            score, _ = verify_func(["\\boxed{" + gold + "}"], [text])
        except Exception:  # noqa: BLE001 -- as verl: an empty gold parse raises ValueError, score 0
            score = 0.0
        return score == 1.0

    def trl(gold, text):  # trl/rewards/accuracy_rewards.py::accuracy_reward (main thread)
        gold_parsed = parse(gold, parsing_timeout=10)
        if len(gold_parsed) == 0:
            return "S"
        answer = parse(text, extraction_config=[LatexExtractionConfig(
            normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
            try_extract_without_anchor=False)], extraction_mode="first_match", parsing_timeout=10)
        return bool(verify(gold_parsed, answer, timeout_seconds=5))

    r1_norm = NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True, equations=True,
                                  boxed="all", units=True)
    r1_answer = [LatexExtractionConfig(normalization_config=r1_norm, boxed_match_priority=0,
                                       try_extract_without_anchor=False)]

    def open_r1(gold, text):  # src/open_r1/rewards.py::accuracy_reward at c1e11922
        gold_parsed = parse(gold, extraction_mode="first_match")
        if len(gold_parsed) == 0:
            return "S"
        return bool(verify(gold_parsed, parse(text, extraction_config=r1_answer, extraction_mode="first_match")))

    def open_r1_reversed(gold, text):  # the same function at 9915e06
        gold_parsed = parse(gold, extraction_mode="first_match", extraction_config=[LatexExtractionConfig()])
        if len(gold_parsed) == 0:
            return True  # "we reward 1 to skip this example"
        return bool(verify(parse(text, extraction_config=r1_answer, extraction_mode="first_match"), gold_parsed))

    return {"lm_eval": lm_eval, "verl": verl, "trl": trl, "open_r1": open_r1, "open_r1_reversed": open_r1_reversed}


def letter(verdict) -> str:
    return {True: "T", False: "F", "S": "S"}[verdict]


@pytest.fixture(scope="module")
def checkers():
    made = {c: MathVerifyChecker(convention=c, bad_gold=OWN_BAD_GOLD[c], timeout_seconds=60.0) for c in CONVENTIONS}
    yield made
    for c in made.values():
        c.close()


def test_the_table_tells_every_convention_from_every_other():
    for i, a in enumerate(CONVENTIONS):
        for j in range(i + 1, len(CONVENTIONS)):
            assert any(v[i] != v[j] for _, _, v in TABLE), (a, CONVENTIONS[j])
    assert all(len(v) == len(CONVENTIONS) and set(v) <= set("TFS") for _, _, v in TABLE)


@pytest.mark.parametrize("gold,text,verdicts", TABLE, ids=IDS)
def test_the_table_is_what_each_library_call_gives(gold, text, verdicts):
    logging.disable(logging.CRITICAL)  # math-verify's warnings on unparsed input
    try:
        calls = library_calls()
        for i, name in enumerate(CONVENTIONS[1:], start=1):
            assert letter(calls[name](gold, text)) == verdicts[i], name
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("gold,text,verdicts", TABLE, ids=IDS)
def test_each_convention_gives_its_librarys_verdict(checkers, convention, gold, text, verdicts):
    checker = checkers[convention]
    want = verdicts[CONVENTIONS.index(convention)]
    kept = checker.check_gold(gold)
    assert kept is (want != "S")
    if kept:
        v = checker.check(text, None, gold)
        assert v.correct is (want == "T") and not v.timed_out


def effective(function, *args, **kwargs) -> dict:
    """A call's arguments with the function's defaults filled in (two calls that differ only in
    spelling a default out compare equal)."""
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def test_each_convention_calls_parse_and_verify_with_its_librarys_arguments(monkeypatch):
    """The worker's calls, recorded, against each library's call as its source writes it (with
    the timeouts a main thread gets): configs, extraction mode, timeouts, argument order."""
    import math_verify
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    from star_mathverify.conventions import build

    real_parse, real_verify = math_verify.parse, math_verify.verify
    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(math_verify, "parse", lambda *a, **k: calls.append(("parse", effective(real_parse, *a, **k)))
                        or [a[0]])
    monkeypatch.setattr(math_verify, "verify", lambda *a, **k: calls.append(("verify", effective(real_verify, *a, **k)))
                        or True)
    r1 = LatexExtractionConfig(normalization_config=NormalizationConfig(
        nits=False, malformed_operators=False, basic_latex=True, equations=True, boxed="all", units=True),
        boxed_match_priority=0, try_extract_without_anchor=False)
    trl = LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
                                try_extract_without_anchor=False)
    latex, expr = LatexExtractionConfig(), ExprExtractionConfig()
    p, v = real_parse, real_verify
    want = {
        "lm_eval": [effective(p, "G"), effective(p, "A"), effective(v, gold=["G"], target=["A"])],
        "verl": [effective(p, "\\boxed{G}", (latex,)), effective(p, "A", (expr, latex)), effective(v, ["\\boxed{G}"], ["A"], 6)],
        "trl": [effective(p, "G", parsing_timeout=10),
                effective(p, "A", extraction_config=[trl], extraction_mode="first_match", parsing_timeout=10),
                effective(v, ["G"], ["A"], timeout_seconds=5)],
        "open_r1": [effective(p, "G", extraction_mode="first_match"),
                    effective(p, "A", extraction_config=[r1], extraction_mode="first_match"),
                    effective(v, ["G"], ["A"])],
        "open_r1_reversed": [effective(p, "G", extraction_mode="first_match", extraction_config=[latex]),
                             effective(p, "A", extraction_config=[r1], extraction_mode="first_match"),
                             effective(v, ["A"], ["G"])],
        "star_engine": [effective(p, "$G$", extraction_config=[latex], parsing_timeout=None),
                        effective(p, "A", extraction_config=[latex, expr], parsing_timeout=None),
                        effective(v, ["$G$"], ["A"], timeout_seconds=None)],
    }
    for name, expected in want.items():
        calls.clear()
        call = build({"convention": name, "gold_format": "auto", "float_rounding": 6, "numeric_precision": 15,
                      "strict": True, "allow_set_relation_comp": False})
        gold, answer = call.parse_gold("G"), call.parse_answer("A")
        assert call.verify(gold, answer) is True
        got = [kw for _, kw in calls]
        for key in ("extraction_config",):  # a tuple and a list of the same configs are the same call
            for g in got + expected:
                if key in g:
                    g[key] = list(g[key])
        assert got == expected, name


def test_an_unparsed_gold_follows_bad_gold():
    """``?`` is read as nothing by TRL: refused by default, skipped, or every answer wrong or right."""
    from star_engine.errors import UserError

    made = [MathVerifyChecker(convention="trl", bad_gold=b, timeout_seconds=60.0)
            for b in ("refuse", "skip", "wrong", "right")]
    try:
        with pytest.raises(UserError, match=r"gold answer '\?' does not parse: math-verify finds no answer"):
            made[0].check_gold("?")
        assert made[1].check_gold("?") is False
        assert made[2].check_gold("?") and made[2].check("$\\boxed{5}$", None, "?").correct is False
        assert made[3].check_gold("?") and made[3].check("no answer", None, "?").correct is True
        assert made[3].check("$\\boxed{5}$", None, "5").correct  # a parsed gold is judged as ever
        assert not made[3].check("$\\boxed{4}$", None, "5").correct
    finally:
        for c in made:
            c.close()


def test_the_default_bound_lets_the_librarys_own_timeouts_decide():
    assert default_seconds("star_engine") == (5.0, 5.0)
    assert default_seconds("trl") == (11.0, 26.0)  # parse 10 s (gold, answer), verify 5 s, + 1 s
    assert default_seconds("lm_eval") == default_seconds("verl") == default_seconds("open_r1") == (6.0, 16.0)
    c = MathVerifyChecker(convention="trl")
    assert c.bounds() == (11.0, 26.0)
    c.timeout_seconds = 2.0
    assert c.bounds() == (2.0, 2.0)
    c.close()


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,star_mathverify.plugin")
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("SCRIPTED_KILL", raising=False)


@pytest.mark.parametrize("checker, message", [
    ('{ name = "math_verify", convention = "trll" }',
     "task.checker.convention: must be one of star_engine, lm_eval, verl, trl, open_r1, open_r1_reversed, "
     "got 'trll'"),
    ('{ name = "math_verify", convention = "trl", gold_format = "latex" }',
     'task.checker.gold_format: applies only with convention = "star_engine"; convention = "trl" reads gold '
     "answers as its library does"),
    ('{ name = "math_verify", bad_gold = "ignore" }',
     "task.checker.bad_gold: must be one of refuse, skip, wrong, right, got 'ignore'"),
])
def test_a_bad_convention_is_one_line_naming_its_key(plugins, tmp_path, capsys, checker, message):
    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()).replace(
        'dataset = "toy"', f'dataset = "toy"\nchecker = {checker}'))
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and message in err, err
    assert not (tmp_path / "run").exists()
