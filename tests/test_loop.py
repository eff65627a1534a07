"""The STaR loop with the scripted backend: filtering, rationalization, restart, schedule, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_testkit import cli, scripted_env
from star_engine.cli import main


def rows(run: Path, rel: str) -> list[dict]:
    return pq.read_table(run / rel).to_pylist()


def model(run: Path, n: int) -> dict:
    return json.loads((run / f"iterations/{n:03d}/model/model.json").read_text())


def snapshot(run: Path) -> dict[str, object]:
    """Everything a run produces that must not depend on interruptions."""
    out: dict[str, object] = {}
    for p in sorted(run.rglob("*.parquet")):
        t = pq.read_table(p).to_pylist()
        for r in t:
            r.pop("wall_seconds", None)
        out[str(p.relative_to(run))] = t
    for p in sorted(run.rglob("model.json")):
        out[str(p.relative_to(run))] = p.read_text()
    for p in sorted(run.rglob("train.json")):
        info = json.loads(p.read_text())
        info.pop("seconds")
        out[str(p.relative_to(run))] = info
    return out


def test_filter_and_rationalization(scripted, toy_toml):
    path = toy_toml()
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    r1 = rows(run, "iterations/001/rationales.parquet")
    plain = [r for r in r1 if not r["was_hinted"]]
    hinted = [r for r in r1 if r["was_hinted"]]
    assert plain and hinted
    # Answer filter: wrong answers are never kept.
    assert all(not r["kept"] and r["rejected_by"] == "checker" for r in r1 if not r["correct"])
    assert all(r["kept"] for r in plain if r["correct"])
    # Rationalization covers exactly the questions the model got wrong.
    wrong = {r["question_id"] for r in plain if not r["correct"]}
    assert {r["question_id"] for r in hinted} == wrong
    # The stored context is the hint-free one; the prompt used had the hint.
    for r in hinted:
        assert "hint" not in r["prompt"] and r["prompt"].startswith("Q: ") and r["prompt"].endswith("A:")
    leaked = [r for r in hinted if "(hint:" in r["rationale"]]
    assert leaked and all(r["rejected_by"] == "toy_leak" and not r["kept"] for r in leaked)
    # Metrics agree with the rows.
    m = [x for x in rows(run, "metrics.parquet") if x["iteration"] == 1 and x["split"] == "train"
         and x["class"] == "all"][0]
    assert m["kept"] == sum(r["kept"] for r in r1)
    assert m["rationalized"] == sum(r["correct"] for r in hinted)
    assert m["correct"] == sum(r["correct"] for r in plain)
    assert {x["class"] for x in rows(run, "metrics.parquet") if x["split"] == "dev"} >= {"all", "1", "2", "3"}
    manifest = json.loads((run / "manifest.json").read_text())
    assert "iterations/001/rationales.parquet" in manifest["artifacts"]
    assert (run / "report.png").stat().st_size > 1000


def test_restart_from_base_and_schedule(scripted, toy_toml):
    path = toy_toml()
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    base_id = json.loads((run / "iterations/001/train.json").read_text())
    for n in (1, 2, 3):
        info = json.loads((run / f"iterations/{n:03d}/train.json").read_text())
        assert info["steps"] == 3 * n  # toy_linear schedule
        kept = [r for r in rows(run, f"iterations/{n:03d}/rationales.parquet") if r["kept"]]
        m = model(run, n)
        # Restart from base: the model's parent is the base init, and it knows only this iteration's data.
        assert m["lineage"][:1] == ["init"] and len(m["lineage"]) == 2
        assert set(m["learned"]) == {r["prompt"] for r in kept}
    assert base_id["steps"] == 3


def test_continue_mode_chains_models(scripted, toy_toml):
    path = toy_toml(extra="")
    text = path.read_text().replace("restart_from_base = true", "restart_from_base = false")
    path.write_text(text)
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    assert [len(model(run, n)["lineage"]) for n in (1, 2, 3)] == [2, 3, 4]


def test_packing_and_loss_reach_the_backend(scripted, toy_toml):
    """[training] packing / loss arrive in the backend's TrainSpec (defaults when unset)."""
    path = toy_toml()
    path.write_text(path.read_text().replace("restart_from_base = true",
                                             'restart_from_base = true\npacking = "stream"\nloss = "all"'))
    assert main(["run", str(path), "--quiet"]) == 0
    assert (model(path.parent / "run", 1)["packing"], model(path.parent / "run", 1)["loss"]) == ("stream", "all")
    other = toy_toml(out="run2", name="other.toml")
    assert main(["run", str(other), "--quiet"]) == 0
    assert (model(other.parent / "run2", 1)["packing"], model(other.parent / "run2", 1)["loss"]) == \
        ("segments", "completion")


def test_results_do_not_depend_on_batching(scripted, toy_toml, tmp_path):
    a = toy_toml("a", name="a.toml")
    b = toy_toml("b", name="b.toml")
    b.write_text(b.read_text().replace("batch_size = 4\nchunk_size = 5", "batch_size = 1\nchunk_size = 7"))
    assert main(["run", str(a), "--quiet"]) == 0
    assert main(["run", str(b), "--quiet"]) == 0
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


KILLS = ["generate:3", "generate:30", "generate:61", "train_step:2", "train_step:9", "checkpoint:2",
         "checkpoint:4"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    from star_testkit import TOY_TOML

    path = tmp / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp / "run").as_posix()))
    res = cli("run", str(path), "--quiet")
    assert res.returncode == 0, res.stderr
    return snapshot(tmp / "run")


@pytest.mark.parametrize("kill", KILLS)
def test_resume_after_sigkill_is_identical(toy_toml, reference, kill):
    path = toy_toml()
    run = path.parent / "run"
    res = cli("run", str(path), "--quiet", env=scripted_env(SCRIPTED_KILL=kill))
    assert res.returncode == -9, (kill, res.stderr)  # it really died mid-run
    res = cli("run", str(path), "--quiet")
    assert res.returncode == 0, res.stderr
    assert not list(run.rglob(".tmp-*"))
    assert snapshot(run) == reference


def test_rerun_of_finished_run_does_no_work(toy_toml, reference):
    path = toy_toml()
    assert cli("run", str(path), "--quiet").returncode == 0
    # Any generation or training step would now kill the process.
    for kill in ("generate:1", "train_step:1", "checkpoint:1"):
        res = cli("run", str(path), "--quiet", env=scripted_env(SCRIPTED_KILL=kill))
        assert res.returncode == 0, res.stderr
    assert snapshot(path.parent / "run") == reference


def test_damaged_artifact_is_redone(scripted, toy_toml, reference):
    path = toy_toml()
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    victim = run / "iterations/002/generated.parquet"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    (run / "iterations/003/model/model.json").write_text("{}")  # a tampered checkpoint
    assert main(["run", str(path), "--quiet"]) == 0
    events = (run / "events.jsonl").read_text()
    assert "damaged_artifact" in events and "iterations/002/generated.parquet" in events
    assert "damaged_checkpoint" in events
    assert snapshot(run) == reference


def test_extending_iterations_resumes(scripted, toy_toml, reference):
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=2"]) == 0
    run = path.parent / "run"
    assert not (run / "iterations/003").exists()
    assert main(["run", str(path), "--quiet"]) == 0
    assert snapshot(run) == reference


def test_changed_config_is_refused(scripted, toy_toml, capsys):
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1"]) == 0
    assert main(["run", str(path), "--quiet", "--set", "generation.temperature=0.7"]) == 2
    assert "generation.temperature" in capsys.readouterr().err


def test_gold_source_direct_baseline(scripted, toy_toml):
    path = toy_toml()
    args = ["run", str(path), "--quiet", "--set", "training.source=\"gold\"", "--set", "task.direct=true",
            "--set", "experiment.iterations=1", "--set", "task.filters=[]"]  # no filter runs on gold completions
    assert main(args) == 0
    r = rows(path.parent / "run", "iterations/001/rationales.parquet")
    assert len(r) == 24 and all(x["kept"] and x["rationale"].startswith(" The answer is") for x in r)
    assert not (path.parent / "run/iterations/001/generated.parquet").exists()


def _run(path, *sets):
    args = ["run", str(path), "--quiet"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return path.parent / "run"


def test_few_shot_train_keeps_prompt_in_stored_examples(scripted, toy_toml):
    run = _run(toy_toml(), "task.few_shot_train=true", "experiment.iterations=1")
    kept = [r for r in rows(run, "iterations/001/rationales.parquet") if r["kept"]]
    assert kept and all(r["prompt"].startswith("Q: 1+1\nA: one plus one.") for r in kept)
    assert all("hint" not in r["prompt"] for r in kept)  # hinted ones get the hint-free few-shot prompt


def test_show_hint_save_stores_hinted_context(scripted, toy_toml):
    run = _run(toy_toml(), "rationalization.p_show_hint_save=1.0", "experiment.iterations=1")
    hinted = [r for r in rows(run, "iterations/001/rationales.parquet") if r["was_hinted"]]
    assert hinted and all("(hint: " in r["prompt"] for r in hinted)


def test_no_prompt_evaluates_without_few_shot_after_fine_tuning(scripted, toy_toml):
    import hashlib

    run = _run(toy_toml(), "evaluation.no_prompt=true", "experiment.iterations=1")
    ev0 = {r["question_id"]: r["prompt_hash"] for r in rows(run, "iterations/000/eval_dev.parquet")}
    ev1 = {r["question_id"]: r["prompt_hash"] for r in rows(run, "iterations/001/eval_dev.parquet")}
    from star_testkit.scripted import ToyTask

    task = ToyTask()
    for ex in task.load("dev", None):
        ctx = task.context(ex)
        assert ev1[ex.id] == hashlib.sha256(ctx.encode()).hexdigest()[:16]
        assert ev0[ex.id] == hashlib.sha256((task.prompt("rationale") + ctx).encode()).hexdigest()[:16]


def test_n_train_samples_draws_a_seeded_subset_per_iteration(scripted, toy_toml):
    run = _run(toy_toml(), "generation.n_train_samples=10", "rationalization.enabled=false")
    ids = [{r["question_id"] for r in rows(run, f"iterations/{n:03d}/generated.parquet")} for n in (1, 2, 3)]
    assert all(len(s) == 10 for s in ids) and ids[0] != ids[1]
    assert not (run / "iterations/001/rationalized.parquet").exists()


def test_early_stop_on_dev_plateau(scripted, toy_toml):
    run = _run(toy_toml(), "experiment.early_stop_patience=1", "experiment.iterations=3")
    # The scripted model's dev accuracy never changes: iteration 2 does not improve on 1, so it stops.
    assert (run / "iterations/002").exists() and not (run / "iterations/003").exists()
    assert "early_stop" in (run / "events.jsonl").read_text()


def test_iteration_events_give_each_stages_seconds(scripted, toy_toml):
    run = _run(toy_toml(), "experiment.iterations=2")
    done = [json.loads(l) for l in (run / "events.jsonl").read_text().splitlines() if '"iteration_done"' in l]
    assert [e["iteration"] for e in done] == [0, 1, 2]
    assert set(done[0]["stage_seconds"]) == {"evaluate"}  # the evaluation before iteration 1
    for e in done[1:]:
        assert set(e["stage_seconds"]) >= {"generate", "train", "evaluate"}
        assert all(v >= 0 for v in e["stage_seconds"].values())


def test_evaluation_samples_with_its_own_temperature_and_top_p(scripted, toy_toml, generate_calls):
    def seen() -> list[tuple[float, float, int]]:
        return [(spec.temperature, spec.top_p, len(reqs)) for reqs, spec in generate_calls]

    _run(toy_toml(), "experiment.iterations=1", "generation.temperature=0.7", "generation.top_p=0.95")
    assert {(t, p) for t, p, _ in seen()} == {(0.7, 0.95), (0.0, 1.0)}  # evaluation: greedy by default
    assert sum(n for t, p, n in seen() if t == 0.0) == 2 * 12  # dev at iterations 0 and 1
    generate_calls.clear()
    path = toy_toml("run2", name="toy2.toml")
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1", "--set", "evaluation.temperature=0.01",
                 "--set", "evaluation.top_p=0.9"]) == 0
    assert {(t, p) for t, p, _ in seen()} == {(0.0, 1.0), (0.01, 0.9)}
    assert sum(n for t, p, n in seen() if t == 0.01) == 2 * 12


def test_task_trim_is_applied_before_checking_and_storing(scripted, toy_toml):
    plain = _run(toy_toml(), "experiment.iterations=1")
    before = {r["question_id"]: r for r in rows(plain, "iterations/001/generated.parquet")}
    assert any(r["correct"] for r in before.values())
    assert all("The answer is" in r["rationale"] for r in before.values())
    path = toy_toml("trimmed", name="trim.toml")
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1", "--set", 'task.dataset="toy_trim"']) == 0
    trimmed = path.parent / "trimmed"
    after = rows(trimmed, "iterations/001/generated.parquet")
    assert sorted(r["question_id"] for r in after) == sorted(before)
    # The stored rationale is the generation before "."; checked on that, nothing is right.
    for r in after:
        assert r["rationale"] == before[r["question_id"]]["rationale"].split(".")[0]
        assert r["predicted"] is None and not r["correct"]
    hinted = rows(trimmed, "iterations/001/rationalized.parquet")
    assert len(hinted) == len(after) and all("." not in r["rationale"] and not r["correct"] for r in hinted)
    evals = rows(trimmed, "iterations/001/eval_dev.parquet")
    assert evals and all("." not in r["generation"] and not r["correct"] for r in evals)


def test_direct_rationalization_uses_the_direct_hint_prompt(scripted, toy_toml, generate_calls):
    run = _run(toy_toml(), "experiment.iterations=1", "task.direct=true")
    prompts = [r.prompt for reqs, _ in generate_calls for r in reqs]
    hinted = [p for p in prompts if "(hint: " in p.split("\n\n")[-1]]
    assert hinted and all(p.startswith("Q: 1+1 (hint: 2)\nA: The answer is 2.\n\n") for p in hinted)
    assert all(p.startswith("Q: 1+1\nA: The answer is 2.\n\n") for p in prompts if p not in hinted)
    assert any(r["was_hinted"] for r in rows(run, "iterations/001/rationales.parquet"))


def test_a_prompt_kind_the_task_lacks_fails_before_the_run(scripted, toy_toml, monkeypatch, capsys):
    from star_testkit import scripted as scripted_plugin

    prompt = scripted_plugin.ToyTask.prompt
    monkeypatch.setattr(scripted_plugin.ToyTask, "prompt",
                        lambda self, kind: prompt(self, "nope" if kind == "direct_hint" else kind))
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "task.direct=true"]) != 0
    assert "'toy'.prompt raised KeyError" in capsys.readouterr().err
    assert not (path.parent / "run").exists()
