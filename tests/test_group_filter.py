"""The group filter (Reinforce-Rej) in the loop, with the scripted backend: the questions a filter
declines are not rationalized and are counted as its rejections, both halves and each alone,
the all-wrong questions rationalized and dropped instead, ``min_samples``, a resumed run, and
its options refused in one line."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_testkit import cli, scripted_env

PLUGINS = "star_testkit.scripted,star_successors.plugin"
ONE = ["--set", "experiment.iterations=1"]


@pytest.fixture
def successors(scripted, monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", PLUGINS)


def rows(run: Path, rel: str) -> list[dict]:
    return pq.read_table(run / rel).to_pylist()


def group_toml(toy_toml, out: str, group: str = '"group"', leak: bool = True) -> Path:
    """The toy experiment with 3 samples a question at temperature 0.7, judged by the random reward
    (a seeded coin per sample: some questions all right, some all wrong, most mixed), and the
    filters ``toy_leak`` (unless not ``leak``) then ``group``."""
    path = toy_toml(out, name=f"{out}.toml")
    filters = f'["toy_leak", {group}]' if leak else f"[{group}]"
    text = path.read_text().replace('filters = ["toy_leak"]', f'filters = {filters}\nreward = "random_reward"')
    text = text.replace("batch_size = 4\n", "batch_size = 4\ntemperature = 0.7\nsamples_per_question = 3\n", 1)
    path.write_text(text)
    return path


def run_one(path: Path, *extra: str) -> Path:
    assert main(["run", str(path), "--quiet", *ONE, *extra]) == 0
    return path.parent / path.stem


def plain(rats: list[dict]) -> dict[str, list[bool]]:
    """Each question's hint-free verdicts."""
    out: dict[str, list[bool]] = {}
    for r in rats:
        if not r["was_hinted"]:
            out.setdefault(r["question_id"], []).append(r["correct"])
    return out


def train_row(run: Path, n: int = 1) -> dict:
    return next(r for r in rows(run, "metrics.parquet") if r["iteration"] == n and r["split"] == "train"
                and r["class"] == "all")


def kept(run: Path) -> set[tuple]:
    return {(r["question_id"], r["sample"], r["was_hinted"], r["rationale"])
            for r in rows(run, "iterations/001/rationales.parquet") if r["kept"]}


def test_by_default_the_all_wrong_questions_are_declined_before_rationalization(successors, toy_toml):
    run = run_one(group_toml(toy_toml, "both"))
    rats = rows(run, "iterations/001/rationales.parquet")
    groups = plain(rats)
    all_right = {q for q, v in groups.items() if all(v)}
    all_wrong = {q for q, v in groups.items() if not any(v)}
    assert all_right and all_wrong and len(all_right | all_wrong) < len(groups)  # some mixed too
    # with 3 samples a question, the wrong questions are the all-wrong ones: none is rationalized
    assert rows(run, "iterations/001/rationalized.parquet") == []
    assert not any(r["was_hinted"] for r in rats)
    assert all(r["hinted_samples"] == 0 for r in rows(run, "iterations/001/questions.parquet"))
    for r in rats:
        dropped = r["question_id"] in all_right | all_wrong
        assert (r["rejected_by"] == "group") == dropped and not (dropped and r["kept"])
        if not dropped:  # a mixed question: the checker's selection
            assert r["kept"] == r["correct"] and r["rejected_by"] == (None if r["correct"] else "checker")
    row = train_row(run)
    assert (row["groups_all_right"], row["groups_all_wrong"], row["rationalized"]) == \
        (len(all_right), len(all_wrong), 0)
    group = next(c for c in row["rejected"] if c["filter"] == "group")
    assert group == {"filter": "group", "examples": sum(len(groups[q]) for q in all_right | all_wrong),
                     "questions": len(all_right | all_wrong)}
    assert f"group {group['examples']} ({group['questions']})" in (run / "report.md").read_text()


def test_rationalize_all_wrong_rationalizes_them_and_trains_on_the_same_set(successors, toy_toml):
    default = run_one(group_toml(toy_toml, "both", leak=False))
    run = run_one(group_toml(toy_toml, "rationalized", '{name = "group", rationalize_all_wrong = true}', leak=False))
    rats = rows(run, "iterations/001/rationales.parquet")
    all_wrong = {q for q, v in plain(rats).items() if not any(v)}
    hinted = [r for r in rats if r["was_hinted"]]
    assert {r["question_id"] for r in hinted} == all_wrong  # STaR's rationalization, p_rationalization = 1
    assert not any(r["kept"] for r in hinted) and any(r["rejected_by"] == "group" for r in hinted)
    assert all(r["rejected_by"] == ("group" if r["correct"] else "checker") for r in hinted)
    # their hint-free samples were not declined: the checker's rejections
    assert all(r["rejected_by"] == "checker" for r in rats if r["question_id"] in all_wrong and not r["was_hinted"])
    assert kept(run) == kept(default) and kept(run)
    assert train_row(run)["rationalized"] == sum(r["correct"] for r in hinted) > 0


@pytest.mark.parametrize("drop", ["all_right", "all_wrong"])
def test_each_half_alone(successors, toy_toml, drop):
    run = run_one(group_toml(toy_toml, drop, f'{{name = "group", drop = ["{drop}"]}}', leak=False))
    rats = rows(run, "iterations/001/rationales.parquet")
    groups = plain(rats)
    all_right = {q for q, v in groups.items() if all(v)}
    all_wrong = {q for q, v in groups.items() if not any(v)}
    dropped = all_right if drop == "all_right" else all_wrong
    assert {r["question_id"] for r in rats if r["rejected_by"] == "group"} == dropped
    rationalized = {r["question_id"] for r in rows(run, "iterations/001/rationalized.parquet")}
    if drop == "all_right":  # STaR's rationalization of the all-wrong questions, trained on
        assert rationalized == all_wrong and any(r["kept"] for r in rats if r["was_hinted"])
    else:  # the all-right questions are trained on
        assert not rationalized and all(r["kept"] for r in rats if r["question_id"] in all_right)
    group = next(c for c in train_row(run)["rejected"] if c["filter"] == "group")
    assert group["questions"] == len(dropped) and group["examples"] == sum(len(groups[q]) for q in dropped)


def test_min_samples_above_the_samples_leaves_every_question_alone(successors, toy_toml):
    run = run_one(group_toml(toy_toml, "loose", '{name = "group", min_samples = 4}'))
    rats = rows(run, "iterations/001/rationales.parquet")
    all_wrong = {q for q, v in plain(rats).items() if not any(v)}
    assert not any(r["rejected_by"] == "group" for r in rats)
    assert {r["question_id"] for r in rats if r["was_hinted"]} == all_wrong
    assert all(c["filter"] != "group" for c in train_row(run)["rejected"])


def test_without_rationalization_the_declined_questions_are_counted_alike(successors, toy_toml):
    run = run_one(group_toml(toy_toml, "plain"), "--set", "rationalization.enabled=false")
    rats = rows(run, "iterations/001/rationales.parquet")
    all_wrong = {q for q, v in plain(rats).items() if not any(v)}
    assert all_wrong and all(r["rejected_by"] == "group" for r in rats if r["question_id"] in all_wrong)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_run_killed_after_declining_resumes_to_the_same_files(toy_toml):
    path = group_toml(toy_toml, "run")
    run = path.parent / "run"
    env = scripted_env(STAR_ENGINE_PLUGINS=PLUGINS)
    two = ("--set", "experiment.iterations=2")
    assert cli("run", str(path), "--quiet", *two, env=env).returncode == 0
    names = ("generated", "rationalized", "rationales", "questions")
    reference = {str(p.relative_to(run)): sha(p) for p in run.glob("iterations/*/*.parquet") if p.stem in names}
    assert any("002/rationales" in k for k in reference)
    shutil.rmtree(run)
    # 12 dev answers, 72 samples (iteration 1), 12 dev answers: the 100th generation is iteration 2's
    res = cli("run", str(path), "--quiet", *two, env=scripted_env(STAR_ENGINE_PLUGINS=PLUGINS,
                                                                  SCRIPTED_KILL="generate:100"))
    assert res.returncode == -9, res.stderr
    assert not (run / "iterations/002/rationales.parquet").exists()
    assert cli("run", str(path), "--quiet", *two, env=env).returncode == 0
    assert {str(p.relative_to(run)): sha(p) for p in run.glob("iterations/*/*.parquet") if p.stem in names} \
        == reference


@pytest.mark.parametrize("group, key, words", [
    ('{name = "group", drop = ["all_wong"]}', "task.filters[1].drop[0]", "all_wrong, all_right"),
    ('{name = "group", drop = ["all_right"], rationalize_all_wrong = true}', "task.filters[1].rationalize_all_wrong",
     "has no effect"),
])
def test_bad_options_are_one_line_naming_the_key(toy_toml, group, key, words):
    path = group_toml(toy_toml, "bad", group)
    env = scripted_env(STAR_ENGINE_PLUGINS=PLUGINS)
    for command in ("validate", "run"):
        res = cli(command, str(path), env=env)
        assert res.returncode == 2, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and key in res.stderr and words in res.stderr
    assert not (path.parent / "bad").exists()
