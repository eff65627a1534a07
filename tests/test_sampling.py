"""pass@k (the unbiased estimator against counting every subset), majority vote, the sampled dev
evaluation and the exploration metrics of a run, and the configuration keys that drive them."""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from star_engine.cli import main
from star_engine.rundir.metrics import majority_correct, pass_at_k, sampling_columns
from star_engine.rundir.records import Evaluation, read


def brute_pass_at_k(outcomes: list[bool], k: int) -> Fraction:
    """The share of the k-subsets of the samples that hold a right one, counted."""
    subsets = list(itertools.combinations(range(len(outcomes)), k))
    return Fraction(sum(any(outcomes[i] for i in s) for s in subsets), len(subsets))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12), st.data())
def test_pass_at_k_equals_counting_every_subset(outcomes, data):
    k = data.draw(st.integers(1, len(outcomes)))
    assert pass_at_k(len(outcomes), sum(outcomes), k) == float(brute_pass_at_k(outcomes, k))


def test_pass_at_k_edges():
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0 and pass_at_k(5, 3, 3) == 1.0
    assert pass_at_k(10, 1, 1) == pytest.approx(0.1) and pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)  # exact where floats of C(200, 100) would overflow precision
    for bad in ((3, 4, 1), (3, 1, 4), (3, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def sample(s: int, predicted: str | None, correct: bool, q: str = "q") -> Evaluation:
    return Evaluation(question_id=q, cls="all", iteration=1, sample=s, split="dev", generation="",
                      predicted=predicted, gold="", correct=correct, model_checkpoint="", prompt_hash="")


def test_majority_vote():
    assert majority_correct([sample(0, "5", True), sample(1, "6", False), sample(2, "5", True)])
    assert not majority_correct([sample(0, "6", False), sample(1, "5", True), sample(2, "6", False)])
    # A tie goes to the answer reached first in sample order (rows in any order).
    assert majority_correct([sample(1, "6", False), sample(0, "5", True)])
    assert not majority_correct([sample(0, "6", False), sample(1, "5", True)])
    # No answer does not vote; nothing at all is wrong.
    assert majority_correct([sample(0, None, False), sample(1, None, False), sample(2, "5", True)])
    assert not majority_correct([sample(0, None, False)])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["1", "2", "3", None]), min_size=1, max_size=9))
def test_majority_vote_is_the_most_common_answer(answers):
    rows = [sample(i, a, a == "2") for i, a in enumerate(answers)]
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        assert not majority_correct(rows)
        return
    top = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == top)
    assert majority_correct(list(reversed(rows))) == (winner == "2")


def test_sampling_columns_average_over_questions():
    rows = [sample(i, str(i), i == 0, "a") for i in range(4)] + [sample(i, "x", False, "b") for i in range(4)]
    cols = sampling_columns(rows, 2)
    assert cols["pass_k"] == 2 and cols["pass_at_k"] == pytest.approx((0.5 + 0.0) / 2)
    assert cols["pass_at_1"] == pytest.approx((0.25 + 0) / 2) and cols["majority"] == 0.5  # "a": a 4-way tie, "0" first


SAMPLED = """
[evaluation]
splits = ["dev"]
samples_per_question = 4
sample_temperature = 0.8
pass_k = 2
"""


def test_a_run_reports_pass_at_k_and_majority_per_class(scripted, toy_toml):
    path = toy_toml(extra="")
    path.write_text(path.read_text().replace('[evaluation]\nsplits = ["dev"]\n', SAMPLED))
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    for n in (0, 3):
        table = pq.read_table(run / f"iterations/{n:03d}/eval_dev_samples.parquet")
        samples, answers = table.to_pylist(), read(table, Evaluation)
        assert set(Counter(r["question_id"] for r in samples).values()) == {4}
        greedy = pq.read_table(run / f"iterations/{n:03d}/eval_dev.parquet").to_pylist()
        for row in (m for m in metrics if m["iteration"] == n and m["split"] == "dev"):
            mine = [r for r in samples if row["class"] in ("all", r["class"])]
            qs = sorted({r["question_id"] for r in mine})
            by_q = {q: [r["correct"] for r in sorted(mine, key=lambda r: r["sample"]) if r["question_id"] == q]
                    for q in qs}
            assert row["pass_k"] == 2
            assert row["pass_at_k"] == pytest.approx(float(sum(brute_pass_at_k(v, 2) for v in by_q.values()) / len(qs)))
            assert row["majority"] == pytest.approx(
                sum(majority_correct([a for a in answers if a.question_id == q]) for q in qs) / len(qs))
            # The greedy accuracy beside it is the greedy evaluation's, unchanged.
            g = [r for r in greedy if row["class"] in ("all", r["class"])]
            assert row["accuracy"] == pytest.approx(sum(r["correct"] for r in g) / len(g))
    assert "pass@k" in (run / "report.md").read_text()


def test_train_rows_carry_exploration_metrics(scripted, toy_toml):
    path = toy_toml(extra="")
    path.write_text(path.read_text().replace("chunk_size = 5", "chunk_size = 5\nsamples_per_question = 3\n"
                                             "temperature = 0.5"))
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    cands = pq.read_table(run / "iterations/002/rationales.parquet").to_pylist()
    row = next(m for m in metrics if m["iteration"] == 2 and m["split"] == "train" and m["class"] == "all")
    plain = [r for r in cands if not r["was_hinted"]]
    qs = {r["question_id"] for r in plain}
    solved = {r["question_id"] for r in plain if r["correct"]}
    assert row["pass_k"] == 3 and row["pass_at_k"] == pytest.approx(len(solved) / len(qs))
    distinct = sum(len({r["rationale"] for r in plain if r["correct"] and r["question_id"] == q}) for q in solved)
    assert row["distinct_correct"] == pytest.approx(distinct / len(solved))
    lengths = [len(r["rationale"].encode()) for r in cands if r["kept"]]
    mean = sum(lengths) / len(lengths)
    assert row["kept_len_mean"] == pytest.approx(mean)
    assert row["kept_len_std"] == pytest.approx((sum((x - mean) ** 2 for x in lengths) / len(lengths)) ** 0.5)
    # [evaluation] follows [generation]: it sampled at a temperature, so dev reports pass@3.
    dev = next(m for m in metrics if m["iteration"] == 2 and m["split"] == "dev" and m["class"] == "all")
    assert dev["pass_k"] == 3 and dev["pass_at_k"] is not None


def test_greedy_runs_sample_nothing_more(scripted, toy_toml):
    path = toy_toml()
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    assert not list(run.rglob("eval_dev_samples.parquet"))
    dev = [m for m in pq.read_table(run / "metrics.parquet").to_pylist() if m["split"] == "dev"]
    assert all(m["pass_at_k"] is None and m["majority"] is None for m in dev)


@pytest.mark.parametrize("setting, says", [
    ("evaluation.pass_k=5", "evaluation.pass_k: 5 is more than evaluation.samples_per_question (4)"),
    ("evaluation.sample_temperature=0.0", "--set evaluation.sample_temperature=0.0: evaluation.sample_temperature: "
                                          "must be > 0"),
    ("evaluation.samples_per_question=-1", "evaluation.samples_per_question: must be >= 0"),
    ("generation.sampler=3", "generation.sampler: expected a name or a table"),
    ("generation.sampler='nope'", "generation.sampler: unknown sampler 'nope'"),
])
def test_bad_sampling_keys_are_one_line_errors(scripted, toy_toml, capsys, setting, says):
    path = toy_toml()
    run = path.parent / "run"
    code = main(["run", str(path), "--set", "evaluation.samples_per_question=4", "--set",
                 "evaluation.sample_temperature=0.5", "--set", setting])
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not Path(run).exists()


def test_report_reads_runs_without_the_new_columns_and_overlays_two_runs(scripted, toy_toml, tmp_path):
    from star_engine.report import report
    from star_engine.rundir.metrics import SAMPLING_COLUMNS

    path = toy_toml()
    path.write_text(path.read_text().replace("chunk_size = 5", "chunk_size = 5\nsamples_per_question = 2\n"
                                             "temperature = 0.5"))
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    old = tmp_path / "old"
    old.mkdir()
    table = pq.read_table(run / "metrics.parquet")
    pq.write_table(table.drop_columns(list(SAMPLING_COLUMNS)), old / "metrics.parquet")  # a run of before
    rows_old = report.read_metrics(old)
    assert all(r[c] is None for r in rows_old for c in SAMPLING_COLUMNS)
    from star_engine.report.plot import figure

    fig = figure(report.read_metrics(run), "sampled", rows_old, "old")
    titles = {ax.get_title(): ax for ax in fig.axes}
    overlay = titles["overall accuracy and coverage"]
    labels = [line.get_label() for line in overlay.get_lines()]
    assert "sampled: dev accuracy" in labels and "old: dev accuracy" in labels  # two curves, one plot
    explore = titles["exploration"]
    assert any("solved among k" in line.get_label() for line in explore.get_lines())
    assert any("mean" in line.get_label() for line in titles["exploitation: kept rationale length"].get_lines())
    assert main(["report", str(run), "--compare", str(old)]) == 0
    # changed deliberately (issue #43): the comparison is report_vs_<other>.md, beside the run's own report
    assert "sampling and exploration" in (run / f"report_vs_{old.name}.md").read_text()
