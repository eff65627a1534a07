"""STaR's successors in the loop, with the scripted backend: the verifier (V-STaR) and
verifier@k, the group filter's counts, the random-reward control, a sampling tuner."""

from __future__ import annotations

import itertools
import json
import shutil
from fractions import Fraction
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from star_engine.cli import main
from star_engine.rundir.metrics import best_of_k, pass_at_k, sampling_columns
from star_engine.rundir.records import Evaluation, VerifierScore
from star_testkit import cli, scripted_env

PLUGINS = "star_testkit.scripted,star_successors.plugin"


@pytest.fixture
def successors(scripted, monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", PLUGINS)


def env(**extra: str) -> dict[str, str]:
    return scripted_env(STAR_ENGINE_PLUGINS=PLUGINS, **extra)


def rows(run: Path, rel: str) -> list[dict]:
    return pq.read_table(run / rel).to_pylist()


# -- verifier@k -------------------------------------------------------------------------------


def brute_best_of_k(ranked: list[bool], k: int) -> Fraction:
    """Over every k-subset of the ranked samples: is its best-ranked one right?"""
    subsets = list(itertools.combinations(range(len(ranked)), k))
    return Fraction(sum(ranked[min(s)] for s in subsets), len(subsets))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=10), st.data())
def test_best_of_k_equals_counting_every_subset(ranked, data):
    k = data.draw(st.integers(1, len(ranked)))
    assert best_of_k(ranked, k) == float(brute_best_of_k(ranked, k))
    assert best_of_k(ranked, 1) == pytest.approx(sum(ranked) / len(ranked))
    assert best_of_k(ranked, len(ranked)) == float(ranked[0])
    assert best_of_k(ranked, k) <= pass_at_k(len(ranked), sum(ranked), k) + 1e-12


def answer(q: str, s: int, correct: bool) -> Evaluation:
    return Evaluation(question_id=q, cls="all", iteration=1, sample=s, split="dev", generation="", predicted=str(s),
                      gold="", correct=correct, model_checkpoint="", prompt_hash="")


def score(q: str, s: int, value: float) -> VerifierScore:
    return VerifierScore(question_id=q, cls="all", iteration=1, sample=s, split="dev", score=value, logp=value,
                         logp_reference=0.0, verifier_checkpoint="v", reference_checkpoint="r")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.booleans(), st.integers(-3, 3)), min_size=4, max_size=4), min_size=1,
                max_size=6), st.integers(1, 4))
def test_verifier_at_k_is_pass_at_1_at_k_1_and_at_most_pass_at_k(questions, k):
    samples = [answer(f"q{i}", s, c) for i, qs in enumerate(questions) for s, (c, _) in enumerate(qs)]
    scores = [score(f"q{i}", s, v) for i, qs in enumerate(questions) for s, (_, v) in enumerate(qs)]
    at_1 = sampling_columns(samples, 1, scores)
    assert at_1["verifier_at_k"] == pytest.approx(at_1["pass_at_1"])
    cols = sampling_columns(samples, k, scores)
    assert cols["verifier_at_k"] <= cols["pass_at_k"] + 1e-12
    assert cols["first_sample"] == sum(qs[0][0] for qs in questions) / len(questions)


def test_verifier_at_k_ranks_by_score_and_breaks_ties_by_sample():
    samples = [answer("a", 0, False), answer("a", 1, True), answer("a", 2, False), answer("a", 3, False)]
    assert sampling_columns(samples, 4, [score("a", s, v) for s, v in enumerate([0.1, 0.9, 0.2, 0.3])]
                            )["verifier_at_k"] == 1.0
    assert sampling_columns(samples, 4, [score("a", s, 0.0) for s in range(4)])["verifier_at_k"] == 0.0  # sample 0
    # best-of-2 from 4 ranked (right one ranked 2nd): the right one is the best of the 3 pairs without the 1st
    assert sampling_columns(samples, 2, [score("a", s, v) for s, v in enumerate([0.9, 0.5, 0.2, 0.1])]
                            )["verifier_at_k"] == pytest.approx(2 / 6)


# -- the verifier in a run --------------------------------------------------------------------

VERIFIER = """
[verifier]
enabled = true
steps = 5
beta = 0.2
max_pairs_per_question = 2
"""


def verifier_toml(toy_toml, out: str = "run", extra: str = "") -> Path:
    path = toy_toml(out, VERIFIER + extra)
    text = path.read_text().replace('backend = "scripted"', 'backend = "scripted_verifier"')
    text = text.replace("batch_size = 4\n", "batch_size = 4\ntemperature = 0.7\nsamples_per_question = 3\n", 1)
    path.write_text(text)
    return path


EACH_ITERATION = """schedule = "each_iteration"
init = "generator"
rationalized = true
gold = false
"""


def test_the_verifier_is_trained_on_the_iterations_pairs_and_ranks_the_samples(successors, toy_toml):
    path = verifier_toml(toy_toml, extra=EACH_ITERATION)
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    manifest = json.loads((run / "manifest.json").read_text())
    trained = []
    for n in (1, 2, 3):
        it = run / f"iterations/{n:03d}"
        info = json.loads((it / "verifier/train.json").read_text())
        generator = json.loads((it / "train.json").read_text())
        if not info["examples"]:  # no pair this iteration (the scripted model got its questions all right or
            assert info["checkpoint"] == generator["checkpoint"] and info["steps"] == 0  # all wrong): V_n = M_n
            continue
        trained.append(n)
        model = json.loads((it / "verifier/model/model.json").read_text())
        assert info["checkpoint"] == f"iterations/{n:03d}/verifier/model" and info["trained_on"] == "pairs"
        assert f"iterations/{n:03d}/verifier/model" in manifest["checkpoints"]  # hashed like every checkpoint
        # its pairs: this iteration's kept rationales against its wrong ones, the same prompt, capped
        rats = rows(run, f"iterations/{n:03d}/rationales.parquet")
        kept = {(r["prompt"], r["rationale"]) for r in rats if r["kept"]}
        wrong = {(r["prompt"], r["rationale"]) for r in rats if not r["correct"]}
        assert model["pairs"] and info["examples"] == len(model["pairs"]) and model["beta"] == 0.2
        assert all((p, c) in kept and (p, w) in wrong for p, c, w in model["pairs"])
        per_q: dict[str, int] = {}
        for p, _, _ in model["pairs"]:
            per_q[p] = per_q.get(p, 0) + 1
        assert max(per_q.values()) <= 2
        # it starts from the iteration's model: its lineage ends with M_n's id
        assert model["lineage"][-1] == generator["checkpoint_id"][:8]
        scores = rows(run, f"iterations/{n:03d}/verifier_dev.parquet")
        samples = rows(run, f"iterations/{n:03d}/eval_dev_samples.parquet")
        assert [(r["question_id"], r["sample"]) for r in scores] == [(r["question_id"], r["sample"]) for r in samples]
        assert all(r["score"] == pytest.approx(r["logp"] - r["logp_reference"]) for r in scores)
    metrics = rows(run, "metrics.parquet")
    dev = [r for r in metrics if r["split"] == "dev"]
    assert all(r["verifier_at_k"] is None for r in dev if r["iteration"] == 0)  # no verifier before iteration 1
    assert trained
    later = [r for r in dev if r["iteration"] in trained]
    # the scripted verifier knows arithmetic: its top-ranked of the 3 is right whenever one is
    assert later and all(r["verifier_at_k"] == pytest.approx(r["pass_at_k"]) for r in later)
    assert any(r["verifier_at_k"] > r["first_sample"] for r in later)
    report = (run / "report.md").read_text()
    assert "| iteration | dev verifier@k | dev first sample |" in report


def test_a_run_killed_while_training_its_verifier_resumes_to_the_same_files(toy_toml):
    path = verifier_toml(toy_toml)
    run = path.parent / "run"
    assert cli("run", str(path), "--quiet", env=env()).returncode == 0
    reference = {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*")
                 if p.is_file() and (p.name == "model.json" or "verifier" in p.name)}
    shutil.rmtree(run)
    # iteration 1 trains its generator 3 steps, then its verifier: step 5 is the verifier's 2nd
    res = cli("run", str(path), "--quiet", env=env(SCRIPTED_KILL="train_step:5"))
    assert res.returncode == -9, res.stderr
    assert not (run / "iterations/001/verifier/train.json").exists()
    assert cli("run", str(path), "--quiet", env=env()).returncode == 0
    assert {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*")
            if p.is_file() and (p.name == "model.json" or "verifier" in p.name)} == reference


def test_a_verifier_needs_a_backend_that_trains_one(toy_toml):
    path = toy_toml("run", VERIFIER)
    res = cli("run", str(path), "--quiet", env=env())
    assert res.returncode == 2 and "verifier.enabled" in res.stderr and "trains no verifier" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (path.parent / "run").exists()


def test_verifier_options_without_the_verifier_have_no_effect(toy_toml):
    path = toy_toml("run", "\n[verifier]\nbeta = 0.3\n")
    res = cli("validate", str(path), env=env())
    assert res.returncode == 2 and "verifier.beta" in res.stderr and "verifier.enabled" in res.stderr


# -- the group filter, the random-reward control, a tuner ------------------------------------


def sampled_toml(toy_toml, out: str, extra: str = "", filters: str = '["toy_leak"]') -> Path:
    path = toy_toml(out, extra)
    text = path.read_text().replace('filters = ["toy_leak"]', f"filters = {filters}")
    text = text.replace("batch_size = 4\n", "batch_size = 4\ntemperature = 0.7\nsamples_per_question = 3\n", 1)
    path.write_text(text)
    return path


def test_the_group_filter_drops_all_right_questions_and_is_counted(successors, toy_toml):
    path = sampled_toml(toy_toml, "run", filters='["toy_leak", {name = "group", drop = ["all_right"]}]')
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    rats = rows(run, "iterations/001/rationales.parquet")
    plain: dict[str, list[bool]] = {}
    for r in rats:
        if not r["was_hinted"]:
            plain.setdefault(r["question_id"], []).append(r["correct"])
    all_right = {q for q, v in plain.items() if all(v)}
    assert all_right and {r["question_id"] for r in rats if r["rejected_by"] == "group"} == all_right
    assert not any(r["kept"] for r in rats if r["question_id"] in all_right)
    row = next(r for r in rows(run, "metrics.parquet") if r["iteration"] == 1 and r["split"] == "train"
               and r["class"] == "all")
    assert row["groups_all_right"] == len(all_right)
    assert row["groups_all_wrong"] == sum(not any(v) for v in plain.values())
    group = next(c for c in row["rejected"] if c["filter"] == "group")
    assert group == {"filter": "group", "examples": sum(len(plain[q]) for q in all_right), "questions": len(all_right)}
    assert f"group {group['examples']} ({group['questions']})" in (run / "report.md").read_text()


def test_the_random_reward_judges_training_samples_and_leaves_the_evaluation_alone(successors, toy_toml):
    real = sampled_toml(toy_toml, "real")
    assert main(["run", str(real), "--quiet"]) == 0
    # the same file, its control by one override (and another run directory)
    assert main(["run", str(real), "--quiet", "--set", "task.reward=random_reward",
                 "--set", "experiment.output_dir=" + str(real.parent / "control")]) == 0
    a, b = real.parent / "real", real.parent / "control"
    gen = rows(b, "iterations/001/generated.parquet")
    assert {r["checker"] for r in gen} == {"random_reward"}
    truth = {(r["question_id"], r["sample"]): r["correct"] for r in rows(a, "iterations/001/generated.parquet")}
    assert [truth[(r["question_id"], r["sample"])] for r in gen] != [r["correct"] for r in gen]
    # the base model's evaluation is the task checker's in both runs
    assert rows(a, "iterations/000/eval_dev.parquet") == rows(b, "iterations/000/eval_dev.parquet")
    assert {r["checker"] for r in rows(b, "iterations/003/eval_dev.parquet")} == {"toy_exact"}
    config = json.loads((b / "config.json").read_text())
    assert config["task"]["reward"] == {"name": "random_reward"} and config["task"]["checker"]["name"] == "toy_exact"


TUNER = 'tuner = { name = "balance", temperatures = [0.2, 0.9], questions = 4, samples = 2, target = 2 }\n'


def test_a_tuner_chooses_each_iterations_temperature(successors, toy_toml, generate_calls):
    path = sampled_toml(toy_toml, "run")
    path.write_text(path.read_text().replace("samples_per_question = 3\n", "samples_per_question = 3\n" + TUNER))
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    for n in (1, 2, 3):
        tuning = rows(run, f"iterations/{n:03d}/tuning.parquet")
        assert [r["temperature"] for r in tuning] == [0.2, 0.9] and sum(r["chosen"] for r in tuning) == 1
        chosen = next(r["temperature"] for r in tuning if r["chosen"])
        assert next(r["temperature"] for r in rows(run, "metrics.parquet")
                    if r["iteration"] == n and r["split"] == "train" and r["class"] == "all") == chosen
        assert not (run / f"iterations/{n:03d}/tune").exists()  # the probes' chunks are dropped
    temps = [spec.temperature for _, spec in generate_calls]
    first = temps.index(0.2)  # after the base model's evaluation: iteration 1's probes (8 answers, chunks of 5)
    chosen_1 = next(r["temperature"] for r in rows(run, "iterations/001/tuning.parquet") if r["chosen"])
    # ... then the iteration's own generation, at the temperature chosen
    assert temps[first:first + 5] == [0.2, 0.2, 0.9, 0.9, chosen_1]
    before = len(generate_calls)
    assert main(["run", str(path), "--quiet"]) == 0  # a finished run: no probe again
    assert len(generate_calls) == before




def test_a_third_party_tuner_registered_by_register_tuners(scripted, toy_toml):
    """star_testkit.scripted's ``register_tuners`` hook: the same path a plugin package takes."""
    path = toy_toml("run", "")
    path.write_text(path.read_text().replace("batch_size = 4\n", 'batch_size = 4\ntuner = "toy_tuner"\n', 1))
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    assert rows(run, "iterations/002/tuning.parquet")[0]["temperature"] == 0.5
    config = json.loads((run / "config.json").read_text())
    assert config["generation"]["tuner"] == {"name": "toy_tuner"}


def test_a_tuner_probing_a_question_not_drawn_is_named(toy_toml):
    path = toy_toml("run", "")
    path.write_text(path.read_text().replace(
        "batch_size = 4\n", 'batch_size = 4\ntuner = { name = "toy_tuner", ask = "nope" }\n', 1))
    res = cli("run", str(path), "--quiet", env=env())
    assert res.returncode != 0 and "tuner 'toy_tuner'" in res.stderr and "questions not drawn" in res.stderr
