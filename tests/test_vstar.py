"""V-STaR as its Algorithm 1 (Hosseini et al. 2024), with the scripted backend: D_VER gathers the
gold solutions and the labelled samples of every iteration, one verifier is trained after the last
iteration from M0 (G_SFT), which is its reference, and it ranks the final generator's samples;
the per-iteration curves (``schedule = "cumulative"``) and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_testkit import cli, scripted_env

PLUGINS = "star_testkit.scripted,star_successors.plugin"


@pytest.fixture
def successors(scripted, monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", PLUGINS)


def rows(run: Path, rel: str) -> list[dict]:
    return pq.read_table(run / rel).to_pylist()


def vstar_toml(toy_toml, verifier: str = "", out: str = "run") -> Path:
    path = toy_toml(out, "\n[verifier]\nenabled = true\nsteps = 4\nbeta = 0.2\n" + verifier)
    text = path.read_text().replace('backend = "scripted"', 'backend = "scripted_verifier"')
    text = text.replace("batch_size = 4\n", "batch_size = 4\ntemperature = 0.7\nsamples_per_question = 3\n", 1)
    path.write_text(text)
    return path


def d_ver_pairs(run: Path, upto: int, gold: bool = True) -> set[tuple[str, str, str]]:
    """Every pair V-STaR forms from D_VER up to iteration ``upto``, restated from the run's files:
    per prompt, each correct solution (a hint-free sample judged right, or the question's gold
    solution when it has an incorrect sample) against each incorrect hint-free sample."""
    right: dict[str, set[str]] = {}
    wrong: dict[str, set[str]] = {}
    for n in range(1, upto + 1):
        for r in rows(run, f"iterations/{n:03d}/rationales.parquet"):
            if not r["was_hinted"]:
                (right if r["correct"] else wrong).setdefault(r["prompt"], set()).add(r["rationale"])
    if gold:  # the toy task's gold solution of "Q: a+b\nA:" (star_testkit.scripted.ToyTask.gold_completion)
        for prompt in wrong:
            a, b = prompt[3:prompt.index("\n")].split("+")
            right.setdefault(prompt, set()).add(f" add them. The answer is {int(a) + int(b)}.")
    return {(p, c, w) for p, ws in wrong.items() for c in right.get(p, ()) for w in ws if c != w}


def model(run: Path, n: int) -> dict:
    return json.loads((run / f"iterations/{n:03d}/verifier/model/model.json").read_text())


def test_one_verifier_after_the_last_iteration_on_every_iterations_samples_from_m0(successors, toy_toml):
    path = vstar_toml(toy_toml)
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    assert not any((run / f"iterations/{n:03d}/verifier").exists() for n in (1, 2))  # none before the last
    info = json.loads((run / "iterations/003/verifier/train.json").read_text())
    v = model(run, 3)
    pairs = {tuple(p) for p in v["pairs"]}
    assert len(pairs) == len(v["pairs"]) == info["examples"] and info["steps"] == 4
    # D_VER of all three iterations and the gold solutions, every correct x incorrect pair (no cap)
    assert pairs == d_ver_pairs(run, 3)
    assert any(c.startswith(" add them.") for _, c, _ in pairs)  # gold solutions are correct solutions
    earlier = d_ver_pairs(run, 2)
    assert earlier and earlier < pairs  # the earlier iterations' samples are in it
    # initialised from M0 (G_SFT: here the backend's base model), which is the frozen reference
    manifest = json.loads((run / "manifest.json").read_text())
    m0 = manifest["checkpoints"][manifest["base_checkpoint"]]["id"]
    assert v["lineage"][-1] == m0[:8]
    scores = rows(run, "iterations/003/verifier_dev.parquet")
    assert {r["reference_checkpoint"] for r in scores} == {m0}
    # it ranks the final generator's samples: verifier@k in the last iteration only
    dev = [r for r in rows(run, "metrics.parquet") if r["split"] == "dev"]
    assert {r["iteration"] for r in dev if r["verifier_at_k"] is not None} == {3}


def test_the_cap_the_generator_init_and_no_gold(successors, toy_toml):
    path = vstar_toml(toy_toml, 'max_pairs_per_question = 2\ninit = "generator"\ngold = false\n')
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    v = model(run, 3)
    pairs = [tuple(p) for p in v["pairs"]]
    per_prompt: dict[str, int] = {}
    for p, _, _ in pairs:
        per_prompt[p] = per_prompt.get(p, 0) + 1
    assert pairs and max(per_prompt.values()) <= 2 and set(pairs) <= d_ver_pairs(run, 3, gold=False)
    assert not any(c.startswith(" add them.") for _, c, _ in pairs)
    generator = json.loads((run / "iterations/003/train.json").read_text())
    assert v["lineage"][-1] == generator["checkpoint_id"][:8]  # M_3


def test_cumulative_trains_at_each_evaluating_iteration_on_d_ver_so_far(successors, toy_toml):
    path = vstar_toml(toy_toml, 'schedule = "cumulative"\n')
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    seen = []
    for n in (1, 2, 3):
        pairs = {tuple(p) for p in model(run, n)["pairs"]} if (run / f"iterations/{n:03d}/verifier/model").exists() \
            else set()
        assert pairs == d_ver_pairs(run, n)
        seen.append(pairs)
    assert seen[0] <= seen[1] <= seen[2] and seen[2]
    dev = [r for r in rows(run, "metrics.parquet") if r["split"] == "dev" and r["iteration"] > 0]
    assert all(r["verifier_at_k"] is not None for r in dev)


def test_rationalized_samples_pair_only_when_asked(successors, toy_toml):
    path = vstar_toml(toy_toml, "rationalized = true\ngold = false\n")
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    pairs = {tuple(p) for p in model(run, 3)["pairs"]}
    every = [r for n in (1, 2, 3) for r in rows(run, f"iterations/{n:03d}/rationales.parquet")]
    hinted_kept = {(r["prompt"], r["rationale"]) for r in every if r["was_hinted"] and r["kept"]}
    wrong = {(r["prompt"], r["rationale"]) for r in every if not r["was_hinted"] and not r["correct"]}
    assert hinted_kept
    # a kept rationalized sample is a correct solution of its (stored) prompt too
    expected = d_ver_pairs(run, 3, gold=False) | {(p, c, w) for p, c in hinted_kept for q, w in wrong if q == p}
    assert pairs == expected


@pytest.mark.parametrize("extra, words", [
    ("\n[training]\nsource = \"gold\"\n", ["verifier.schedule", "training.source"]),
    ("\n[experiment]\nearly_stop_patience = 2\n", ["verifier.schedule", "early_stop_patience", "cumulative"]),
    ("\n[experiment]\ncollapse_patience = 1\n", ["verifier.schedule", "collapse_patience", "cumulative"]),
])
def test_a_final_verifier_with_nothing_to_collect_or_no_last_iteration_is_refused(toy_toml, extra, words):
    path = vstar_toml(toy_toml)
    text = path.read_text()
    section, _, body = extra.strip().partition("\n")
    text = text.replace(section + "\n", section + "\n" + body + "\n", 1)  # into the existing table
    if "gold" in body:  # what gold training makes pointless (refused before) goes
        text = text.replace('filters = ["toy_leak"]\n', "")
    path.write_text(text)
    res = cli("run", str(path), "--quiet", env=scripted_env(STAR_ENGINE_PLUGINS=PLUGINS))
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and all(w in res.stderr for w in words)
    assert not (path.parent / "run").exists()
