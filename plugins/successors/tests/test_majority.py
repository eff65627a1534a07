"""The majority-vote reward's unit behaviour (TTRL's released ``test_time_train_metrics``): the
pseudo-label, ties, unparsable answers, ``min_agreement``, and what it declares to the core."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from star_engine import CheckContext, Registry, UserError, Verdict
from star_successors.majority import MajorityVote, pseudo_label


def ctx(s: int) -> CheckContext:
    return CheckContext(0, 1, "q", s, "generate", "train")


def judge(answers: list[str | None], **options) -> list[bool]:
    verdicts = MajorityVote(**options).check_group([ctx(s) for s in range(len(answers))], ["text"] * len(answers),
                                                   answers, "")
    assert [v.predicted for v in verdicts] == answers  # each sample's own answer is recorded
    return [v.correct for v in verdicts]


def test_the_majority_answer_is_the_pseudo_label_and_only_its_samples_are_right():
    assert judge(["7", "3", "7", "5"]) == [True, False, True, False]
    assert pseudo_label(["7", "3", "7", "5"]) == ("7", 0.5)


def test_the_gold_answer_is_never_read():
    answers = ["7", "3", "7", "5"]
    group = MajorityVote().check_group([ctx(s) for s in range(4)], ["t"] * 4, answers, "3")
    assert [v.correct for v in group] == [True, False, True, False]  # "3" is the gold: no matter


def test_a_tie_goes_to_the_answer_reached_first_in_sample_order():
    assert judge(["3", "7", "7", "3"]) == [True, False, False, True]
    assert judge(["7", "3", "3", "7"]) == [True, False, False, True]
    assert pseudo_label(["1", "2", "3"]) == ("1", pytest.approx(1 / 3))


def test_an_unparsable_answer_votes_for_nothing_is_wrong_and_counts_in_the_share():
    assert judge([None, None, "4", None]) == [False, False, True, False]
    assert pseudo_label([None, None, "4", None]) == ("4", 0.25)  # the winner's count over all k samples
    assert judge([None, None, None]) == [False, False, False]
    assert pseudo_label([None, None, None]) == (None, 0.0)


def test_answers_are_compared_as_extracted_strings():
    assert judge(["10", "10.0", "10", " 10"]) == [True, False, True, False]


def test_min_agreement_leaves_a_question_below_it_without_a_pseudo_label():
    answers = ["7", "7", "3", "5"]  # share 0.5
    assert judge(answers, min_agreement=0.5) == [True, True, False, False]
    assert judge(answers, min_agreement=0.51) == [False] * 4
    assert judge(["2", "2", "2", "2"], min_agreement=1.0) == [True] * 4
    assert judge([None, "2", "2", None], min_agreement=0.75) == [False] * 4  # 2 of 4: no label


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["1", "2", "3", None]), min_size=1, max_size=9),
       st.floats(0, 1, allow_nan=False))
def test_the_right_samples_all_give_one_answer_held_by_a_share_at_least_min_agreement(answers, least):
    right = judge(answers, min_agreement=least)
    chosen = {a for a, ok in zip(answers, right) if ok}
    assert len(chosen) <= 1 and None not in chosen
    if chosen:
        label = chosen.pop()
        count = answers.count(label)
        assert count / len(answers) >= least
        assert all(answers.count(a) <= count for a in set(answers) if a is not None)
        assert sum(right) == count


def test_judged_alone_a_generation_is_a_group_of_one():
    assert MajorityVote().check("t", "5", "") == Verdict("5", True)
    assert MajorityVote().check("t", None, "") == Verdict(None, False)


def test_it_declares_a_group_checker_that_needs_no_gold_and_three_samples():
    reward = MajorityVote()  # the core's optional Checker attributes (docs/plugins.md)
    assert reward.min_group == 3 and callable(reward.check_group) and reward.label_free is True


@pytest.fixture
def registry(monkeypatch) -> Registry:
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_successors.plugin")
    return Registry(autoload=False)


def test_it_is_registered_as_majority_vote_and_min_agreement_is_a_fraction(registry):
    reward = registry.create("checker", "majority_vote", {"min_agreement": 0.6}, "task.reward")
    assert isinstance(reward, MajorityVote) and reward.min_agreement == 0.6
    with pytest.raises(UserError, match="task.reward.min_agreement"):
        registry.create("checker", "majority_vote", {"min_agreement": 1.5}, "task.reward")
