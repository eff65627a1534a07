"""The group filter on its own (Reinforce-Rej's prompt filter): both halves, each alone,
``min_samples``, the all-wrong questions declined before rationalization or rationalized and
dropped, its options checked where the core checks them."""

from __future__ import annotations

import pytest

from star_engine import Candidate, UserError
from star_engine.capabilities import DeclinesQuestions, SeesRejected
from star_engine.config.registry import check_options
from star_successors.group import GroupFilter


def cand(q: str, s: int, correct: bool, hinted: bool = False) -> Candidate:
    return Candidate(q, 1, s, "Q", f"r{q}{s}{hinted}", "1", "1", correct, hinted)


RIGHT = [cand("right", s, True) for s in range(3)]  # all right
MIXED = [cand("mixed", 0, True), cand("mixed", 1, False), cand("mixed", 2, True)]
WRONG = [cand("wrong", s, False) for s in range(3)]  # all wrong
RATIONALIZED = [cand("wrong", 0, True, hinted=True), cand("wrong", 1, True, hinted=True)]
GENERATED = RIGHT + MIXED + WRONG


def selection(flt: GroupFilter, hinted: list[Candidate] = ()) -> dict[tuple[str, int, bool], bool]:
    """What ``flt`` keeps of the right samples (and ``hinted``), shown the wrong ones as others
    (as ``Stages.select`` calls it): (question, sample, hinted) -> kept."""
    candidates = [c for c in GENERATED if c.correct] + list(hinted)
    others = [c for c in GENERATED if not c.correct]
    flags = flt.keep_among(candidates, others, [])
    assert len(flags) == len(candidates)
    return {(c.question_id, c.sample, c.was_hinted): ok for c, ok in zip(candidates, flags)}


def test_the_filter_has_both_capabilities():
    assert isinstance(GroupFilter(), SeesRejected) and isinstance(GroupFilter(), DeclinesQuestions)


def test_by_default_both_halves_go_and_the_all_wrong_ones_before_rationalization():
    flt = GroupFilter()
    assert flt.drop == {"all_wrong", "all_right"} and flt.min_samples == 2 and not flt.rationalize_all_wrong
    assert flt.decline(GENERATED, []) == ["wrong"]
    kept = selection(flt)
    assert not any(ok for (q, _, _), ok in kept.items() if q == "right")
    assert all(ok for (q, _, _), ok in kept.items() if q == "mixed")
    # a rationalized sample of an all-wrong question (had it been rationalized) goes too
    assert not any(ok for (q, _, h), ok in selection(flt, RATIONALIZED).items() if h)


def test_the_all_right_half_alone_leaves_stars_rationalization_alone():
    flt = GroupFilter(drop=["all_right"])
    assert flt.decline(GENERATED, []) == []
    kept = selection(flt, RATIONALIZED)
    assert not any(ok for (q, _, _), ok in kept.items() if q == "right")
    assert all(ok for (q, _, h), ok in kept.items() if q != "right")  # the rationalized ones are trained on


def test_the_all_wrong_half_alone_keeps_the_all_right_questions():
    flt = GroupFilter(drop=["all_wrong"])
    assert flt.decline(GENERATED, []) == ["wrong"]
    kept = selection(flt, RATIONALIZED)
    assert all(ok for (q, _, _), ok in kept.items() if q in ("right", "mixed"))
    assert not any(ok for (q, _, _), ok in kept.items() if q == "wrong")


def test_rationalize_all_wrong_declines_nothing_and_drops_the_rationalizations_at_selection():
    flt = GroupFilter(rationalize_all_wrong=True)
    assert flt.decline(GENERATED, []) == []
    kept = selection(flt, RATIONALIZED)
    assert not any(ok for (q, _, _), ok in kept.items() if q in ("right", "wrong"))
    assert all(ok for (q, _, _), ok in kept.items() if q == "mixed")


def test_groups_are_judged_on_hint_free_samples_and_min_samples_of_them():
    # two right hint-free samples and a wrong rationalization: all right (the hinted one is not of the group)
    two = [cand("q", 0, True), cand("q", 1, True)]
    assert GroupFilter().keep_among(two, [cand("q", 0, False, hinted=True)], []) == [False, False]
    assert GroupFilter(min_samples=3).keep_among(two, [], []) == [True, True]
    # one sample a question: the released code keeps such a group (its deviation is set to 1)
    assert GroupFilter().keep_among([cand("d", 0, True)], [], []) == [True]
    assert GroupFilter().decline([cand("e", 0, False)], []) == []
    assert GroupFilter(min_samples=1).keep_among([cand("d", 0, True)], [], []) == [False]
    assert GroupFilter(min_samples=1).decline([cand("e", 0, False)], []) == ["e"]
    # hinted samples never make a group all wrong
    assert GroupFilter().decline([cand("f", 0, False, hinted=True), cand("f", 1, False, hinted=True)], []) == []


def test_keep_without_the_others_judges_the_candidates_alone():
    # shown only the right samples, "mixed" looks all right: why the core calls keep_among
    assert GroupFilter().keep([c for c in GENERATED if c.correct], []) == [False] * 5
    assert GroupFilter().keep_among([c for c in GENERATED if c.correct], [MIXED[1]], []) == [False] * 3 + [True] * 2


def test_the_options_are_checked_with_the_toml_key():
    key = "task.filters[1]"
    assert check_options(GroupFilter, {"drop": ["all_right"]}, key, "filter 'group'")["drop"] == ["all_right"]
    with pytest.raises(UserError) as e:
        check_options(GroupFilter, {"drop": ["all_rigth"]}, key, "filter 'group'")
    assert str(e.value).startswith(f"{key}.drop[0]:") and "all_wrong, all_right" in str(e.value)
    with pytest.raises(UserError) as e:
        check_options(GroupFilter, {"drop": []}, key, "filter 'group'")
    assert str(e.value).startswith(f"{key}.drop:") and "empty" in str(e.value)
    with pytest.raises(UserError) as e:
        check_options(GroupFilter, {"min_samples": 0}, key, "filter 'group'")
    assert str(e.value).startswith(f"{key}.min_samples:")
    with pytest.raises(UserError, match="^rationalize_all_wrong: has no effect without \"all_wrong\""):
        GroupFilter(drop=["all_right"], rationalize_all_wrong=True)
