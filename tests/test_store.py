"""The run store: atomic writes, checksums, self-describing Parquet, other readers, full disks."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_engine.errors import UserError
from star_engine.rundir.fsio import atomic_write_bytes
from star_engine.rundir.store import RunStore, clean_temporaries

SCHEMA = pa.schema([("id", pa.string()), ("x", pa.int64())])


def test_write_records_checksum_and_detects_damage(tmp_path):
    store = RunStore(tmp_path, {"config_sha256": "abc"})
    store.write_table("a/t.parquet", [{"id": "q1", "x": 1}, {"id": "q2", "x": 2}], SCHEMA)
    assert store.done("a/t.parquet")
    meta = pq.read_schema(tmp_path / "a/t.parquet").metadata
    assert json.loads(meta[b"star_engine"])["config_sha256"] == "abc"
    path = tmp_path / "a/t.parquet"
    path.write_bytes(path.read_bytes()[:-10])  # truncated
    reopened = RunStore(tmp_path, {})
    assert not reopened.done("a/t.parquet") and not path.exists()  # removed, to be redone
    assert "a/t.parquet" not in json.loads((tmp_path / "manifest.json").read_text())["artifacts"]


def test_resuming_a_checkpoint_reads_metadata_not_contents(tmp_path, monkeypatch):
    """A recorded checkpoint is accepted on resume from its files' sizes and times alone (the
    backend verifies the contents when it loads them); a file rewritten in place is hashed,
    and a changed byte is still caught."""
    import os

    from star_engine.rundir import store as store_mod

    ckpt = tmp_path / "iterations/001/model"
    ckpt.mkdir(parents=True)
    for name, size in (("manifest.msgpack", 40), ("p0.zst", 5000), ("p1.zst", 3000)):
        (ckpt / name).write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    RunStore(tmp_path, {}).record_checkpoint("iterations/001/model", "id-1")
    rec = json.loads((tmp_path / "manifest.json").read_text())["checkpoints"]["iterations/001/model"]
    assert {f["mtime_ns"] for f in rec["files"].values()} and all(len(f["sha256"]) == 64 for f in rec["files"].values())

    hashed: list[str] = []
    real = store_mod.sha256_file
    monkeypatch.setattr(store_mod, "sha256_file", lambda p, *a: hashed.append(Path(p).name) or real(p, *a))
    assert RunStore(tmp_path, {}).checkpoint_done("iterations/001/model", lambda _: "id-1")
    assert hashed == []  # metadata reads only

    part = ckpt / "p1.zst"
    st = part.stat()
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: same bytes
    assert RunStore(tmp_path, {}).checkpoint_done("iterations/001/model", lambda _: "id-1")
    assert hashed == ["p1.zst"]  # only the file whose time changed

    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))  # same size, new contents
    assert not RunStore(tmp_path, {}).checkpoint_done("iterations/001/model", lambda _: "id-1")
    assert not ckpt.exists()  # damaged: removed, its stage runs again


def test_unrecorded_file_is_not_done(tmp_path):
    (tmp_path / "t.parquet").write_bytes(b"PAR1 half written")
    assert not RunStore(tmp_path, {}).done("t.parquet")


def test_enospc_keeps_previous_version_and_names_path(tmp_path, monkeypatch):
    target = tmp_path / "metrics.parquet"
    atomic_write_bytes(target, b"good")
    import builtins
    real_open = builtins.open

    class FullFile:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, a):
            return getattr(self.f, a)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return FullFile(f) if "w" in mode and ".tmp-" in str(path) else f

    monkeypatch.setattr(builtins, "open", fake_open)
    with pytest.raises(UserError) as e:
        atomic_write_bytes(target, b"new")
    monkeypatch.setattr(builtins, "open", real_open)
    assert str(target) in str(e.value) and "no space left" in str(e.value)
    assert target.read_bytes() == b"good"
    assert not list(tmp_path.glob(".tmp-*"))


def test_clean_temporaries(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d/.tmp-x.parquet.123").write_bytes(b"x")
    (tmp_path / ".tmp-model").mkdir()
    (tmp_path / ".tmp-model/part").write_bytes(b"x")
    (tmp_path / "keep.parquet").write_bytes(b"x")
    assert clean_temporaries(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["d", "keep.parquet"]


def test_run_outputs_read_by_pandas_polars_duckdb(scripted, toy_toml):
    pd = pytest.importorskip("pandas")
    pl = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    path = toy_toml()
    assert main(["run", str(path), "--quiet"]) == 0
    run = path.parent / "run"
    metrics = run / "metrics.parquet"
    rationales = run / "iterations/001/rationales.parquet"
    df = pd.read_parquet(metrics)
    assert {"iteration", "split", "class", "accuracy", "n", "generated", "correct", "rationalized", "kept",
            "train_steps", "train_tokens", "wall_seconds", "coverage"} <= set(df.columns)
    assert pl.read_parquet(rationales).height == len(pd.read_parquet(rationales))
    kept = duckdb.sql(f"select count(*) from '{rationales}' where kept").fetchall()[0][0]
    assert kept == int(pd.read_parquet(rationales)["kept"].sum()) > 0
    cols = set(pl.read_parquet(rationales).columns)
    assert {"question_id", "iteration", "sample", "prompt", "rationale", "predicted", "gold", "correct",
            "was_hinted", "checker", "model_checkpoint", "prompt_hash"} <= cols
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["requirements"] == (run / "requirements.txt").read_text().split()
    assert json.loads((run / "config.json").read_text())["experiment"]["name"] == "toy"


def test_a_damaged_checkpoint_found_while_loading_says_what_to_do(tmp_path):
    from star_engine.errors import IntegrityError
    from star_engine.rundir.store import loading_checkpoint

    ckpt = tmp_path / "iterations/001/model"
    part = f"{ckpt}/p0.zst: sha256 0 does not match the manifest's 1"
    with pytest.raises(IntegrityError, match="is damaged: move it away and run again"):
        with loading_checkpoint(ckpt, inside_run=True):
            raise IntegrityError(part)
    for inside, message in ((False, part), (True, "/elsewhere/tokenizer.json: unreadable")):
        with pytest.raises(IntegrityError) as e:  # a file of the user's, or not this checkpoint's
            with loading_checkpoint(ckpt, inside_run=inside):
                raise IntegrityError(message)
        assert str(e.value) == message
