"""B-STaR's balance tuner as released (hkust-nlp/B-STaR ``train_code/determine_hyper.py``): the
worked cases computed by hand, deduplication, the cap, the threshold sweep on graded scores,
the reference solution, the presets and a misspelt one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from star_engine import Example, ProbeSample, Registry, UserError
from star_successors.balance import (PRESETS, BalanceTuner, Ranked, released_balance, released_thresholds,
                                     share_score)

REPO = Path(__file__).resolve().parents[3]
REF = "REF: 1 + 2 = 3"


def sample(s: int, text: str, correct: bool, score: float | None = None, answer: str | None = "3") -> ProbeSample:
    return ProbeSample("q", s, text, answer, correct, score)


def answers(*pairs: tuple[str, bool]) -> list[ProbeSample]:
    return [sample(i, t, c) for i, (t, c) in enumerate(pairs)]


def balance(group: list[ProbeSample], reference: str | None = REF, **kw) -> dict[str, float]:
    """One question's released score with the "cpu" preset's sizes (114 texts to select: never
    reached by one question, so the cap is 64, above its 9 texts)."""
    opts = {"target": 8, "valid_sample_size": 114, "max_cap": 64, "thresholds": released_thresholds(), **kw}
    return released_balance([Ranked.of("Q", group, reference)], opts["thresholds"], opts["target"],
                            opts["valid_sample_size"], opts["max_cap"])


class Probe:
    """A ReferenceProbe with scripted answers: ``script(t, q, s) -> ProbeSample``."""

    def __init__(self, script, refs: dict[str, str] | None = None, refuse: str = ""):
        self.script, self.refs, self.refuse = script, refs or {}, refuse
        self.calls: list[tuple] = []

    def __call__(self, t, ids, samples):
        self.calls.append(("probe", t, tuple(ids), samples))
        return [[self.script(t, q, s) for s in range(samples)] for q in ids]

    def references(self, ids):
        self.calls.append(("references", tuple(ids)))
        if self.refuse:
            raise UserError(self.refuse)
        return [self.refs.get(q, f"REF {q}") for q in ids]


# -- the four cases that differ from the score before (8 samples, a right/wrong checker) ----------


def test_eight_right_all_identical():
    group = answers(*[("a", True)] * 8)
    # released: the 8 "a" and the reference REF (reward 1.0) all pass every τ < 1; deduplicated:
    # {a, REF}, both right: n' = 2, n = 2 -> min(2/8, 1) * 2/2 = 0.25
    assert balance(group)["score"] == 0.25
    # before: u = 1 distinct right of r = 8 right -> min(1/8, 1) * 1/8 = 1/64 = 0.015625
    assert share_score(group, 8) == 0.015625


def test_eight_right_as_four_distinct_texts_twice():
    group = answers(*[(t, True) for t in "abcd" for _ in range(2)])
    # released: {a, b, c, d, REF}: n' = 5, n = 5 -> min(5/8, 1) * 5/5 = 0.625
    assert balance(group)["score"] == 0.625
    # before: u = 4, r = 8 -> 4/8 * 4/8 = 0.25
    assert share_score(group, 8) == 0.25


def test_two_identical_right_and_six_wrong():
    group = answers(("a", True), ("a", True), *[(f"w{i}", False) for i in range(6)])
    result = balance(group)
    # τ < 0 selects the wrong ones too (reward 0.0 > τ): {a, w0..w5, REF}: n = 8, n' = 2
    #   -> 2 * (2/8) / 8 = 0.0625;
    # 0 <= τ < 1: {a, REF}: n = n' = 2 -> min(2/8, 1) * 1 = 0.25, the best
    assert result["score"] == 0.25
    assert result["threshold"] == next(t for t in released_thresholds() if t >= 0)  # the first τ there
    assert balance(group, thresholds=[-0.5])["score"] == 0.0625
    # before: u = 1, r = 2 -> 1/8 * 1/2 = 0.0625
    assert share_score(group, 8) == 0.0625


def test_no_right_answer():
    group = answers(*[(f"w{i}", False) for i in range(8)])
    # τ < 0: {w0..w7, REF}: n = 9, n' = 1 -> 1 * (1/9) / 8 = 1/72; τ >= 0: {REF} -> 1/8 = 0.125
    assert balance(group)["score"] == 0.125
    assert balance(group, thresholds=[-0.5])["score"] == 1 / 72
    assert share_score(group, 8) == 0.0  # before: none right, 0


def test_enough_distinct_right_answers_score_one():
    # {0..7, REF}: n' = 9 >= 8 -> n'/n = 1
    assert balance(answers(*[(str(i), True) for i in range(8)]))["score"] == 1.0


# -- what is counted ----------------------------------------------------------------------------


def test_an_answer_equal_to_the_reference_is_one_text():
    # {REF, b}: n' = 2 (the sample that wrote the reference word for word is not counted apart)
    assert balance(answers((REF, True), ("b", True)))["score"] == 2 / 8
    assert balance(answers(("a", True), ("b", True)))["score"] == 3 / 8


def test_answers_without_an_extracted_answer_are_left_out():
    # the released code drops an output without its "# Answer" section: here, no extraction
    group = [sample(0, "a", True), *[sample(i, f"x{i}", False, answer=None) for i in range(1, 8)]]
    # τ < 0 would select the 7 wrong ones if they counted; left out: {a, REF} at every τ -> 2/8
    assert balance(group, thresholds=[-0.5])["score"] == 0.25


def test_the_cap_counts_repeats_and_the_score_does_not():
    group = answers(("a", True), ("a", True), ("a", True), ("b", True))
    # 2 texts wanted: cap 1 {a}, 2 {a, a}, 3 {a, a, a} hold 1 distinct; cap 4 {a, a, a, b} holds 2
    result = balance(group, reference=None, valid_sample_size=2, thresholds=[0.5])
    assert result["cap"] == 4 and result["score"] == 2 / 8  # {a, b}: n' = 2 -> 2/8


def test_the_cap_is_the_smallest_that_selects_enough_and_drops_the_reference_ranked_last():
    qs = [Ranked.of(f"Q{i}", answers(*[(t, True) for t in "abcd"]), REF) for i in range(2)]
    # 4 texts wanted over 2 questions: cap 1 selects 1 + 1 = 2, cap 2 selects 2 + 2 = 4. Each
    # question's first 2 of [a, b, c, d, REF] (REF ties at 1.0 and is ranked after them): {a, b}
    # -> n' = 2 -> 2/8 = 0.25 each
    result = released_balance(qs, [0.5], 8, 4, 64)
    assert (result["cap"], result["score"], result["selected"]) == (2, 0.25, 2)
    # never enough: the largest cap (released: 64); here 1 -> {a} -> 1/8
    assert released_balance(qs, [0.5], 8, 100, 1) == {"score": 0.125, "threshold": 0.5, "cap": 1, "selected": 1,
                                                        "selected_right": 1}


def test_the_reference_ranks_after_the_answers_it_ties_with():
    qs = [Ranked.of(f"Q{i}", answers(("a", True), ("a", True), ("b", True), ("c", True)), REF) for i in range(2)]
    # [a, a, b, c, REF] (a stable sort: REF, appended last, stays after the 1.0s); 4 texts wanted:
    # cap 1 {a} and cap 2 {a, a} hold 1 + 1 = 2, cap 3 {a, a, b} holds 2 + 2 = 4 -> n' = 2 -> 2/8
    # (ranked first, REF would make cap 2 {REF, a} enough)
    assert released_balance(qs, [0.5], 8, 4, 64) == {"score": 0.25, "threshold": 0.5, "cap": 3, "selected": 2,
                                                      "selected_right": 2}


def test_questions_with_the_same_text_are_one_query():
    # the released code deduplicates (query text, output) and groups by the query text
    one = answers(("a", True), ("b", True))
    both = released_balance([Ranked.of("Q", one, REF), Ranked.of("Q", one, REF)], [0.5], 8, 114, 64)
    assert both["score"] == 3 / 8 and both["selected"] == 3  # {a, b, REF}, once


# -- the threshold sweep on graded scores ------------------------------------------------------


def test_the_threshold_sweep_on_graded_scores():
    # a lenient graded checker: right from 0.5; REF ranks first (1.0), then a, b (0.5), w (0.2)
    group = [sample(0, "a", True, 0.5), sample(1, "b", True, 0.5), sample(2, "w", False, 0.2)]
    # τ < 0.2: {REF, a, b, w}: n' = 3, n = 4 -> 3 * (3/4) / 8 = 0.28125
    # 0.2 <= τ < 0.5: {REF, a, b} -> 3/8 = 0.375 (the best)
    # 0.5 <= τ < 1: {REF} -> 1/8 = 0.125
    result = balance(group)
    assert result["score"] == 0.375
    assert result["threshold"] == next(t for t in released_thresholds() if t >= 0.2)
    assert abs(result["threshold"] - 0.2) < 0.011
    assert balance(group, thresholds=[0.1])["score"] == 0.28125
    assert balance(group, thresholds=[0.7])["score"] == 0.125
    # a right/wrong verdict of the same answers (no score): rewards 1, 1, 0 -> {REF, a, b} at τ >= 0
    plain = [sample(0, "a", True), sample(1, "b", True), sample(2, "w", False)]
    assert balance(plain)["score"] == 0.375
    assert balance(plain)["threshold"] == next(t for t in released_thresholds() if t >= 0)


def test_the_first_threshold_of_equal_scores_is_recorded():
    # the reference written word for word, graded 0.6: τ < 0.6 selects {REF, REF} -> {REF}, τ >= 0.6
    # {REF}: 1/8 both; find_strategy keeps the first (a strictly greater score replaces it)
    assert balance([sample(0, REF, True, 0.6)]) == {"score": 0.125, "threshold": -1.0, "cap": 64, "selected": 1,
                                                    "selected_right": 1}


def test_released_thresholds_are_the_summed_grid():
    grid = released_thresholds()
    assert len(grid) == 200 and grid[0] == -1.0 and abs(grid[-1] - 0.99) < 1e-12
    assert all(abs(b - a - 0.01) < 1e-12 for a, b in zip(grid, grid[1:]))


def test_nothing_selected_scores_minus_infinity():
    result = balance(answers(("w", False)), reference=None, thresholds=[0.5])
    assert result["score"] == float("-inf")


# -- the tuner: the reference, the choice, the presets --------------------------------------------


QS = [Example(f"q{i}", f"question {i}", "3") for i in range(6)]


def test_the_tuner_adds_each_questions_reference_and_chooses_the_best_temperature():
    def script(t, q, s):  # 0.5 repeats one right text; 1.0 writes distinct right ones
        return ProbeSample(q, s, "same" if t < 0.7 else f"v{s}", "3", True)

    probe = Probe(script)
    choice = BalanceTuner(temperatures=[0.5, 1.0], questions=3, samples=4).tune(1, QS, probe, 0)
    scores = {c["temperature"]: c["score"] for c in choice.candidates}
    # 0.5: {same, REF} -> 2/8; 1.0: {v0..v3, REF} -> 5/8
    assert scores == {0.5: 0.25, 1.0: 0.625} and choice.temperature == 1.0
    refs = [c for c in probe.calls if c[0] == "references"]
    assert len(refs) == 1 and len(refs[0][1]) == 3  # asked once, for the probed questions
    assert {"threshold", "cap", "selected", "selected_right", "accuracy", "distinct_correct"} <= set(
        choice.candidates[0])
    # without the reference (a departure): 0.5 -> {same} 1/8, 1.0 -> {v0..v3} 4/8
    bare = BalanceTuner(temperatures=[0.5, 1.0], questions=3, samples=4, reference=False).tune(1, QS, Probe(script), 0)
    assert [c["score"] for c in bare.candidates] == [0.125, 0.5]
    # the score before, by name
    share = BalanceTuner(temperatures=[0.5, 1.0], questions=3, samples=4, target=8, score="share")
    assert [c["score"] for c in share.tune(1, QS, Probe(script), 0).candidates] == [1 / 32, 0.5]


def test_equal_scores_choose_the_temperature_listed_first():
    def script(t, q, s):
        return ProbeSample(q, s, "same", "3", True)

    for grid in ([0.9, 0.6], [0.6, 0.9]):
        assert BalanceTuner(temperatures=grid, questions=2, samples=2).tune(1, QS, Probe(script), 0).temperature \
            == grid[0]


def test_a_probe_without_references_or_a_task_without_them_is_one_line():
    def script(t, q, s):
        return ProbeSample(q, s, "a", "3", True)

    def plain(t, ids, samples):
        return [[script(t, q, s) for s in range(samples)] for q in ids]

    tuner = BalanceTuner(temperatures=[0.5], questions=2, samples=2)
    with pytest.raises(UserError, match=r"^generation\.tuner\.reference: the probe gives no reference") as e:
        tuner.tune(1, QS, plain, 0)
    assert "reference = false" in str(e.value) and e.value.key == "generation.tuner.reference"
    with pytest.raises(UserError, match=r"^generation\.tuner\.reference: .*the task gives none: cqa: no rationales"):
        tuner.tune(1, QS, Probe(script, refuse="cqa: no rationales"), 0)
    assert BalanceTuner(temperatures=[0.5], questions=2, samples=2, reference=False).tune(1, QS, plain, 0)


def test_presets_and_explicit_options_over_them():
    released = BalanceTuner(preset="released")
    assert released.temperatures == [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2]
    assert (released.questions, released.samples, released.valid_sample_size) == (1000, 64, 3550)
    assert (released.target, released.max_cap, released.thresholds) == (8, 64, released_thresholds())
    cpu = BalanceTuner()  # the default preset
    assert (cpu.temperatures, cpu.questions, cpu.samples, cpu.valid_sample_size) == ([0.5, 0.7, 0.9, 1.1], 32, 8, 114)
    mixed = BalanceTuner(preset="released", samples=8, temperatures=[0.7])
    assert (mixed.temperatures, mixed.questions, mixed.samples, mixed.valid_sample_size) == ([0.7], 1000, 8, 3550)
    assert set(PRESETS) == {"released", "cpu"}


def test_bad_options_are_one_line_naming_the_key():
    reg = Registry()
    with pytest.raises(UserError) as e:
        reg.create("tuner", "balance", {"preset": "relesed"}, "generation.tuner")
    assert str(e.value) == ("generation.tuner.preset: must be one of 'released', 'cpu', got 'relesed' "
                            "(did you mean 'released'?)") and e.value.key == "generation.tuner.preset"
    with pytest.raises(UserError, match=r"^generation\.tuner\.score: .*got 'shar' \(did you mean 'share'\?\)$"):
        reg.create("tuner", "balance", {"score": "shar"}, "generation.tuner")
    with pytest.raises(UserError, match=r"^generation\.tuner\.distinct: counts repeats in score = 'share' only"):
        reg.create("tuner", "balance", {"distinct": False}, "generation.tuner")
    with pytest.raises(UserError, match=r"^generation\.tuner\.samples: must be >= 1, got 0$"):
        reg.create("tuner", "balance", {"preset": "released", "samples": 0}, "generation.tuner")
    with pytest.raises(UserError, match=r"^generation\.tuner\.thresholds: must not be empty$"):
        reg.create("tuner", "balance", {"thresholds": []}, "generation.tuner")


def test_validate_refuses_a_misspelt_preset_with_exit_2(tmp_path):
    text = (REPO / "experiments" / "addition_bstar.toml").read_text()
    assert 'preset = "cpu"' in text
    path = tmp_path / "bstar.toml"
    path.write_text(text.replace('preset = "cpu"', 'preset = "relesed"').replace(
        'output_dir = "../runs/addition_bstar"', f'output_dir = "{(tmp_path / "run").as_posix()}"'))
    res = subprocess.run([sys.executable, "-m", "star_engine", "validate", str(path)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "generation.tuner.preset" in lines[0] and "did you mean 'released'?" in lines[0]
    assert not (tmp_path / "run").exists()
