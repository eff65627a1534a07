import pytest

from star_engine import Candidate, Registry, UserError
from star_filters import plugin
from star_filters.filters import DedupFilter, HintLeakFilter, LengthCapFilter


def bad_option(name, option, value):
    """The error building filter ``name`` with ``{option: value}`` by the registry's path (its
    declared options checked first): one line that starts with the option's key."""
    registry = Registry(autoload=False)
    registry.add(plugin)
    with pytest.raises(UserError) as e:
        registry.create("filter", name, {option: value}, "task.filters[0]")
    assert str(e.value).startswith(f"task.filters[0].{option}: "), str(e.value)
    assert e.value.key == f"task.filters[0].{option}" and "\n" not in str(e.value)
    return e.value


def cand(rationale, qid="q1", leak=(), iteration=1, sample=0):
    return Candidate(question_id=qid, iteration=iteration, sample=sample, prompt="Q: ?\nA:",
                     rationale=rationale, predicted="e", gold="e", correct=True,
                     was_hinted=bool(leak), leak_strings=tuple(leak))


# ----------------------------------------------------------------------------- hint_leak


def test_hint_leak_rejects_leaks_case_insensitively():
    f = HintLeakFilter()
    batch = [
        cand(" Blotters absorb ink. So the answer is blotter (e).", leak=["(CORRECT)"]),
        cand(" The (correct) answer is blotter (e).", leak=["(CORRECT)"]),
        cand(" blotter (CORRECT) is marked. So (e).", leak=["(CORRECT)"]),
        cand(" No leak strings at all (CORRECT).", leak=[]),
    ]
    assert f.keep(batch, []) == [True, False, False, True]


def test_hint_leak_case_sensitive():
    f = HintLeakFilter(case_sensitive=True)
    batch = [cand("The (correct) answer (e).", leak=["(CORRECT)"]),
             cand("blotter (CORRECT)", leak=["(CORRECT)"])]
    assert f.keep(batch, []) == [True, False]


def test_hint_leak_any_of_several_and_stripped_and_blank():
    f = HintLeakFilter()
    leaks = ["(CORRECT)", " (18)\nA:", "   ", ""]
    batch = [
        cand("Natalia sold 18 clips.\n#### 18", leak=leaks),
        cand("As given (18)\nA: she sold 18.\n#### 18", leak=leaks),
        cand("Ends with (18)\nA:", leak=leaks),
    ]
    assert f.keep(batch, []) == [True, False, False]


def test_hint_leak_is_per_candidate():
    f = HintLeakFilter()
    batch = [cand("x (e) answer", leak=["answer"]), cand("x (e) answer", leak=["(a)"])]
    assert f.keep(batch, []) == [False, True]


def test_hint_leak_bad_option():
    assert str(bad_option("hint_leak", "case_sensitive", "no")) == \
        "task.filters[0].case_sensitive: expected true or false, got string 'no'"


# ----------------------------------------------------------------------------- dedup


def test_dedup_within_batch_per_question():
    f = DedupFilter()
    batch = [cand("A b."), cand("A  b.\n"), cand("A b.", qid="q2"), cand("a b."), cand("A b.")]
    assert f.keep(batch, []) == [True, False, True, True, False]


def test_dedup_against_history():
    f = DedupFilter(across_iterations=True)
    history = [cand("Old one.", iteration=1), cand("Other q.", qid="q2", iteration=1)]
    batch = [cand("Old  one.", iteration=2), cand("Other q.", iteration=2), cand("New.", iteration=2)]
    assert f.keep(batch, history) == [False, True, True]


def test_dedup_ignores_history_by_default():
    """With restart_from_base each iteration's set must be complete, repeats included."""
    history = [cand("Old one.", iteration=1)]
    batch = [cand("Old one.", iteration=2), cand("Old one.", iteration=2)]
    assert DedupFilter().keep(batch, history) == [True, False]


def test_dedup_global_scope():
    f = DedupFilter(scope="global", across_iterations=True)
    history = [cand("Shared.", qid="q9")]
    batch = [cand("Shared."), cand("Fresh.", qid="q2"), cand("Fresh.", qid="q3")]
    assert f.keep(batch, history) == [False, True, False]


def test_dedup_without_whitespace_normalisation():
    f = DedupFilter(normalize_whitespace=False)
    batch = [cand("A b."), cand("A  b."), cand("A b. "), cand("A b.")]
    assert f.keep(batch, []) == [True, True, True, False]


def test_dedup_is_deterministic_and_stateless():
    f = DedupFilter()
    batch = [cand("x"), cand("x"), cand("y")]
    assert f.keep(batch, []) == f.keep(batch, []) == [True, False, True]


@pytest.mark.parametrize("option, value", [("scope", "batch"), ("scope", None),
                                           ("normalize_whitespace", "true")])
def test_dedup_bad_options(option, value):
    bad_option("dedup", option, value)


# ----------------------------------------------------------------------------- length_cap


def test_length_cap_chars_default():
    f = LengthCapFilter()
    batch = [cand("x" * 2000), cand("x" * 2001), cand("")]
    assert f.keep(batch, []) == [True, False, True]


def test_length_cap_lines():
    f = LengthCapFilter(max_chars=0, max_lines=2)
    batch = [cand("a\nb"), cand("a\nb\n"), cand("a\nb\nc"), cand("y" * 10_000)]
    assert f.keep(batch, []) == [True, True, False, True]


def test_length_cap_both_limits():
    f = LengthCapFilter(max_chars=10, max_lines=1)
    batch = [cand("short"), cand("a\nb"), cand("eleven chrs")]
    assert f.keep(batch, []) == [True, False, False]


@pytest.mark.parametrize("option, value", [("max_chars", -1), ("max_chars", 10.5),
                                           ("max_lines", -2), ("max_lines", True),
                                           ("max_chars", "2000")])
def test_length_cap_bad_options(option, value):
    bad_option("length_cap", option, value)


def test_length_cap_unknown_option_suggests_the_right_one():
    registry = Registry(autoload=False)
    registry.add(plugin)
    with pytest.raises(UserError) as e:
        registry.create("filter", "length_cap", {"max_char": 10}, "task.filters[1]")
    assert str(e.value) == ("task.filters[1].max_char: unknown option for filter 'length_cap'; accepted: "
                            "max_chars, max_lines (did you mean 'max_chars'?)")
