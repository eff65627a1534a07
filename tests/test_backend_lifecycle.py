"""The core's calls into a backend's life (``Backend.start``, ``Backend.checkpoint_recorded``):
``run`` starts the backend once, after every check and before it writes anything, and
``validate`` never does; each stage that trained is reported recorded once its ``train.json``
is written (the scripted backend refuses an earlier call)."""

from __future__ import annotations

import pytest

from star_engine.cli import main
from star_testkit import scripted as scripted_plugin


@pytest.fixture
def lifecycle(scripted) -> list[tuple[str, str]]:
    """What the core asks of the scripted backend in this test (``scripted``: its plugin loaded)."""
    scripted_plugin.LIFECYCLE.clear()
    return scripted_plugin.LIFECYCLE


def test_validate_never_starts_the_backend(lifecycle, toy_toml):
    assert main(["validate", str(toy_toml())]) == 0
    assert lifecycle == []


def test_run_starts_once_and_reports_each_recorded_stage(lifecycle, toy_toml, tmp_path):
    path = toy_toml()
    assert main(["run", str(path), "--quiet"]) == 0
    run = tmp_path / "run"
    trained = sorted(p.parent / "model" for p in run.rglob("train.json") if (p.parent / "model").is_dir())
    assert trained, "the toy run trains"
    assert lifecycle[0] == ("start", "") and [e for e in lifecycle if e[0] == "start"] == [("start", "")]
    assert sorted(c for e, c in lifecycle if e == "recorded") == [str(p) for p in trained]
    lifecycle.clear()
    assert main(["run", str(path), "--quiet"]) == 0  # nothing left to do
    assert lifecycle[0] == ("start", "")
    assert {c for e, c in lifecycle if e == "recorded"} <= {str(p) for p in trained}


def test_a_report_before_the_record_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="before its stage's train.json"):
        scripted_plugin.ScriptedBackend().checkpoint_recorded(str(tmp_path / "iterations" / "001" / "model"))
