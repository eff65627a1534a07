"""From downloaded weights to a run in one step (issue #43): ``convert --from hf`` takes a
local Hugging Face folder or a hub id (downloaded through ``huggingface_hub``; a stand-in
module here, the machine is offline), writes ``checkpoints/<name>`` by default, and an
experiment whose checkpoint is missing says the exact command that makes it, with full paths;
that command, run as printed, makes the experiment valid."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import types
from pathlib import Path

import pytest

from star_engine.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[3]


def hf_folder(dest: Path, tokenizer: bool = True) -> Path:
    """A Qwen2 folder as the hub serves one (config.json, model.safetensors, tokenizer.json):
    the tiny fixture with a 512-token context and a word-level tokenizer over digits and signs."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    shutil.copytree(FIXTURES / "qwen2_tiny", dest, ignore=shutil.ignore_patterns("golden.npz"))
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 512}))
    if tokenizer:
        words = ["[UNK]", *map(str, range(10)), *"+=:,.?", *(f"w{i}" for i in range(78)), "<|endoftext|>"]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                     pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.Punctuation()])
        tok.save(str(dest / "tokenizer.json"))
    return dest


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A stand-in ``huggingface_hub`` whose ``snapshot_download`` serves folders from a dict
    (repo id -> folder) and records each call; an unknown id fails as the hub's client does."""
    calls: list[tuple] = []
    served: dict[str, Path] = {}

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        calls.append((repo_id, revision, tuple(allow_patterns or ())))
        if repo_id not in served:
            raise RuntimeError(f"404 Client Error: Repository Not Found for url: https://huggingface.co/{repo_id}")
        return str(served[repo_id])

    monkeypatch.setitem(sys.modules, "huggingface_hub",
                        types.SimpleNamespace(snapshot_download=snapshot_download))
    return served, calls


def experiment(folder: Path, hub_id: str = "acme/Tiny-Qwen2") -> Path:
    """experiments/addition.toml made small, its [model] the converted checkpoint, in
    ``folder/experiments`` (paths relative to the file: the checkpoint in folder/checkpoints)."""
    text = (ROOT / "experiments" / "addition.toml").read_text()
    head, _, _ = text.partition("[model]")
    for old, new in (("iterations = 5", "iterations = 1"), ("n_train = 10000", "n_train = 40"),
                     ("n_dev = 250", "n_dev = 8"), ("n_train_samples = 700", "n_train_samples = 8")):
        assert old in head, old  # the file changed: make the experiment small again
        head = head.replace(old, new)
    model = (f'[model]\nbackend = "haiku_xmap"\ncheckpoint_path = "../checkpoints/tiny-qwen2"\n'
             f'hub_id = "{hub_id}"\ntokenizer = "hf"\n')
    (folder / "experiments").mkdir(parents=True, exist_ok=True)
    path = folder / "experiments" / "tiny_qwen2.toml"
    path.write_text(head + model)
    return path


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_a_missing_checkpoint_names_the_command_that_makes_it_and_that_command_works(tmp_path, hub, capsys,
                                                                                    monkeypatch):
    served, calls = hub
    served["acme/Tiny-Qwen2"] = hf_folder(tmp_path / "hub" / "snapshot")
    path = experiment(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # run from another folder: every path is the file's, named in full
    assert main(["validate", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    target = (tmp_path / "project" / "checkpoints" / "tiny-qwen2").resolve()
    assert f"model.checkpoint_path: {target} does not exist; make it with: " in line
    command = line.split("make it with: ", 1)[1].split(" (docs/models.md")[0]
    assert command == f"star-engine convert --from hf acme/Tiny-Qwen2 {target}"
    assert main(shlex.split(command)[1:] + ["--dtype", "float32"]) == 0
    assert calls == [("acme/Tiny-Qwen2", None, ("*.safetensors", "*.json", "tokenizer*"))]
    assert str(target) in capsys.readouterr().out
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"run directory {(tmp_path / 'project' / 'runs' / 'addition').resolve()}: new" in out
    assert not (elsewhere / "runs").exists() and not any(elsewhere.iterdir())  # nothing written where it ran


def test_convert_writes_checkpoints_name_by_default_from_a_folder_or_a_hub_id(tmp_path, hub, capsys, monkeypatch):
    served, calls = hub
    monkeypatch.chdir(tmp_path)
    hf_folder(tmp_path / "Tiny-Qwen2")
    assert main(["convert", "--from", "hf", "Tiny-Qwen2"]) == 0
    assert (tmp_path / "checkpoints" / "tiny-qwen2" / "manifest.msgpack").is_file() and calls == []
    served["acme/Other-Name"] = tmp_path / "Tiny-Qwen2"
    assert main(["convert", "--from", "hf", "acme/Other-Name@v1.0"]) == 0
    assert calls == [("acme/Other-Name", "v1.0", ("*.safetensors", "*.json", "tokenizer*"))]
    assert (tmp_path / "checkpoints" / "other-name" / "manifest.msgpack").is_file()
    capsys.readouterr()
    assert main(["convert", "--from", "mtj", "somewhere"]) == 2  # the default destination is --from hf's only
    assert "dest: required" in one_line(capsys.readouterr().err)


def test_hub_failures_and_a_folder_without_a_tokenizer_are_one_line(tmp_path, hub, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "--from", "hf", "acme/Not-There", "out"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "acme/Not-There: no such folder here, and the hub download failed: 404 Client Error" in line
    hf_folder(tmp_path / "NoTok", tokenizer=False)
    assert main(["convert", "--from", "hf", "NoTok", "out"]) == 2  # a Qwen2 folder: no GPT-J advice
    line = one_line(capsys.readouterr().err)
    assert "NoTok: no tokenizer.json in this Hugging Face folder; pass --tokenizer-file" in line
    assert "GPT-J" not in line
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    assert main(["convert", "--from", "hf", "acme/Tiny", "out"]) == 2
    assert "install huggingface_hub" in one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NoTok"]  # nothing written


def test_a_hugging_face_folder_as_the_checkpoint_and_a_malformed_hub_id_are_named(tmp_path, capsys):
    path = experiment(tmp_path / "project")
    hf_folder(tmp_path / "project" / "checkpoints" / "tiny-qwen2")  # not converted
    assert main(["validate", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "is a Hugging Face folder, not a checkpoint of this backend" in line
    assert "star-engine convert --from hf" in line
    assert main(["validate", str(experiment(tmp_path / "p2", hub_id="no-slash"))]) == 2
    assert "model.hub_id: expected a Hugging Face hub id" in one_line(capsys.readouterr().err)


def test_every_shipped_experiment_with_a_checkpoint_names_its_hub_id_or_ships_it_pinned():
    import tomllib

    from star_haiku_xmap.options import HUB_ID

    for path in sorted((ROOT / "experiments").glob("*.toml")):
        model = tomllib.loads(path.read_text())["model"]
        if not model.get("checkpoint_path"):
            continue
        if (path.parent / model["checkpoint_path"] / "manifest.msgpack").is_file():  # committed with the repository
            assert model.get("checkpoint_sha256"), f"{path.name}: a committed checkpoint is pinned by its sha256"
        else:
            assert HUB_ID.fullmatch(model.get("hub_id", "")), path.name


def test_plan_of_an_experiment_without_its_checkpoint_names_the_command(tmp_path, capsys):
    """``plan`` needs the model's shape: without the checkpoint and without a preset it says how
    to make the checkpoint (or which --set plans a preset instead)."""
    path = experiment(tmp_path / "project")
    assert main(["plan", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    target = (tmp_path / "project" / "checkpoints" / "tiny-qwen2").resolve()
    assert f"make it with: star-engine convert --from hf acme/Tiny-Qwen2 {target}" in line
    assert "--set model.preset=" in line
