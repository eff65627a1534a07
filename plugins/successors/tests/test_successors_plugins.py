"""The successors' plugins on their own: the random-reward coin, B-STaR's balance score and
tuner, the group filter."""

from __future__ import annotations

from star_engine import Candidate, CheckContext, Example, ProbeSample
from star_successors.balance import BalanceTuner, share_score
from star_successors.group import GroupFilter
from star_successors.random_reward import RandomReward


def ctx(q: str, s: int = 0, it: int = 1, stage: str = "generate", seed: int = 0) -> CheckContext:
    return CheckContext(seed, it, q, s, stage, "train")


def test_random_reward_is_a_seeded_coin_of_the_sample_not_of_the_answer():
    rr = RandomReward(p=0.3)
    verdicts = [rr.check_in(ctx(f"q{i}", s), "text", "5", "5").correct for i in range(400) for s in range(5)]
    assert 0.25 < sum(verdicts) / len(verdicts) < 0.35  # right with probability p, whatever the answer
    again = [RandomReward(p=0.3).check_in(ctx(f"q{i}", s), "other text", None, "7").correct
             for i in range(400) for s in range(5)]
    assert again == verdicts  # the same (iteration, question, sample): the same coin, whatever was written
    other = [rr.check_in(ctx(f"q{i}", s, it=2), "text", "5", "5").correct for i in range(400) for s in range(5)]
    assert other != verdicts  # another iteration draws again
    assert [RandomReward(p=0.3, seed=1).check_in(ctx(f"q{i}", s), "t", "5", "5").correct
            for i in range(400) for s in range(5)] != verdicts
    assert not any(RandomReward(p=0.0).check_in(ctx(f"q{i}"), "t", "5", "5").correct for i in range(100))
    assert all(RandomReward(p=1.0).check_in(ctx(f"q{i}"), "t", "5", "6").correct for i in range(100))
    v = rr.check_in(ctx("q1"), "The answer is 5.", "5", "7")
    assert v.predicted == "5"  # what the answer says is recorded as it is


def probe_sample(q: str, s: int, text: str, correct: bool) -> ProbeSample:
    return ProbeSample(q, s, text, text.split()[-1] if text else None, correct)


def test_the_share_score_the_tuner_gave_before():
    def answers(*pairs):
        return [probe_sample("q", i, t, c) for i, (t, c) in enumerate(pairs)]

    assert share_score(answers(("a", False), ("b", False)), 8) == 0.0
    # 4 distinct right of 4 right: min(4/8, 1) * 4/4
    assert share_score(answers(("a", True), ("b", True), ("c", True), ("d", True), ("x", False)), 8) == 0.5
    # 2 distinct among 4 right: min(2/8, 1) * 2/4
    assert share_score(answers(("a", True), ("a", True), ("b", True), ("b", True)), 8) == 0.125
    # at the target, only repeats lower it
    assert share_score(answers(*[(str(i), True) for i in range(10)]), 8) == 1.0
    assert share_score(answers(("a", True), ("a", True)), 2, distinct=False) == 1.0


def test_balance_tuner_picks_the_best_score_and_records_every_candidate():
    qs = [Example(f"q{i}", "Q", "1") for i in range(10)]
    calls = []

    def probe(t, ids, samples):
        calls.append((t, list(ids), samples))
        # low temperatures repeat one right answer; high ones are mostly wrong
        def one(q, s):
            if t < 0.6:
                return probe_sample(q, s, "same 1", True)
            return probe_sample(q, s, f"v{s} 1", s % 2 == 0 if t < 0.9 else s == 0)
        return [[one(q, s) for s in range(samples)] for q in ids]

    choice = BalanceTuner(temperatures=[0.3, 0.7, 1.0], questions=4, samples=8, target=8, score="share").tune(2, qs, probe, 5)
    assert choice.temperature == 0.7
    assert [c["temperature"] for c in choice.candidates] == [0.3, 0.7, 1.0]
    scores = {c["temperature"]: c["score"] for c in choice.candidates}
    assert scores == {0.3: 1 / 64, 0.7: 0.5, 1.0: 1 / 8}  # 1 distinct of 8 right; 4 of 4; 1 of 1
    assert all(len(ids) == 4 and samples == 8 for _, ids, samples in calls)
    assert len({tuple(ids) for _, ids, _ in calls}) == 1  # one subset for every temperature
    again = BalanceTuner(temperatures=[0.3, 0.7, 1.0], questions=4, samples=8, target=8, score="share").tune(2, qs, probe, 5)
    assert again == choice  # deterministic
    # equal scores: the temperature listed first
    for grid in ([1.0, 0.95], [0.95, 1.0]):
        assert BalanceTuner(temperatures=grid, questions=4, samples=8, target=8, score="share").tune(2, qs, probe, 5).temperature \
            == grid[0]


def cand(q: str, s: int, correct: bool, hinted: bool = False) -> Candidate:
    return Candidate(q, 1, s, "Q", f"r{s}", "1", "1", correct, hinted)


def test_group_filter_drops_the_questions_whose_samples_were_all_right():
    all_right = [cand("a", s, True) for s in range(3)]
    mixed = [cand("b", 0, True), cand("b", 1, True)]
    mixed_wrong = [cand("b", 2, False)]
    hinted = [cand("c", 0, True, hinted=True)]  # a rationalized answer: its question was all wrong
    c_wrong = [cand("c", s, False) for s in range(3)]
    flt = GroupFilter(drop=["all_right"])  # the all-wrong half: plugins/successors/tests/test_group.py
    flags = flt.keep_among(all_right + mixed + hinted, mixed_wrong + c_wrong, [])
    assert flags == [False, False, False, True, True, True]
    # one sample per question: left alone (every right one would go)
    assert GroupFilter().keep_among([cand("d", 0, True)], [], []) == [True]
    assert GroupFilter(min_samples=1).keep_among([cand("d", 0, True)], [], []) == [False]
