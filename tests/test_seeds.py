"""``run FILE --seeds 0,1,2`` and ``[sweep]``: one run per seed / combination, each in its own
folder, every one checked before any runs, the whole resumable; bad input is one line, exit
code 2, nothing written. Runs of the toy experiment with the scripted backend (one iteration)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from star_engine.cli import main
from star_engine.config.load import load_experiment
from star_engine.run.sweep import Member, plan, shown


@pytest.fixture
def toy(toy_toml):
    """The toy experiment, one iteration; ``extra``: TOML appended (a [sweep] table)."""

    def make(extra: str = "") -> Path:
        path = toy_toml(extra=extra)
        path.write_text(path.read_text().replace("iterations = 3", "iterations = 1"))
        return path

    return make


def folders(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.is_dir())


def config(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())


def test_seeds_run_in_their_folders_and_a_rerun_skips_the_finished(scripted, toy, tmp_path, capsys):
    path = toy()
    assert main(["run", str(path), "--seeds", "0", "--quiet"]) == 0  # one seed first: the rerun resumes the rest
    first = (tmp_path / "run_seed0" / "manifest.json").read_bytes()
    assert main(["run", str(path), "--seeds", "0,2"]) == 0
    out = capsys.readouterr().out
    assert folders(tmp_path) == ["run_seed0", "run_seed2"]  # no run of the file's own folder
    assert [config(tmp_path / f"run_seed{s}")["experiment"]["seed"] for s in (0, 2)] == [0, 2]
    assert config(tmp_path / "run_seed2")["experiment"]["output_dir"] == str(tmp_path / "run_seed2")
    assert (tmp_path / "run_seed0" / "manifest.json").read_bytes() == first  # finished: not touched again
    assert f"2 runs of {path}:\n  {tmp_path / 'run_seed0'}: finished before; skipped\n" \
           f"  {tmp_path / 'run_seed2'}: finished\n" in out
    assert out.rstrip().endswith(f"see them together: star-engine compare {tmp_path / 'run_seed0'} "
                                 f"{tmp_path / 'run_seed2'} --out comparisons/toy")
    assert main(["run", str(path), "--seeds", "0,2"]) == 0
    assert capsys.readouterr().out.count("finished before; skipped") == 2


def test_a_raised_iteration_count_resumes_each_seed(scripted, toy, tmp_path, capsys):
    path = toy()
    assert main(["run", str(path), "--seeds", "1,3", "--quiet"]) == 0
    assert main(["run", str(path), "--seeds", "1,3", "--set", "experiment.iterations=2"]) == 0
    assert capsys.readouterr().out.count("resumed, finished") == 2
    for s in (1, 3):
        assert (tmp_path / f"run_seed{s}" / "iterations" / "002").is_dir()


def test_a_finished_member_is_released_while_the_next_one_runs(scripted, toy, tmp_path, monkeypatch):
    """Each member's run-directory lock ends with its run, not with the command: while seed 2
    runs, seed 0's folder is held by no one (``status`` says finished, ``validate`` finished)."""
    from star_engine.rundir import runlock
    from star_engine.run import runner

    held_while_next: list = []
    real = runner.run

    def run(exp, path):
        if exp.run_dir.name == "run_seed2":
            held_while_next.append(runlock.holder(tmp_path / "run_seed0"))
        return real(exp, path)

    monkeypatch.setattr(runner, "run", run)
    assert main(["run", str(toy()), "--seeds", "0,2", "--quiet"]) == 0
    assert held_while_next == [None]


def test_a_sweep_runs_the_product_of_its_lists(scripted, toy, tmp_path, capsys):
    path = toy('\n[sweep]\n"generation.temperature" = [0.0, 0.5]\ntraining.batch_size = [4]\n')
    assert main(["validate", str(path), "--seeds", "0,1"]) == 0  # checks every member, writes nothing
    out = capsys.readouterr().out
    assert out.count(": OK (run directory ") == 4 and out.rstrip().endswith("4 runs, all OK")
    assert folders(tmp_path) == []
    assert main(["run", str(path), "--quiet"]) == 0  # the sweep alone: 2 x 1 runs, named after their values
    names = ["run_generation.temperature=0.0_training.batch_size=4",
             "run_generation.temperature=0.5_training.batch_size=4"]
    assert folders(tmp_path) == names
    for name, t in zip(names, (0.0, 0.5)):
        cfg = config(tmp_path / name)
        assert cfg["generation"]["temperature"] == t and cfg["training"]["batch_size"] == 4
        assert "sweep" not in cfg and cfg["experiment"]["seed"] == 7  # the file's seed; no [sweep] in config.json


def test_a_file_without_sweep_loads_as_before(scripted, toy):
    path = toy()
    cfg = load_experiment(path)
    assert "sweep" not in cfg.as_dict() and plan(path, [], None) is None
    swept = toy('\n[sweep]\n"generation.temperature" = [0.5]\n')
    assert load_experiment(swept) == cfg  # the table is checked and left out


@pytest.mark.parametrize("extra,seeds,says", [
    ('"generation.temprature" = [0.5]', None,
     "[sweep] generation.temprature: no such configuration key (did you mean 'generation.temperature'"),
    ('"generaton.temperature" = [0.5]', None, "did you mean 'generation.temperature'"),
    ('"generation.temperature.x" = [0.5]', None, "generation.temperature is a single value, not a table"),
    ('"generation" = [{}]', None, "[sweep] generation: a whole section"),
    ('"sweep.x" = [1]', None, "[sweep] sweep.x: no such configuration key"),
    ('"experiment.output_dir" = ["a", "b"]', None, "each run's folder is named after its values"),
    ('"generation.temperature" = []', None, "expected a non-empty list of values, got []"),
    ('"generation.temperature" = 0.5', None, "expected a non-empty list of values, got 0.5"),
    ('"generation.temperature" = [0.5, 0.5]', None, "0.5 listed more than once"),
    ('"task.options.x" = ["a b", "a-b"]', None, "would share the run directory suffix 'task.options.x=a-b'"),
    ('"generation.temperature" = [0.5, -1.0]', None,
     "generation.temperature: must be >= 0, got -1.0 (the run generation.temperature=-1.0 of the sweep)"),
    ('"experiment.seed" = [1, 2]', "3", "--seeds 3: [sweep] in"),
    ("", "", "--seeds : expected comma-separated whole numbers >= 0"),
    ("", "0,,1", "--seeds 0,,1: expected"),
    ("", "a", "--seeds a: expected"),
    ("", "-1", "--seeds -1: expected"),
    ("", "0.5", "--seeds 0.5: expected"),
    ("", "1,2,1", "--seeds 1,2,1: 1 given more than once"),
])
@pytest.mark.parametrize("command", ["run", "validate"])
def test_bad_sweeps_and_seeds_are_one_line_exit_2_nothing_written(scripted, toy, tmp_path, capsys, extra, seeds,
                                                                  says, command):
    path = toy(f"\n[sweep]\n{extra}\n" if extra else "")
    quiet = ["--quiet"] if command == "run" else []
    assert main([command, str(path), *(["--seeds", seeds] if seeds is not None else []), *quiet]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
    assert folders(tmp_path) == []  # no member ran, not even the good ones before the bad one


def test_a_set_of_a_swept_key_is_refused(scripted, toy, tmp_path, capsys):
    path = toy('\n[sweep]\n"generation.temperature" = [0.0, 0.5]\n')
    assert main(["run", str(path), "--set", "generation.temperature=0.7"]) == 2
    assert "--set generation.temperature=0.7: generation.temperature is swept ([sweep] in" in capsys.readouterr().err
    assert main(["run", str(path), "--seeds", "1", "--set", "experiment.seed=2"]) == 2
    assert "experiment.seed is swept (--seeds)" in capsys.readouterr().err
    assert folders(tmp_path) == []


def test_member_folder_names():
    assert shown(0.5) == "0.5" and shown(-1.0) == "-1.0" != shown(1.0) and shown(True) == "true" and shown("gsm8k/train") == "gsm8k-train"
    assert shown({"name": "regex", "x": 1}) == "name-regex-x-1"
    long_a, long_b = shown("a" * 60 + "1"), shown("a" * 60 + "2")
    assert len(long_a) == 40 and long_a != long_b  # cut, told apart by a hash
    assert shown("..") not in (".", "..")
    data: dict = {"experiment": {"name": "x"}}
    Member((("generation.temperature", 0.5), ("experiment.seed", 3)), "g_seed3").apply(data)
    assert data == {"experiment": {"name": "x", "seed": 3, "output_dir": "runs/x_g_seed3"},
                    "generation": {"temperature": 0.5}}
