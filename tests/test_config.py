"""Bad experiment files: one clear line naming file:line:col or the key path, exit 2, nothing written."""

from __future__ import annotations


import pytest

from star_testkit import TOY_TOML, cli
from star_engine.cli import main
from star_engine.config.load import load_experiment

GOOD = TOY_TOML


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# (name, transform of the good TOML, text the message must contain)
CASES = [
    ("syntax_unclosed_table", lambda t: t.replace("[generation]", "[generation"), "toy.toml:{line[generation}:"),
    ("syntax_bad_value", lambda t: _edit(t, "batch_size = 4", "batch_size = four"), "toy.toml:{line= four}:"),
    ("syntax_duplicate_key", lambda t: _edit(t, "batch_size = 4", "batch_size = 4\nbatch_size = 5"),
     "toy.toml:{line= 5}:"),
    ("misspelled_key", lambda t: _edit(t, "max_new_tokens", "max_new_token"), "generation.max_new_token"),
    ("misspelled_section", lambda t: _edit(t, "[rationalization]", "[rationalisation]"), "'rationalisation'"),
    ("string_for_int", lambda t: _edit(t, "batch_size = 4", 'batch_size = "4"'), "generation.batch_size: expected an integer"),
    ("float_for_int", lambda t: _edit(t, "iterations = 3", "iterations = 3.5"), "experiment.iterations: expected an integer"),
    ("bool_for_int", lambda t: _edit(t, "seed = 7", "seed = true"), "experiment.seed: expected an integer"),
    ("missing_name", lambda t: _edit(t, 'name = "toy"\n', ""), "missing required key 'experiment.name'"),
    ("missing_dataset", lambda t: _edit(t, 'dataset = "toy"\n', ""), "missing required key 'task.dataset'"),
    ("missing_model", lambda t: t.split("[model]")[0], "missing required table 'model'"),
    ("missing_backend", lambda t: _edit(t, 'backend = "scripted"', 'preset = "tiny"'), "model.backend"),
    ("negative_iterations", lambda t: _edit(t, "iterations = 3", "iterations = 0"), "experiment.iterations: must be >= 1"),
    ("p_out_of_range", lambda t: _edit(t, "p_rationalization = 1.0", "p_rationalization = 1.5"),
     "rationalization.p_rationalization: must be in [0, 1]"),
    ("top_p_zero", lambda t: t + "", None),  # placeholder replaced below
    ("bad_source", lambda t: _edit(t, "restart_from_base = true", 'restart_from_base = true\nsource = "silver"'),
     "training.source: must be one of generated, gold"),
    ("bad_packing", lambda t: _edit(t, "restart_from_base = true", 'restart_from_base = true\npacking = "pack"'),
     "training.packing: must be one of segments, stream, none"),
    ("bad_loss", lambda t: _edit(t, "restart_from_base = true", 'restart_from_base = true\nloss = "prompt"'),
     "training.loss: must be one of completion, all"),
    ("unknown_task", lambda t: _edit(t, 'dataset = "toy"', 'dataset = "tyo"'),
     "task.dataset: unknown task 'tyo'; available: toy, toy_trim (did you mean 'toy'?)"),
    ("unknown_filter", lambda t: _edit(t, 'filters = ["toy_leak"]', 'filters = ["toy_lek"]'),
     "task.filters[0]: unknown filter 'toy_lek'"),
    ("unknown_backend", lambda t: _edit(t, 'backend = "scripted"', 'backend = "scriptd"'),
     "model: unknown backend 'scriptd'"),
    ("unknown_schedule", lambda t: _edit(t, 'name = "toy_linear"', 'name = "linear"'),
     "training.schedule: unknown schedule 'linear'"),
    ("unknown_option", lambda t: _edit(t, "per_iteration = 3", "per_iteraton = 3"),
     "training.schedule.per_iteraton: unknown option"),
    ("component_table_without_name", lambda t: _edit(t, '{ name = "toy_linear", per_iteration = 3 }', "{ per_iteration = 3 }"),
     "training.schedule: expected a name or a table with 'name'"),
    ("filters_not_list", lambda t: _edit(t, 'filters = ["toy_leak"]', 'filters = "toy_leak"'), "task.filters: expected a list"),
    ("section_not_table", lambda t: "evaluation = 3\n" + t.replace("[evaluation]\nsplits = [\"dev\"]", ""),
     "evaluation: expected a table"),
    ("unknown_backend_option", lambda t: t + "colour = 3\n", "model.colour: unknown option for backend 'scripted'"),
    ("eval_top_p_zero", lambda t: _edit(t, 'splits = ["dev"]', 'splits = ["dev"]\ntop_p = 0'),
     "evaluation.top_p: must be in (0, 1]"),
    ("eval_negative_temperature", lambda t: _edit(t, 'splits = ["dev"]', 'splits = ["dev"]\ntemperature = -0.5'),
     "evaluation.temperature: must be >= 0"),
    ("missing_data_file", lambda t: _edit(t, 'filters = ["toy_leak"]', 'filters = ["toy_leak"]\ndata = { train = "nope.txt" }'),
     "task.data.train: no such file"),
]
CASES[14] = ("top_p_zero", lambda t: _edit(t, "batch_size = 4", "batch_size = 4\ntop_p = 0.0"),
             "generation.top_p: must be in (0, 1]")


@pytest.mark.parametrize("name,transform,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_toml(scripted, tmp_path, capsys, name, transform, expected):
    path = tmp_path / "toy.toml"
    text = transform(GOOD.format(out=(tmp_path / "run").as_posix()))
    path.write_text(text)
    if "{line" in expected:  # syntax errors: the 1-based line holding the marker
        marker = expected.split("{line")[1].split("}")[0]
        lineno = next(i for i, ln in enumerate(text.splitlines(), 1) if marker in ln)
        expected = expected.split("{line")[0] + f"{lineno}" + expected.split("}", 1)[1]
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert expected in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert str(path) in err or "task.data" in err
    assert not (tmp_path / "run").exists()  # nothing written


def test_cli_process_has_no_traceback(tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text(GOOD.format(out=(tmp_path / "run").as_posix()).replace("max_new_tokens", "max_new_token"))
    res = cli("validate", str(path))
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and "Traceback" not in res.stderr
    assert "generation.max_new_token" in res.stderr and "did you mean 'max_new_tokens'" in res.stderr


def test_bad_data_row_names_file_and_line(scripted, tmp_path, capsys):
    data = tmp_path / "train.txt"
    data.write_text("1+2\n3+4\nfive+6\n")
    path = tmp_path / "toy.toml"
    path.write_text(GOOD.format(out=(tmp_path / "run").as_posix())
                    .replace('filters = ["toy_leak"]', 'filters = ["toy_leak"]\ndata = { train = "train.txt" }'))
    assert main(["run", str(path)]) == 2
    assert f"{data}:3: expected 'a+b'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_set_overrides_and_defaults(scripted, tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text(GOOD.format(out="r"))
    cfg = load_experiment(path, ["generation.batch_size=16", "task.options.n_train=5", 'experiment.name="x"',
                                 "training.optimizer.lr=3e-4"], limit=4).as_dict()
    assert cfg["generation"]["batch_size"] == 16 and cfg["task"]["options"] == {"n_train": 5}
    assert cfg["experiment"]["name"] == "x" and cfg["experiment"]["limit"] == 4
    assert cfg["training"]["optimizer"]["lr"] == 3e-4 and cfg["training"]["optimizer"]["warmup_steps"] == 100
    assert cfg["rationalization"]["p_show_hint_save"] == 0.0
    assert (cfg["evaluation"]["temperature"], cfg["evaluation"]["top_p"]) == (0.0, 1.0)  # greedy
    for section in ("training", "base_training"):  # how a backend batches, and what carries loss
        assert cfg[section]["packing"] == "segments" and cfg[section]["loss"] == "completion"
    cfg = load_experiment(path, ['training.packing="stream"', 'training.loss="all"', 'base_training.packing="none"',
                                 "base_training.steps=5"]).as_dict()
    assert (cfg["training"]["packing"], cfg["training"]["loss"], cfg["base_training"]["packing"]) == \
        ("stream", "all", "none")


def test_set_bad_type_names_key(scripted, tmp_path, capsys):
    path = tmp_path / "toy.toml"
    path.write_text(GOOD.format(out=(tmp_path / "run").as_posix()))
    assert main(["validate", str(path), "--set", "generation.batch_size=big"]) == 2
    assert "generation.batch_size: expected an integer, got string 'big'" in capsys.readouterr().err


def test_relative_paths_resolve_against_toml(scripted, tmp_path):
    sub = tmp_path / "exp"
    sub.mkdir()
    path = sub / "toy.toml"
    path.write_text(GOOD.format(out="r") + 'weights_path = "../ckpt"\n')
    cfg = load_experiment(path).as_dict()
    assert cfg["model"]["weights_path"] == str((tmp_path / "ckpt").resolve())
    assert cfg["experiment"]["output_dir"] == str((sub / "r").resolve())  # one rule: relative to the file
