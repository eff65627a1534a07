"""Label-free self-training in the loop, with the scripted backend: TTRL's majority-vote reward as
``task.reward`` (its pseudo-labels decide what is trained on, the task's checker still judges the
evaluation), the ``agreement`` column, the collapse guard, test-time training on a split without
gold answers, and the bad inputs refused before anything is written."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_engine.run.labelfree import collapse
from star_successors.majority import pseudo_label
from star_testkit import scripted as scripted_plugin

PLUGINS = "star_testkit.scripted,star_successors.plugin"


@pytest.fixture
def successors(scripted, monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", PLUGINS)


def rows(run: Path, rel: str) -> list[dict]:
    return pq.read_table(run / rel).to_pylist()


def ttrl_toml(toy_toml, out: str, task: str = 'reward = "majority_vote"\n', generation: str = "",
              experiment: str = "", samples: int = 4, rationalize: bool = False) -> Path:
    path = toy_toml(out)
    text = path.read_text().replace('dataset = "toy"\n', f'dataset = "toy"\n{task}', 1)
    text = text.replace("batch_size = 4\n", f"batch_size = 4\ntemperature = 0.7\nsamples_per_question = {samples}\n"
                        + generation, 1)
    text = text.replace("enabled = true\n", f"enabled = {str(rationalize).lower()}\n", 1)
    text = text.replace("iterations = 3\n", "iterations = 3\n" + experiment, 1)
    path.write_text(text)
    return path


def train_row(run: Path, n: int) -> dict:
    return next(r for r in rows(run, "metrics.parquet") if r["iteration"] == n and r["split"] == "train"
                and r["class"] == "all")


def by_question(gen: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in sorted(gen, key=lambda r: r["sample"]):
        out.setdefault(r["question_id"], []).append(r)
    return out


# -- the reward in the loop -----------------------------------------------------------------------


def test_pseudo_labels_decide_what_is_trained_on_and_the_evaluation_keeps_the_gold_checker(successors, toy_toml):
    path = ttrl_toml(toy_toml, "run")
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    gen = rows(run, "iterations/001/generated.parquet")
    assert {r["checker"] for r in gen} == {"majority_vote"}
    groups = by_question(gen)
    assert all(len(g) == 4 for g in groups.values())
    for g in groups.values():  # right iff the answer is the question's majority answer
        label, _ = pseudo_label([r["predicted"] for r in g])
        assert [r["correct"] for r in g] == [label is not None and r["predicted"] == label for r in g]
    # some pseudo-labels are wrong answers (a hard question's samples agreeing by chance, or a tie
    # going to the first sample): the reward is the vote, not the gold answer
    assert any(r["correct"] and r["predicted"] != r["gold"] for r in gen)
    kept = [r for r in rows(run, "iterations/001/rationales.parquet") if r["kept"]]
    assert kept and all(r["correct"] for r in kept)
    learned = json.loads((run / "iterations/001/model/model.json").read_text())["learned"]
    assert {r["prompt"]: r["rationale"] for r in kept}.items() <= learned.items()  # pseudo-labels reach training
    wrong_kept = [r for r in kept if r["predicted"] != r["gold"]]
    assert wrong_kept and all(learned[r["prompt"]] == r["rationale"] for r in wrong_kept)
    # the evaluation: the task's checker against the gold answers
    for n in (0, 1, 2, 3):
        ev = rows(run, f"iterations/{n:03d}/eval_dev.parquet")
        assert {r["checker"] for r in ev} == {"toy_exact"}
        assert all(r["correct"] == (r["predicted"] == r["gold"]) for r in ev)
    # the agreement column: each question's share of samples giving its most common answer, averaged
    shares = [max([r["predicted"] for r in g].count(a) for a in {r["predicted"] for r in g} if a is not None) / 4
              for g in groups.values()]
    assert train_row(run, 1)["agreement"] == pytest.approx(sum(shares) / len(shares))
    config = json.loads((run / "config.json").read_text())
    assert config["task"]["reward"] == {"name": "majority_vote"} and config["task"]["train_split"] == "train"


def test_min_agreement_leaves_split_votes_without_a_pseudo_label(successors, toy_toml):
    path = ttrl_toml(toy_toml, "run", task='reward = { name = "majority_vote", min_agreement = 0.75 }\n',
                     experiment="")
    assert main(["run", str(path), "--quiet"]) == 0
    for g in by_question(rows(path.parent / "run", "iterations/001/generated.parquet")).values():
        label, share = pseudo_label([r["predicted"] for r in g])
        assert [r["correct"] for r in g] == [share >= 0.75 and r["predicted"] == label for r in g]


# -- the collapse guard ---------------------------------------------------------------------------


def collapsing(monkeypatch) -> None:
    """A scripted model that collapses as it trains (depth = fine-tunings behind its checkpoint):
    its samples agree on "0" more and more, its greedy answers are right less and less."""
    def generate(self, checkpoint, requests, spec, progress=None):
        depth = len(self._load(checkpoint)["lineage"]) - 2  # init, then one entry per training
        out = []
        for req in requests:
            ctx = req.prompt[req.prompt.rfind("Q: "):]
            a, b = map(int, re.match(r"Q: (\d+)\+(\d+)", ctx).groups())
            rng = random.Random(req.seed)
            if spec.temperature > 0:
                ans = 0 if rng.random() < 0.2 + 0.35 * depth else a + b + rng.randrange(1, 50)
            else:
                ans = a + b if scripted_plugin._h(ctx) % 10 >= 3 * depth else 0
            out.append(f" {a} plus {b}. The answer is {ans}.")
            if progress:
                progress(1)
        return out

    monkeypatch.setattr(scripted_plugin.ScriptedBackend, "generate", generate)


def guarded(toy_toml, out: str, patience: int) -> Path:
    path = ttrl_toml(toy_toml, out, experiment=f"collapse_patience = {patience}\n")
    path.write_text(path.read_text().replace("restart_from_base = true", "restart_from_base = false"))
    return path


def events(run: Path, name: str) -> list[dict]:
    return [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e.get("event") == name]


def test_the_collapse_guard_stops_when_agreement_rises_while_dev_accuracy_falls(successors, toy_toml, monkeypatch,
                                                                                 capsys):
    collapsing(monkeypatch)
    path = guarded(toy_toml, "run", 1)
    assert main(["run", str(path)]) == 0
    run = path.parent / "run"
    metrics = rows(run, "metrics.parquet")
    assert max(r["iteration"] for r in metrics) == 2  # stopped after iteration 2 of 3
    a1, a2 = train_row(run, 1)["agreement"], train_row(run, 2)["agreement"]
    dev = {r["iteration"]: r["accuracy"] for r in metrics if r["split"] == "dev" and r["class"] == "all"}
    assert a2 > a1 and dev[2] < dev[1]
    [event] = events(run, "collapse_stop")
    assert event["iteration"] == 2 and event["iterations"] == [1, 2] and event["patience"] == 1
    assert "collapse guard: stopped after iteration 2" in capsys.readouterr().out
    assert main(["run", str(path), "--quiet"]) == 0  # resumed: the same stop, nothing redone
    assert rows(run, "metrics.parquet") == metrics


def test_the_collapse_guard_waits_for_patience_steps_and_is_off_by_default(successors, toy_toml, monkeypatch):
    collapsing(monkeypatch)
    for out, patience, last in (("two", 2, 3), ("off", 0, 3)):
        path = guarded(toy_toml, out, patience)
        assert main(["run", str(path), "--quiet"]) == 0
        run = path.parent / out
        assert max(r["iteration"] for r in rows(run, "metrics.parquet")) == last
        assert len(events(run, "collapse_stop")) == (patience == 2)  # 2 steps end at iteration 3 (the last)


def test_the_guard_needs_each_step_to_raise_agreement_and_lower_accuracy():
    def pts(*triples):
        out = []
        for n, agree, acc in triples:
            out += [{"iteration": n, "split": "train", "class": "all", "agreement": agree, "accuracy": None},
                    {"iteration": n, "split": "dev", "class": "all", "agreement": None, "accuracy": acc}]
        return out

    assert collapse(pts((1, 0.5, 0.6), (2, 0.7, 0.5)), 1, "dev")["iterations"] == [1, 2]
    assert collapse(pts((1, 0.5, 0.6), (2, 0.7, 0.6)), 1, "dev") is None  # accuracy held
    assert collapse(pts((1, 0.5, 0.6), (2, 0.5, 0.4)), 1, "dev") is None  # agreement held
    assert collapse(pts((1, 0.5, 0.6), (2, 0.7, 0.5)), 2, "dev") is None  # one step of two
    assert collapse(pts((1, 0.5, 0.6), (2, 0.7, 0.5), (3, 0.6, 0.4)), 2, "dev") is None  # agreement fell once
    assert collapse(pts((1, 0.5, 0.6), (2, 0.7, 0.5), (3, 0.8, 0.4)), 2, "dev")["iterations"] == [1, 2, 3]
    assert collapse(pts((1, 0.5, 0.6), (2, 0.7, 0.5)), 0, "dev") is None  # off
    # iterations without an evaluation (evaluation.every) are skipped: consecutive evaluated ones count
    skipped = pts((1, 0.5, 0.6), (3, 0.7, 0.5))
    skipped.append({"iteration": 2, "split": "train", "class": "all", "agreement": 0.9, "accuracy": None})
    assert collapse(skipped, 1, "dev")["iterations"] == [1, 3]


# -- test-time training ---------------------------------------------------------------------------


def unlabelled(monkeypatch, split: str = "test") -> None:
    """The toy task's ``split`` loses its gold answers (as CommonsenseQA's test split has none)."""
    real = scripted_plugin.ToyTask.load

    def load(self, name, path):
        examples = real(self, name, path)
        return [type(ex)(ex.id, ex.question, "", ex.cls, ex.fields) for ex in examples] if name == split else examples

    monkeypatch.setattr(scripted_plugin.ToyTask, "load", load)


def test_test_time_training_on_a_split_without_gold_answers(successors, toy_toml, monkeypatch, tmp_path):
    unlabelled(monkeypatch)
    (tmp_path / "test.txt").write_text("".join(f"{a}+{a % 7}\n" for a in range(10, 30)))
    task = f'reward = "majority_vote"\ntrain_split = "test"\ndata = {{ test = "{tmp_path / "test.txt"}" }}\n'
    path = ttrl_toml(toy_toml, "run", task=task)
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    gen = rows(run, "iterations/001/generated.parquet")
    assert {r["question_id"] for r in gen} == {f"test-{i}" for i in range(1, 21)} and {r["gold"] for r in gen} == {""}
    assert any(r["kept"] for r in rows(run, "iterations/001/rationales.parquet"))
    assert {r["checker"] for r in rows(run, "iterations/003/eval_dev.parquet")} == {"toy_exact"}
    # the same split with a reward that needs the gold answer: refused, naming the key
    res = main(["run", str(path), "--quiet", "--set", "task.reward=toy_exact",
                "--set", f"experiment.output_dir={tmp_path / 'gold'}"])
    assert res == 2 and not (tmp_path / "gold").exists()


def test_test_time_training_on_the_evaluated_split_itself(successors, toy_toml):
    path = ttrl_toml(toy_toml, "run", task='reward = "majority_vote"\ntrain_split = "dev"\n')
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    dev = {r["question_id"] for r in rows(run, "iterations/000/eval_dev.parquet")}
    assert {r["question_id"] for r in rows(run, "iterations/001/generated.parquet")} == dev


# -- bad inputs: one line naming the key, exit 2, nothing written ---------------------------------


@pytest.mark.parametrize("change, sets, key", [
    (dict(samples=2), [], "generation.samples_per_question"),
    (dict(rationalize=True), [], "rationalization.enabled"),
    (dict(task='checker = "majority_vote"\n'), [], "task.checker"),
    (dict(), ['evaluation.checkers=["majority_vote"]'], "evaluation.checkers[0]"),
    (dict(samples=1, task="", experiment="collapse_patience = 2\n"), [], "experiment.collapse_patience"),
    (dict(task='reward = "toy_exact"\ntrain_split = "test"\n'), [], "task.train_split"),
])
def test_bad_label_free_inputs_are_refused_before_anything_is_written(successors, toy_toml, monkeypatch, capsys,
                                                                     change, sets, key):
    unlabelled(monkeypatch)
    path = ttrl_toml(toy_toml, "run", **change)
    text = path.read_text()
    if "train_split" in text:
        (path.parent / "test.txt").write_text("1+2\n3+4\n")
        text = text.replace('train_split = "test"\n', 'train_split = "test"\ndata = { test = "test.txt" }\n')
    path.write_text(text)
    for command in ("validate", "run"):
        assert main([command, str(path), *(a for s in sets for a in ("--set", s))]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and key in err, err
    assert not (path.parent / "run").exists()


def test_a_tuner_probing_fewer_samples_than_the_vote_needs_is_named(successors, toy_toml):
    tuner = 'tuner = { name = "balance", temperatures = [0.2, 0.9], questions = 4, samples = 2, target = 2 }\n'
    path = ttrl_toml(toy_toml, "run", generation=tuner)
    assert main(["run", str(path), "--quiet"]) == 2


def test_a_tuners_probes_are_judged_by_the_vote(successors, toy_toml):
    tuner = 'tuner = { name = "balance", temperatures = [0.2, 0.9], questions = 4, samples = 4, target = 2 }\n'
    path = ttrl_toml(toy_toml, "run", generation=tuner)
    assert main(["run", str(path), "--quiet"]) == 0
    assert main(["run", str(path), "--quiet", "--set", "task.reward=toy_exact",
                 "--set", f"experiment.output_dir={path.parent / 'gold'}"]) == 0
    voted = rows(path.parent / "run", "iterations/001/tuning.parquet")
    gold = rows(path.parent / "gold", "iterations/001/tuning.parquet")
    # by the vote every probed question has a right answer (its majority's), by the gold answer not all
    assert all(r["distinct_correct"] >= 1 for r in voted) and any(r["distinct_correct"] < 1 for r in gold)
