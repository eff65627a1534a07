"""One boundary for every command (star_engine/boundary.py): bad input is one line and exit code 2,
anything else a bug with its traceback and a line asking for a report (exit code 1); a run that
owns its directory records the failure in events.jsonl; nothing is written before a refusal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from star_testkit import TESTS, cli, scripted_env
from star_engine.cli import main
from star_engine.rundir.metrics import METRICS_SCHEMA


def one_line_error(err: str) -> str:
    assert err.startswith("error: "), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    return err


def events(run) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def files(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ bugs: traceback, report line, exit code 1


def test_a_bug_prints_its_traceback_asks_for_a_report_and_is_recorded(scripted, toy_toml, capsys, monkeypatch):
    import star_engine.run.runner as runner

    def broken(exp, store):
        return {}["no such key"]  # a bug in the core, after the run directory became this run's

    monkeypatch.setattr(runner, "run_star", broken)
    path = toy_toml()
    assert main(["run", str(path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "KeyError: 'no such key'" in err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith("error: KeyError: 'no such key' -- this is a bug in ") and "please report it" in last
    fatal = [e for e in events(path.parent / "run") if e["event"] == "fatal"]
    assert len(fatal) == 1 and fatal[0]["kind"] == "bug" and fatal[0]["exit_code"] == 1
    assert "KeyError: 'no such key'" in fatal[0]["traceback"] and "please report it" in fatal[0]["message"]


def test_a_plugin_command_bug_names_the_plugin_module(tmp_path):
    (tmp_path / "cmd_plugin.py").write_text(
        "from star_engine import hookimpl\n"
        "class Boom:\n"
        "    help = 'fails'\n"
        "    def add_arguments(self, parser):\n"
        "        pass\n"
        "    def run(self, args):\n"
        "        return 1 / 0\n"
        "@hookimpl\n"
        "def register_commands(register):\n"
        "    register('boom', Boom)\n")
    env = scripted_env(STAR_ENGINE_PLUGINS="cmd_plugin",
                       PYTHONPATH=os.pathsep.join([str(tmp_path), str(TESTS)]))
    res = cli("boom", env=env)
    assert res.returncode == 1
    assert "Traceback" in res.stderr and "ZeroDivisionError" in res.stderr
    assert res.stderr.rstrip().splitlines()[-1].startswith("error: ZeroDivisionError: division by zero -- this is a "
                                                          "bug in module cmd_plugin")


# ------------------------------------------------------------------ input failures mid-run are recorded


def test_a_refusal_mid_run_is_recorded_in_the_event_log(scripted, toy_toml, capsys, monkeypatch):
    """The backend refuses at its first generation (its validate_run is switched off, accepting
    anything, to let the run start): the one-line error also lands in events.jsonl, as the run's
    last event."""
    from star_testkit.scripted import ScriptedBackend

    monkeypatch.setattr(ScriptedBackend, "validate_run", lambda self, generation, training: None)
    path = toy_toml(extra="max_tokens = 8\n")
    assert main(["run", str(path), "--quiet"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert "generation.max_new_tokens: 32 is more than the scripted model's 8 tokens" in err
    last = events(path.parent / "run")[-1]
    assert last["event"] == "fatal" and last["kind"] == "UserError" and last["exit_code"] == 2
    assert last["message"] in err and "traceback" not in last


def test_refusals_before_the_run_owns_its_directory_are_not_logged_there(scripted, toy_toml, capsys):
    path = toy_toml()
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    before = files(run)
    changed = toy_toml(extra="", name="other.toml")
    changed.write_text(changed.read_text().replace("seed = 7", "seed = 8"))
    assert main(["run", str(changed), "--quiet"]) == 2
    assert "holds a run of a different configuration (changed: experiment.seed)" in capsys.readouterr().err
    assert files(run) == before


# ------------------------------------------------------------------ the filesystem refusing: one line


def test_output_dir_naming_a_file_is_one_line_for_validate_and_run(scripted, toy_toml, capsys):
    target = toy_toml().parent / "afile"
    target.write_text("mine")
    path = toy_toml(out="afile")
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = one_line_error(capsys.readouterr().err)
        assert f"{path}: experiment.output_dir: {target} exists and is not a folder" in err
    assert target.read_text() == "mine"


def test_output_dir_under_a_file_is_one_line(scripted, toy_toml, capsys):
    (toy_toml().parent / "afile").write_text("mine")
    path = toy_toml(out="afile/run")
    assert main(["validate", str(path)]) == 2
    assert "is not a folder" in one_line_error(capsys.readouterr().err)


def test_report_into_a_folder_named_like_its_output_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    pq.write_table(pa.Table.from_pylist([{"iteration": 0, "split": "dev", "class": "all", "accuracy": 0.5}],
                                        schema=METRICS_SCHEMA), run / "metrics.parquet")
    (run / "report.png").mkdir()
    assert main(["report", str(run)]) == 2
    assert "report.png" in one_line_error(capsys.readouterr().err)


def test_messages_stay_on_one_line(scripted, tmp_path, capsys):
    path = tmp_path / "toy.toml"
    path.write_text('[experiment]\nname = "toy"\niterations = 1\n"bad\\nkey" = 1\n[task]\ndataset = "toy"\n'
                    '[model]\nbackend = "scripted"\n')
    assert main(["validate", str(path)]) == 2
    assert "unknown key 'experiment.bad\\nkey'" in one_line_error(capsys.readouterr().err)


# ------------------------------------------------------------------ pipes


def test_plugins_into_a_closed_pipe_exits_quietly(tmp_path):
    env = scripted_env()
    p = subprocess.Popen([sys.executable, "-m", "star_engine", "plugins"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()  # the reader is gone before anything is written (`star-engine plugins | true`)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0 and b"Traceback" not in err and b"Error" not in err, err
