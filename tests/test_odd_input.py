"""Input the usual checks let through: JSON strings escaping a lone UTF-16 surrogate (valid
JSON, no text), command-line bytes that are not UTF-8, a run directory's file that is a named
pipe, a TOML file with a byte-order mark, argparse's own errors, a data root that is not a
folder. Each is one line naming the file, argument or key, exit code 2, nothing written; the
byte-order mark is read as editors mean it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from star_engine import UserError
from star_engine.helpers import read_jsonl
from star_engine.cli import main
from star_testkit import scripted_env


def one_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_lone_surrogate_escape_in_a_data_file_is_named_by_its_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"q": "a pair \\ud83d\\ude00 is a character"}\n\n{"q": "x \\ud800 y"}\n')
    with pytest.raises(UserError, match=rf"^{path}:3: invalid JSON: a string escapes a lone UTF-16 surrogate"):
        read_jsonl(path)
    path.write_bytes(b'{"q\\udfff": 1}\n')  # in a key too
    with pytest.raises(UserError, match=rf"^{path}:1: invalid JSON"):
        read_jsonl(path)
    path.write_bytes(b'{"q": "a pair \\ud83d\\ude00"}\n')
    assert read_jsonl(path)[0][1]["q"] == "a pair \U0001F600"


def test_command_line_bytes_that_are_not_utf8_are_refused(scripted, toy_toml, capsys):
    path = toy_toml()
    bad = b"experiment.name=\xff".decode("utf-8", "surrogateescape")  # as Python hands such argv over
    assert main(["run", str(path), "--set", bad]) == 2
    assert "not valid UTF-8" in one_line(capsys.readouterr().err)
    assert main(["report", str(path.parent), "--label", b"a\xffb".decode("utf-8", "surrogateescape")]) == 2
    assert "argument a\\udcffb: not valid UTF-8" in one_line(capsys.readouterr().err)
    assert not (path.parent / "run").exists()


def test_argparse_errors_are_one_line(capsys):
    for argv, says in ((["validate", "x.toml", "--limit", "abc"], "argument --limit: invalid int value: 'abc'"),
                       (["bogus"], "invalid choice: 'bogus'"), (["convert"], "the following arguments are required")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and says in one_line(capsys.readouterr().err)


def test_a_toml_file_with_a_byte_order_mark_reads_as_without(scripted, toy_toml, capsys):
    path = toy_toml()
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_run_file_that_is_a_named_pipe_is_refused_not_waited_on(scripted, toy_toml, capsys):
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1"]) == 0
    run = path.parent / "run"
    (run / "metrics.parquet").unlink()
    os.mkfifo(run / "metrics.parquet")
    res = subprocess.run([sys.executable, "-m", "star_engine", "report", str(run)], env=scripted_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "metrics.parquet: unreadable metrics file (not a regular file)" in one_line(res.stderr)


def test_a_data_root_that_is_not_a_folder_is_refused(tmp_path, capsys):
    for root, says in ((tmp_path / "none", "is not a folder (no such path)"), (Path(__file__), "is not a folder")):
        assert main(["data", "check", "--root", str(root)]) == 2
        assert says in one_line(capsys.readouterr().err)


def test_a_set_key_with_an_index_is_blamed_on_its_set(scripted, toy_toml, capsys):
    path = toy_toml()
    assert main(["validate", str(path), "--set", "task.filters[0]=x"]) == 2
    assert one_line(capsys.readouterr().err).startswith("error: --set task.filters[0]=x: unknown key 'task.filters[0]'")


def test_a_report_that_cannot_be_written_leaves_the_other_untouched(scripted, toy_toml, capsys):
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1"]) == 0
    run = path.parent / "run"
    (run / "report.md").unlink()
    (run / "report.md").mkdir()
    before = (run / "report.png").read_bytes()
    (run / "report.png").write_bytes(b"an older plot")
    assert main(["report", str(run)]) == 2
    assert "report.md: exists and is not a file" in one_line(capsys.readouterr().err)
    assert (run / "report.png").read_bytes() == b"an older plot" != before


@pytest.mark.parametrize("sets,says", [
    (['experiment.name=""'], "experiment.name: must not be empty"),
    (['experiment.name="../../elsewhere"', 'experiment.output_dir=""'],
     "experiment.name: '../../elsewhere' names the run's folder runs/../../elsewhere"),
    (['evaluation.splits=["dev", "dev"]'], "evaluation.splits: 'dev' listed more than once"),
    ([f'experiment.output_dir="{"x" * 256}/run"'], "experiment.output_dir: a folder name of 256 bytes"),
    ([f'experiment.name="{"é" * 128}"', 'experiment.output_dir=""'], "experiment.name: a folder name of 256 bytes"),
    (["generation.samples_per_question=1000000000"], "generation.samples_per_question: 1,000,000,000 samples x 24 "
                                                     "train questions = 24,000,000,000 generations in one stage"),
    (["evaluation.samples_per_question=10000000", "evaluation.sample_temperature=1.0"],
     "evaluation.samples_per_question: 10,000,000 samples x 12 dev questions"),
])
def test_a_name_or_split_list_that_cannot_be_meant_is_refused(scripted, toy_toml, capsys, sets, says):
    """An empty name; a name that, as the run's folder (no output_dir), would leave runs/; a
    split evaluated twice over; a folder name longer than file systems allow (bytes, not
    characters), blamed on the key instead of an OSError; more generations in one stage than a
    record file holds (the requests would be built in memory first)."""
    path = toy_toml()
    assert main(["validate", str(path), *[a for s in sets for a in ("--set", s)]]) == 2
    assert says in one_line(capsys.readouterr().err)


def test_a_nested_name_is_a_nested_folder_under_runs(scripted, toy_toml, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = toy_toml()
    assert main(["validate", str(path), "--set", 'experiment.name="cqa/rationalize"', "--set",
                 'experiment.output_dir=""']) == 0
    assert f"run directory {path.parent / 'runs' / 'cqa' / 'rationalize'}: new" in capsys.readouterr().out
