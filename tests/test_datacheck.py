"""Getting the data (issue 31, item 1): one data root (``task.data_root``, ``STAR_ENGINE_DATA``,
``--set task.data_root``), ``star-engine data check [EXPERIMENT]`` (present, missing or different by
sha256; writes nothing), the tasks' known files (``data_files``) against README.md's table, and,
with ../shared/data, against the real files."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from star_engine.cli import main
from star_engine.config.load import load_experiment
from star_engine.config.dataroot import ENV, known_files
from star_engine.config.registry import Registry
from star_testkit import REPO, SHARED_DATA, TOY_TOML, scripted_env

CQA = REPO / "plugins" / "cqa" / "tests" / "data" / "train_sample.jsonl"


def real_env(**extra: str) -> dict[str, str]:
    """The installed plugins as a user has them (no test switches), and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    return {**env, "STAR_ENGINE_BLOCK_PLUGINS": "tracking", **extra}


def star(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "star_engine", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def readme_table() -> dict[str, str | None]:
    """README.md's "Getting the data" table: file -> sha256 (None: "no one content")."""
    text = (REPO / "README.md").read_text().split("## Getting the data", 1)[1].split("\n## ", 1)[0]
    out = {}
    for m in re.finditer(r"^\| `([^`]+)` \|.*\| ([^|]+) \|$", text, re.MULTILINE):
        sha = re.fullmatch(r"`([0-9a-f]{64})`", m.group(2).strip())
        out[m.group(1)] = sha.group(1) if sha else None
    return out


def test_the_readme_lists_every_known_file_with_its_hash():
    known, conflicts = known_files(Registry(autoload=True, blocked=set()))
    assert not conflicts
    table = readme_table()
    assert {"commonsenseqa/train_rand_split.jsonl", "gsm8k/test.jsonl", "star-prompts/gsm/prompts.txt",
            "math500/test.jsonl"} <= set(table)
    assert table == {path: f.sha256 for path, (_, f) in known.items()}
    for path, (task, f) in known.items():  # where it comes from and its licence, for the check's lines
        assert f.source and f.license, (task, path)


def test_the_shipped_experiments_name_their_files_under_one_data_root(monkeypatch, tmp_path):
    """Every experiment that reads data says data_root = "../../shared/data" (the data beside the
    clone) and names its files relative to it; STAR_ENGINE_DATA moves them all."""
    monkeypatch.delenv(ENV, raising=False)
    reg = Registry(autoload=True, blocked=set())
    known, _ = known_files(reg)
    readers = 0
    for path in sorted((REPO / "experiments").glob("*.toml")):
        cfg = load_experiment(path, registry=reg).as_dict()
        if not cfg["task"]["data"]:
            assert cfg["task"]["data_root"] == "", path.name
            continue
        readers += 1
        root = Path(cfg["task"]["data_root"])
        assert root == (REPO / "experiments" / "../../shared/data").resolve(), path.name
        for value in cfg["task"]["data"].values():
            assert Path(value).relative_to(root).as_posix() in known, (path.name, value)
        monkeypatch.setenv(ENV, str(tmp_path))
        moved = load_experiment(path, registry=reg).as_dict()
        monkeypatch.delenv(ENV)
        assert moved["task"]["data_root"] == str(tmp_path.resolve())
        assert all(Path(v).is_relative_to(tmp_path.resolve()) for v in moved["task"]["data"].values())
    assert readers >= 8


def test_the_data_root_precedence(scripted, tmp_path, monkeypatch):
    """--set task.data_root > STAR_ENGINE_DATA > the file's data_root (relative to the file); a
    file without one names its files relative to itself and STAR_ENGINE_DATA leaves it alone.
    task.data and the task's file options resolve against the root."""
    exp = tmp_path / "exp"
    exp.mkdir()
    toml = TOY_TOML.format(out=(tmp_path / "run").as_posix())
    with_root = exp / "rooted.toml"
    with_root.write_text(toml.replace('dataset = "toy"', 'dataset = "toy"\ndata_root = "../d1"\n'
                                      'data = { train = "t.txt" }\noptions = { x_file = "p.txt" }'))
    monkeypatch.delenv(ENV, raising=False)
    cfg = load_experiment(with_root).as_dict()
    assert cfg["task"]["data_root"] == str(tmp_path / "d1")
    assert (cfg["task"]["data"]["train"], cfg["task"]["options"]["x_file"]) == \
        (str(tmp_path / "d1/t.txt"), str(tmp_path / "d1/p.txt"))
    monkeypatch.setenv(ENV, str(tmp_path / "d2"))
    cfg = load_experiment(with_root).as_dict()
    assert cfg["task"]["data"]["train"] == str(tmp_path / "d2/t.txt") and cfg["task"]["data_root"] == str(tmp_path / "d2")
    cfg = load_experiment(with_root, [f'task.data_root="{tmp_path / "d3"}"']).as_dict()
    assert cfg["task"]["data"]["train"] == str(tmp_path / "d3/t.txt")
    plain = exp / "plain.toml"
    plain.write_text(toml.replace('dataset = "toy"', 'dataset = "toy"\ndata = { train = "t.txt" }'))
    cfg = load_experiment(plain).as_dict()
    assert cfg["task"]["data"]["train"] == str(exp / "t.txt") and cfg["task"]["data_root"] == ""


def test_a_missing_data_file_says_where_the_data_root_is_and_what_to_do(tmp_path):
    res = star("validate", str(REPO / "experiments" / "cqa.toml"), "--smoke", env=real_env(**{ENV: str(tmp_path)}),
               cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"task.data.train: no such file: {tmp_path.resolve()}/commonsenseqa/train_rand_split.jsonl" in res.stderr
    assert "STAR_ENGINE_DATA" in res.stderr and "Getting the data" in res.stderr and "data check" in res.stderr


def test_data_check_of_an_experiment_names_missing_and_different_files_and_writes_nothing(tmp_path):
    root = tmp_path / "data"
    (root / "commonsenseqa").mkdir(parents=True)
    (root / "commonsenseqa/train_rand_split.jsonl").write_bytes(CQA.read_bytes())  # not the released file
    before = tree(tmp_path)
    res = star("data", "check", str(REPO / "experiments" / "cqa_rationalize.toml"), env=real_env(**{ENV: str(root)}),
               cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith("error: data check: 1 missing, 1 different") and res.stderr.count("\n") == 1
    lines = res.stdout.splitlines()
    assert lines[0] == f"data root: {root.resolve()} (STAR_ENGINE_DATA)"
    sha = hashlib.sha256(CQA.read_bytes()).hexdigest()
    assert re.search(rf"different +task\.data\.train +commonsenseqa/train_rand_split\.jsonl +sha256 {sha}, expected "
                     r"58ffa3c8472410e24b8c43f423d89c8a003d8284698a6ed7874355dedd09a2fb", res.stdout), res.stdout
    assert re.search(r"missing +task\.data\.dev +commonsenseqa/dev_rand_split\.jsonl +\[CommonsenseQA v1\.11, random "
                     r"split: https://s3\.amazonaws\.com/commensenseqa/dev_rand_split\.jsonl; MIT\]", res.stdout)
    assert tree(tmp_path) == before  # nothing written, no run directory
    # --set task.data_root wins over the environment; a root holding nothing: both missing.
    res = star("data", "check", str(REPO / "experiments" / "cqa_rationalize.toml"), "--set",
               f'task.data_root="{tmp_path / "none"}"', env=real_env(**{ENV: str(root)}), cwd=tmp_path)
    assert res.returncode == 2 and "data check: 2 missing" in res.stderr
    assert f"data root: {(tmp_path / 'none').resolve()} (task.data_root of" in res.stdout


KNOWN = '''
from star_engine import hookimpl
from star_engine.api import DataFile
from star_testkit.scripted import ToyTask


class KnowingToy(ToyTask):
    data_files = (DataFile("toy/a.txt", "{a}", "made here", "CC0"), DataFile("toy/b.txt", "{a}", "made here", "CC0"),
                  DataFile("toy/c.txt", None, "made by you", "CC0"), DataFile("toy/d.txt", "{a}", "made here", "CC0"))


@hookimpl
def register_tasks(register):
    register("knowing_toy", KnowingToy)
'''


def test_data_check_without_an_experiment_checks_every_known_file(scripted, tmp_path, monkeypatch, capsys):
    a = hashlib.sha256(b"a\n").hexdigest()
    (tmp_path / "known_plugin.py").write_text(KNOWN.format(a=a))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,known_plugin")
    root = tmp_path / "data"
    (root / "toy").mkdir(parents=True)
    for name, text in (("a.txt", "a\n"), ("b.txt", "b\n"), ("c.txt", "anything")):
        (root / "toy" / name).write_text(text)
    assert main(["data", "check", "--root", str(root)]) == 2  # b differs
    out, err = capsys.readouterr()
    states = {path: state for state, path in re.findall(r"^  (\w+) +task knowing_toy +(\S+)", out, re.MULTILINE)}
    assert states == {"toy/a.txt": "ok", "toy/b.txt": "different", "toy/c.txt": "present", "toy/d.txt": "missing"}
    assert "data check: 1 ok, 1 present, 1 missing, 1 different" in err
    (root / "toy/b.txt").write_text("a\n")
    monkeypatch.setenv(ENV, str(root))  # the default root; a task with some of its files there: each one expected
    assert main(["data", "check"]) == 2  # as the per-experiment form: a missing file fails (issue #43)
    out, err = capsys.readouterr()
    assert "task knowing_toy: incomplete: 1 of its 4 files missing" in out and "data check: 2 ok, 1 present, 1 missing" in err
    (root / "toy/d.txt").write_text("a\n")
    assert main(["data", "check"]) == 0
    assert capsys.readouterr().out.endswith("task knowing_toy: complete\ndata check: 3 ok, 1 present\n")
    shutil.rmtree(root / "toy")  # a task with none of its files here is not set up here: no failure
    assert main(["data", "check"]) == 0
    assert "task knowing_toy: not set up here (none of its files)" in capsys.readouterr().out
    (root / "toy").mkdir()
    for name, text in (("a.txt", "a\n"), ("b.txt", "a\n"), ("c.txt", "anything")):
        (root / "toy" / name).write_text(text)
    monkeypatch.delenv(ENV)
    assert main(["data", "check"]) == 2
    assert "say which data: an experiment file, --root DIR, or the environment variable STAR_ENGINE_DATA" in \
        capsys.readouterr().err
    # Two tasks that know one file differently: a conflict, named.
    (tmp_path / "other_plugin.py").write_text(KNOWN.format(a="0" * 64).replace("knowing_toy", "other_toy"))
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,known_plugin,other_plugin")
    assert main(["data", "check", "--root", str(root)]) == 2
    out, err = capsys.readouterr()
    assert f"conflict  toy/a.txt: task 'knowing_toy' expects sha256 {a}, task 'other_toy' {'0' * 64}" in out
    assert "conflicting" in err


def test_data_check_of_a_file_without_data_root(scripted, tmp_path, capsys):
    (tmp_path / "t.txt").write_text("1+2\n")
    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix())
                    .replace('dataset = "toy"', 'dataset = "toy"\ndata = { train = "t.txt", dev = "u.txt" }'))
    assert main(["data", "check", str(path)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("data root: none (paths relative to the experiment file)")
    assert re.search(r"present +task\.data\.train +" + re.escape(str(tmp_path / "t.txt")), out)
    assert re.search(r"missing +task\.data\.dev +" + re.escape(str(tmp_path / "u.txt")), out)
    assert main(["data", "check", str(path), "--root", str(tmp_path)]) == 2
    assert "--root: only without an experiment" in capsys.readouterr().err
    res = subprocess.run([sys.executable, "-m", "star_engine", "data", "check", str(path)], capture_output=True,
                         text=True, env=scripted_env(), timeout=300)
    assert res.returncode == 2 and "data check: 1 present, 1 missing" in res.stderr


@pytest.mark.real_data
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")
def test_data_check_finds_every_file_of_shared_data_with_its_hash(tmp_path):
    """Every file of ../shared/data (its README.md aside: the folder's own notes) is a known file,
    present with the sha256 its task (and README.md) gives; each shipped experiment's files too."""
    env = real_env(**{ENV: str(SHARED_DATA)})
    res = star("data", "check", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    states = {path: state for state, path in re.findall(r"^  (\w+) +task \w+ +(\S+)", res.stdout, re.MULTILINE)}
    files = {p.relative_to(SHARED_DATA).as_posix() for p in SHARED_DATA.rglob("*") if p.is_file()} - {"README.md"}
    assert files and {path: states.get(path) for path in files} == {path: "ok" for path in files}
    for path in files:
        assert readme_table()[path] == hashlib.sha256((SHARED_DATA / path).read_bytes()).hexdigest()
    for name in ("cqa.toml", "cqa_direct.toml", "cqa_llama.toml", "cqa_paper.toml", "cqa_rationalize.toml",
                 "gsm8k.toml", "gsm8k_paper.toml", "gsm8k_qwen.toml"):
        res = star("data", "check", str(REPO / "experiments" / name), env=env, cwd=tmp_path)
        assert res.returncode == 0, (name, res.stdout, res.stderr)
        lines = res.stdout.splitlines()[1:-1]
        assert lines and all(line.split()[0] == "ok" for line in lines), (name, res.stdout)
