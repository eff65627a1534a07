"""What a run records agrees with itself: ``generated.parquet`` and ``rationalized.parquet`` make
no claim about what was kept (``rationales.parquet`` decides it, with what rejected the rest),
and ``config.json``'s ``[model]`` names every option the backend ran with, its defaults included,
while a run directory written before that resumes as the same configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from star_engine.cli import main
from star_engine.rundir.records import UNSELECTED
from star_engine.config.registry import option_defaults

SCRIPTED_DEFAULTS = {"backend": "scripted", "easy_mod": 3, "leak_mod": 2, "max_tokens": 0}


def run(path: Path, *overrides: str) -> int:
    args = ["run", str(path), "--quiet"]
    for o in overrides:
        args += ["--set", o]
    return main(args)


def rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_stage_files_leave_the_selection_to_rationales_parquet(scripted, toy_toml):
    path = toy_toml()
    assert run(path, "experiment.iterations=2") == 0
    it = path.parent / "run" / "iterations" / "001"
    selected = {(r["question_id"], r["sample"], r["was_hinted"]): r for r in rows(it / "rationales.parquet")}
    stage_rows = []
    for name in ("generated", "rationalized"):
        names = pq.read_schema(it / f"{name}.parquet").names
        assert not set(UNSELECTED) & set(names), f"{name}.parquet claims what was kept"
        stage_rows += rows(it / f"{name}.parquet")
    assert sorted((r["question_id"], r["sample"], r["was_hinted"]) for r in stage_rows) == sorted(selected)
    for r in stage_rows:  # the same candidates, judged alike
        s = selected[(r["question_id"], r["sample"], r["was_hinted"])]
        assert {k: v for k, v in s.items() if k not in UNSELECTED} == r
    verdicts = {(s["correct"], s["kept"], s["rejected_by"]) for s in selected.values()}
    assert verdicts == {(False, False, "checker"), (True, True, None), (True, False, "toy_leak")}


def test_config_json_names_the_backend_defaults(scripted, toy_toml):
    path = toy_toml()
    assert run(path, "experiment.iterations=1") == 0
    assert json.loads((path.parent / "run" / "config.json").read_text())["model"] == SCRIPTED_DEFAULTS
    other = toy_toml(out="set", name="set.toml")
    assert run(other, "experiment.iterations=1", "model.easy_mod=5") == 0
    assert json.loads((path.parent / "set" / "config.json").read_text())["model"] == {**SCRIPTED_DEFAULTS,
                                                                                       "easy_mod": 5}


def test_a_run_directory_without_the_defaults_resumes_and_a_changed_default_is_refused(scripted, toy_toml, capsys):
    path = toy_toml()
    assert run(path, "experiment.iterations=1") == 0
    config = path.parent / "run" / "config.json"
    cfg = json.loads(config.read_text())
    cfg["model"] = {"backend": "scripted"}  # as a version before the defaults were recorded wrote it
    config.write_text(json.dumps(cfg))
    assert run(path, "experiment.iterations=2") == 0  # the same configuration: resumed, one more iteration
    assert json.loads(config.read_text())["model"] == SCRIPTED_DEFAULTS
    assert (path.parent / "run" / "iterations" / "002" / "rationales.parquet").is_file()
    cfg = json.loads(config.read_text())
    cfg["model"]["easy_mod"] = 4  # a run of a backend whose default was another
    config.write_text(json.dumps(cfg))
    capsys.readouterr()
    assert run(path, "experiment.iterations=3") == 2
    assert "holds a run of a different configuration (changed: model.easy_mod)" in capsys.readouterr().err


def test_option_defaults_are_json_values():
    class Backend:
        def __init__(self, required, *, mesh=(1, 2), dtype=None, device=object(), rate=float("nan"), **more):  # noqa: B008
            pass

    assert option_defaults(Backend) == {"mesh": [1, 2], "dtype": None}  # no object, no NaN, no **more
    assert option_defaults(len) == {}
