"""Bad input through the command line: one line naming file:line(:col) or the key path, exit 2, no
traceback, nothing written.

tests/test_config.py has 26 bad experiment files (syntax errors, misspelled keys and sections,
wrong types, missing keys, out-of-range values, unknown plugins and options, a missing data
file); the TOML cases here are only the kinds it does not have. The JSONL cases run
``star-engine validate`` in a subprocess on a CommonsenseQA or GSM8K experiment whose train or
dev file holds one bad row (or is bad as a whole).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from star_testkit import TESTS, TOY_TOML
from star_engine.cli import main


def one_line_error(err: str) -> str:
    assert err.startswith("error: "), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    return err


# ------------------------------------------------------------------ experiment files (kinds test_config.py lacks)


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _bytes(raw: bytes):
    return lambda t: raw


# (name, transform of the good TOML text (str -> str | bytes), expected text; {path} is the TOML file,
#  {line:<marker>} the 1-based line holding <marker>, {col:<marker>} its 1-based column)
TOML_CASES = [
    ("not_utf8", lambda t: _edit(t, 'name = "toy"', 'name = "t\xffy"').encode("latin-1"),
     "{path}:{line:name = }:{col:\xff}: not valid UTF-8 (byte 0xff)"),
    ("unterminated_string", lambda t: _edit(t, 'name = "toy"', 'name = "toy'),
     "{path}:{line:name = }:"),
    ("duplicate_table", lambda t: t + "\n[generation]  # again\nbatch_size = 2\n", "{path}:{line:# again}:"),
    ("empty_file", lambda t: "", "{path}: missing required key 'experiment.name'"),
    ("nested_unknown_key", lambda t: t + "\n[training.optimizer]\nlrr = 1e-3\n",
     "{path}: unknown key 'training.optimizer.lrr' (did you mean 'lr'?)"),
    ("nested_bad_choice", lambda t: t + "\n[training.optimizer]\nschedule = \"exp\"\n",
     "training.optimizer.schedule: must be one of constant, linear, cosine, got 'exp'"),
    ("infinite_float", lambda t: t + "\n[training.optimizer]\nlr = inf\n",
     "training.optimizer.lr: must be a finite number, got inf"),
    ("nan_float", lambda t: _edit(t, "max_new_tokens = 32", "max_new_tokens = 32\ntemperature = nan"),
     "generation.temperature: must be a finite number, got nan"),
    ("negative_seed", lambda t: _edit(t, "seed = 7", "seed = -1"), "experiment.seed: must be >= 0, got -1"),
    ("empty_splits", lambda t: _edit(t, 'splits = ["dev"]', "splits = []"),
     "{path}: evaluation.splits: needs at least one split"),
    ("split_not_string", lambda t: _edit(t, 'splits = ["dev"]', 'splits = ["dev", 3]'),
     "evaluation.splits[1]: expected a string, got integer 3"),
    ("component_name_not_string",
     lambda t: _edit(t, 'filters = ["toy_leak"]', 'filters = ["toy_leak"]\nchecker = { name = 3 }'),
     "task.checker: expected a name or a table with 'name'"),
    ("filter_not_name", lambda t: _edit(t, 'filters = ["toy_leak"]', "filters = [1]"),
     "task.filters: expected a list of names or tables with 'name'"),
    ("data_path_not_string",
     lambda t: _edit(t, 'filters = ["toy_leak"]', 'filters = ["toy_leak"]\ndata = { train = 3 }'),
     "task.data.train: expected a path string, got integer 3"),
    ("backend_not_string", lambda t: _edit(t, 'backend = "scripted"', "backend = 3"), "model.backend"),
]


def _expected(template: str, path: Path, text: str) -> str:
    out = template.replace("{path}", str(path))
    for kind in ("line", "col"):
        while "{" + kind + ":" in out:
            marker = out.split("{" + kind + ":", 1)[1].split("}", 1)[0]
            lineno, line = next((i, ln) for i, ln in enumerate(text.splitlines(), 1) if marker in ln)
            value = lineno if kind == "line" else line.index(marker) + 1
            out = out.replace("{" + kind + ":" + marker + "}", str(value))
    return out


@pytest.mark.parametrize("name,transform,expected", TOML_CASES, ids=[c[0] for c in TOML_CASES])
def test_bad_toml(scripted, tmp_path, capsys, name, transform, expected):
    path = tmp_path / "toy.toml"
    good = TOY_TOML.format(out=(tmp_path / "run").as_posix())
    data = transform(good)
    raw = data if isinstance(data, bytes) else data.encode()
    path.write_bytes(raw)
    expected = _expected(expected, path, raw.decode("latin-1"))
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = one_line_error(capsys.readouterr().err)
        assert expected in err, (expected, err)
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize("args,expected", [
    (["--set", "generation.batch_size"], "--set generation.batch_size: expected dotted.key=value"),
    (["--set", "experiment..name=x"], "--set experiment..name=x: bad key 'experiment..name'"),
    (["--set", "experiment.name.first=x"], "'name' is not a table"),
    (["--set", "generation.chunk_size=0"], "generation.chunk_size: must be >= 1, got 0"),
    (["--limit", "0"], "--limit: must be >= 1"),
], ids=["set_without_value", "set_empty_key_part", "set_into_a_value", "set_out_of_range", "limit_zero"])
def test_bad_command_line_values(scripted, tmp_path, capsys, args, expected):
    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()))
    for command in ("validate", "run"):
        assert main([command, str(path), *args]) == 2
        assert expected in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_missing_or_unreadable_experiment_file(scripted, tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.toml")]) == 2
    assert f"{tmp_path / 'nope.toml'}: no such file" in one_line_error(capsys.readouterr().err)
    assert main(["validate", str(tmp_path)]) == 2  # a folder
    assert f"{tmp_path}: cannot read" in one_line_error(capsys.readouterr().err)


def test_output_dir_holding_other_files_is_refused(scripted, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=out.as_posix()))
    assert main(["run", str(path)]) == 2
    assert f"{out}: exists and is not a star-engine run directory" in one_line_error(capsys.readouterr().err)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# ------------------------------------------------------------------ JSONL data files, through the CLI

CQA_ROW = {"answerKey": "B", "id": "q1", "question": {
    "question_concept": "x", "stem": "Where is milk kept?",
    "choices": [{"label": "A", "text": "oven"}, {"label": "B", "text": "fridge"}, {"label": "C", "text": "roof"}]}}
GSM_ROW = {"question": "Tom has 3 apples and buys 2 more. How many apples does he have?",
           "answer": "He has 3+2 = <<3+2=5>>5 apples.\n#### 5"}


def _cqa(i: int, **changes) -> dict:
    row = json.loads(json.dumps(CQA_ROW))
    row["id"] = f"q{i}"
    for key, value in changes.items():
        target, field = (row["question"], key[2:]) if key.startswith("q_") else (row, key)
        if value is _DROP:
            del target[field]
        else:
            target[field] = value
    return row


_DROP = object()
_CHOICES = CQA_ROW["question"]["choices"]


def _lines(*rows) -> bytes:
    """Rows as JSONL bytes: dicts are dumped, bytes/str are written as they are."""
    out = []
    for r in rows:
        out.append(r if isinstance(r, bytes) else r.encode() if isinstance(r, str) else json.dumps(r).encode())
    return b"\n".join(out) + b"\n"


# (name, file content, where: "line", "line:*" (a column follows) or None (the whole file), text of the message)
CQA_CASES = [
    ("invalid_json", _lines(_cqa(1), _cqa(2), '{"id": "q3", "question": {"stem": "x",'), "3:*", "invalid JSON"),
    ("not_an_object", _lines(_cqa(1), _cqa(2), '["q3", "a list"]'), "3", "expected a JSON object, got a list"),
    ("missing_id", _lines(_cqa(1), _cqa(2), _cqa(3, id=_DROP)), "3", "missing field 'id'"),
    ("id_not_string", _lines(_cqa(1), _cqa(2), _cqa(3, id=3)), "3", "field 'id' must be a string, got an integer"),
    ("missing_stem", _lines(_cqa(1), _cqa(2), _cqa(3, q_stem=_DROP)), "3", "missing field 'question.stem'"),
    ("choices_not_list", _lines(_cqa(1), _cqa(2), _cqa(3, q_choices="A B C")), "3",
     "field 'question.choices' must be a list, got a string"),
    ("choice_not_object", _lines(_cqa(1), _cqa(2), _cqa(3, q_choices=[_CHOICES[0], "fridge"])), "3",
     "field 'question.choices[1]' must be an object"),
    ("label_not_a_letter", _lines(_cqa(1), _cqa(2), _cqa(3, q_choices=[{"label": "AB", "text": "x"}, _CHOICES[1]])),
     "3", "field 'question.choices[0].label' must be one letter"),
    ("duplicate_label", _lines(_cqa(1), _cqa(2), _cqa(3, q_choices=[_CHOICES[0], _CHOICES[0]])), "3",
     "duplicate label 'A'"),
    ("answer_names_no_choice", _lines(_cqa(1), _cqa(2), _cqa(3, answerKey="E")), "3",
     "field 'answerKey' is 'E', which names no choice"),
    ("missing_answer", _lines(_cqa(1), _cqa(2), _cqa(3, answerKey=_DROP)), "3", "missing field 'answerKey'"),
    ("one_choice", _lines(_cqa(1), _cqa(2), _cqa(3, q_choices=[_CHOICES[0]])), "3", "needs at least 2 choices, got 1"),
    ("duplicate_id", _lines(_cqa(1), _cqa(2), "", _cqa(1)), "4", "duplicate id 'q1' (first at {path}:1)"),
    ("not_utf8", _lines(_cqa(1), _cqa(2), b'{"id": "q\xff3"}'), "3", "not valid UTF-8 (byte 10 of the line)"),
    ("truncated_file", _lines(_cqa(1), _cqa(2))[:-40], "2:*", "invalid JSON"),
    ("empty_file", b"\n\n", None, "no examples (the file is empty)"),
]
GSM_CASES = [
    ("invalid_json", _lines(GSM_ROW, GSM_ROW, '{"question": "x" "answer": "#### 1"}'), "3:*", "invalid JSON"),
    ("not_an_object", _lines(GSM_ROW, GSM_ROW, '"just a string"'), "3", "expected a JSON object, got a string"),
    ("missing_question", _lines(GSM_ROW, GSM_ROW, {"answer": "#### 1"}), "3", "missing field 'question'"),
    ("missing_answer", _lines(GSM_ROW, GSM_ROW, {"question": "x?"}), "3", "missing field 'answer'"),
    ("question_not_string", _lines(GSM_ROW, GSM_ROW, {"question": 12, "answer": "#### 1"}), "3",
     "field 'question' must be a string, got an integer"),
    ("answer_null", _lines(GSM_ROW, GSM_ROW, {"question": "x?", "answer": None}), "3",
     "field 'answer' must be a string, got null"),
    ("empty_question", _lines(GSM_ROW, GSM_ROW, {"question": "   ", "answer": "#### 1"}), "3",
     "field 'question' is empty"),
    ("no_final_answer", _lines(GSM_ROW, GSM_ROW, {"question": "x?", "answer": "It is 4."}), "3",
     "field 'answer' has no final '#### <number>' line"),
    ("final_answer_not_number", _lines(GSM_ROW, GSM_ROW, {"question": "x?", "answer": "#### many"}), "3",
     "the final answer 'many' is not a number"),
    ("control_character", _lines(GSM_ROW, GSM_ROW, b'{"question": "a\x01b", "answer": "#### 1"}'), "3:*",
     "invalid JSON: Invalid control character"),
    ("not_utf8", _lines(GSM_ROW, b'{"question": "\xc3(", "answer": "#### 1"}'), "2", "not valid UTF-8"),
    ("blank_lines_then_bad_row", _lines(GSM_ROW, "", "   ", "[1, 2]"), "4", "expected a JSON object, got a list"),
    ("empty_file", b"", None, "no examples (the file is empty)"),
]

EXPERIMENT = """
[experiment]
name = "bad_data"
iterations = 1
output_dir = "{out}"

[task]
dataset = "{task}"
data = {{ train = "{train}", dev = "{dev}" }}

[model]
backend = "scripted"
"""


def cli_env() -> dict[str, str]:
    """The installed task plugins, the scripted backend (no model is built), no tracker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    env.update({"STAR_ENGINE_PLUGINS": "star_testkit.scripted", "STAR_ENGINE_BLOCK_PLUGINS": "tracking,haiku_xmap",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH", "")]))})
    return env


def validate(tmp_path: Path, task: str, content: bytes, split: str) -> tuple[subprocess.CompletedProcess, Path]:
    good_rows = _lines(_cqa(1), _cqa(2)) if task == "cqa" else _lines(GSM_ROW, GSM_ROW)
    (tmp_path / "good.jsonl").write_bytes(good_rows)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    files = {"train": "good.jsonl", "dev": "good.jsonl", split: "bad.jsonl"}
    toml = tmp_path / "exp.toml"
    toml.write_text(EXPERIMENT.format(out=(tmp_path / "run").as_posix(), task=task, **files))
    res = subprocess.run([sys.executable, "-m", "star_engine", "validate", str(toml)], capture_output=True, text=True,
                         env=cli_env(), cwd=tmp_path, timeout=120)
    return res, bad


def _check(res: subprocess.CompletedProcess, bad: Path, line: str | None, expected: str, tmp_path: Path) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    err = one_line_error(res.stderr)
    if line is None:
        assert f"{bad}: " in err, err
    elif line.endswith(":*"):
        assert re.search(rf"{re.escape(str(bad))}:{line[:-2]}:\d+: ", err), err
    else:
        assert f"{bad}:{line}: " in err, err
    assert expected.replace("{path}", str(bad)) in err, (expected, err)
    assert res.stdout == ""
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name,content,line,expected", CQA_CASES, ids=[c[0] for c in CQA_CASES])
def test_bad_cqa_jsonl(tmp_path, name, content, line, expected):
    res, bad = validate(tmp_path, "cqa", content, "dev" if name in ("duplicate_id", "empty_file") else "train")
    _check(res, bad, line, expected, tmp_path)


@pytest.mark.parametrize("name,content,line,expected", GSM_CASES, ids=[c[0] for c in GSM_CASES])
def test_bad_gsm8k_jsonl(tmp_path, name, content, line, expected):
    res, bad = validate(tmp_path, "gsm8k", content, "dev" if name == "empty_file" else "train")
    _check(res, bad, line, expected, tmp_path)


def test_good_files_validate(tmp_path):
    """The same experiments with good files pass: the failures above are the bad rows'."""
    for task, rows in (("cqa", _lines(_cqa(1), _cqa(2), _cqa(3))), ("gsm8k", _lines(GSM_ROW, GSM_ROW, GSM_ROW))):
        res, _ = validate(tmp_path, task, rows, "train")
        assert res.returncode == 0, res.stderr
        assert "OK" in res.stdout and "train=3" in res.stdout
        assert not (tmp_path / "run").exists()


def test_data_path_is_a_folder(tmp_path):
    (tmp_path / "good.jsonl").write_bytes(_lines(_cqa(1)))
    (tmp_path / "folder.jsonl").mkdir()
    toml = tmp_path / "exp.toml"
    toml.write_text(EXPERIMENT.format(out=(tmp_path / "run").as_posix(), task="cqa", train="folder.jsonl",
                                      dev="good.jsonl"))
    res = subprocess.run([sys.executable, "-m", "star_engine", "validate", str(toml)], capture_output=True, text=True,
                         env=cli_env(), cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert f"{tmp_path / 'folder.jsonl'}: cannot read (Is a directory)" in one_line_error(res.stderr)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ errors name the right place


def _toy(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()) + extra)
    return path


@pytest.mark.parametrize("args,expected", [
    (["--set", "generation.batch_size=0"], "error: --set generation.batch_size=0: generation.batch_size: must be >= 1"),
    (["--set", "generation.batch_sise=4"], "error: --set generation.batch_sise=4: unknown key 'generation.batch_sise'"),
    (["--set", "task.options.n_trian=3"], "error: --set task.options.n_trian=3: task.options.n_trian: unknown option "
                                          "for task 'toy'"),
    (["--set", "model.easy_modd=0"], "error: --set model.easy_modd=0: model.easy_modd: unknown option"),
    (["--set", "task.dataset=toyy"], "error: --set task.dataset=toyy: task.dataset: unknown task 'toyy'"),
    (["--set", "experiment={ name = 'x' }"], "error: --set experiment={ name = 'x' }: missing required key "
                                             "'experiment.iterations'"),
    (["--set", "generation.max_new_tokens=" + "9" * 5000], "generation.max_new_tokens: expected an integer, got "
                                                            "string"),
    (["--set", "task.data.train=a\0b"], "task.data.train: a path cannot contain a NUL character"),
], ids=["set_range", "set_unknown_key", "set_task_option", "set_backend_option", "set_plugin_name", "set_table",
        "set_huge_integer", "set_nul_path"])
def test_a_value_given_with_set_is_blamed_on_set(scripted, tmp_path, capsys, args, expected):
    path = _toy(tmp_path)
    for command in ("validate", "run"):
        assert main([command, str(path), *args]) == 2
        err = one_line_error(capsys.readouterr().err)
        assert expected in err and f"{path}:" not in err, (expected, err)
    assert not (tmp_path / "run").exists()


def test_the_same_mistakes_in_the_file_are_blamed_on_the_file(scripted, tmp_path, capsys):
    for extra, expected in [("[task.options]\nn_trian = 3\n", "task.options.n_trian: unknown option for task 'toy'"),
                            ("easy_modd = 0\n", "model.easy_modd: unknown option")]:
        path = tmp_path / "toy.toml"
        text = TOY_TOML.format(out=(tmp_path / "run").as_posix())
        path.write_text(text.replace("[generation]", extra + "[generation]") if extra.startswith("[task")
                        else text + extra)
        assert main(["validate", str(path)]) == 2
        err = one_line_error(capsys.readouterr().err)
        assert f"error: {path}: {expected}" in err, err
    # a file value and a --set inside the same table: both named
    path = _toy(tmp_path)
    assert main(["validate", str(path), "--set", "model.easy_modd=1"]) == 2
    assert "--set model.easy_modd=1: model.easy_modd" in capsys.readouterr().err


def test_task_option_errors_name_task_options_not_task_dataset(tmp_path):
    """The addition task refusing its own option value, and the core refusing an unknown one."""
    for options, expected in [('{ n_train = "many" }', "task.options.n_train: expected an integer, got string 'many'"),
                              ("{ n_trian = 3 }", "task.options.n_trian: unknown option for task 'addition'")]:
        toml = tmp_path / "exp.toml"
        toml.write_text(f'[experiment]\nname = "x"\niterations = 1\noutput_dir = "{(tmp_path / "run").as_posix()}"\n'
                        f'[task]\ndataset = "addition"\noptions = {options}\n[model]\nbackend = "scripted"\n')
        res = subprocess.run([sys.executable, "-m", "star_engine", "validate", str(toml)], capture_output=True,
                             text=True, env=cli_env(), cwd=tmp_path, timeout=120)
        assert res.returncode == 2, res.stderr
        err = one_line_error(res.stderr)
        assert f"{toml}: {expected}" in err and "task.dataset" not in err, err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ validate makes the checks run makes


def test_validate_and_run_refuse_what_the_backend_would_refuse_before_writing(scripted, tmp_path, capsys):
    """The scripted backend's context is 16 tokens: validate says so (it said OK before), and run
    refuses before its run directory exists (it created it, then failed at the first generation)."""
    path = _toy(tmp_path, "max_tokens = 16\n")
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = one_line_error(capsys.readouterr().err)
        assert f"{path}: generation.max_new_tokens: 32 is more than the scripted model's 16 tokens" in err, err
    assert not (tmp_path / "run").exists()
    assert main(["validate", str(path), "--set", "generation.max_new_tokens=8",
                 "--set", "evaluation.max_new_tokens=20"]) == 2
    assert "--set evaluation.max_new_tokens=20: evaluation.max_new_tokens: 20" in capsys.readouterr().err
    assert main(["validate", str(path), "--set", "training.optimizer.b1=1.0",
                 "--set", "generation.max_new_tokens=8"]) == 2
    assert "--set training.optimizer.b1=1.0: training.optimizer.b1: must be < 1" in capsys.readouterr().err
    assert main(["validate", str(path), "--set", "generation.max_new_tokens=8"]) == 0
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the run directory is checked before the first write


def _finished_run(tmp_path: Path) -> tuple[Path, Path]:
    path = _toy(tmp_path)
    assert main(["run", str(path), "--quiet"]) == 0
    return path, tmp_path / "run"


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damage,expected", [
    (lambda t: t[:-50], "unreadable manifest"),
    (lambda t: b"[]", "unreadable manifest (not a JSON object)"),
    (lambda t: b"[" * 100_000, "unreadable manifest (nested too deeply)"),
    (lambda t: json.dumps({"artifacts": {"a": 1}, "checkpoints": {}}).encode(), "artifacts['a']"),
    (lambda t: json.dumps({"artifacts": {}}).encode(), "'checkpoints' missing"),
], ids=["truncated", "a_list", "deep", "bad_record", "no_checkpoints"])
def test_a_damaged_run_manifest_is_refused_before_anything_is_written(scripted, tmp_path, capsys, damage, expected):
    path, run = _finished_run(tmp_path)
    capsys.readouterr()
    manifest = run / "manifest.json"
    manifest.write_bytes(damage(manifest.read_bytes()))
    before = _snapshot(run)
    for command in ("validate", "run"):
        assert main([command, str(path), "--quiet"] if command == "run" else [command, str(path)]) == 2
        err = one_line_error(capsys.readouterr().err)
        assert f"{manifest}: " in err and expected in err, err
    assert _snapshot(run) == before  # no "resume" event, config.json not rewritten


@pytest.mark.parametrize("key", ["config.json", "events.jsonl", "manifest.json", "iterations"])
def test_a_run_directory_entry_of_the_wrong_kind_is_refused_before_writing(scripted, tmp_path, capsys, key):
    path, run = _finished_run(tmp_path)
    capsys.readouterr()
    target = run / key
    if target.is_dir():
        import shutil

        shutil.rmtree(target)
        target.write_text("not a folder")
    else:
        target.unlink()
        target.mkdir()
    before = _snapshot(run)
    assert main(["run", str(path), "--quiet"]) == 2
    assert str(target) in one_line_error(capsys.readouterr().err)
    assert _snapshot(run) == before


def test_a_manifest_pointing_outside_the_run_directory_deletes_nothing(scripted, tmp_path, capsys):
    """A hostile manifest.json naming a damaged "checkpoint" outside the run directory: the run
    used to remove it as damaged (rmtree of any folder); now the manifest is refused."""
    path, run = _finished_run(tmp_path)
    capsys.readouterr()
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "data.txt").write_text("keep me")
    manifest = json.loads((run / "manifest.json").read_text())
    for rel in (str(victim), "../precious"):
        manifest["base_checkpoint"] = rel
        manifest["checkpoints"][rel] = {"id": "x", "files": {"gone": {"sha256": "0" * 64, "bytes": 1}}}
        (run / "manifest.json").write_text(json.dumps(manifest))
        assert main(["run", str(path), "--quiet"]) == 2
        assert "not a path inside the run directory" in one_line_error(capsys.readouterr().err)
        del manifest["checkpoints"][rel]
        assert (victim / "data.txt").read_text() == "keep me"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_endless_inputs_are_refused_after_a_bounded_read(scripted, tmp_path, capsys):
    """/dev/zero as the experiment file or as a CQA data file: read up to a stated limit, then one
    line (a whole-file read never returned)."""
    assert main(["validate", "/dev/zero"]) == 2
    assert "/dev/zero: more than the limit of 16777216 bytes" in one_line_error(capsys.readouterr().err)
    (tmp_path / "good.jsonl").write_bytes(_lines(_cqa(1)))
    toml = tmp_path / "exp.toml"
    toml.write_text(EXPERIMENT.format(out=(tmp_path / "run").as_posix(), task="cqa", train="/dev/zero",
                                      dev="good.jsonl"))
    res = subprocess.run([sys.executable, "-m", "star_engine", "validate", str(toml)], capture_output=True, text=True,
                         env=cli_env(), cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert "/dev/zero: more than the limit of 268435456 bytes" in one_line_error(res.stderr)
