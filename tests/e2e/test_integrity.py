"""Nothing trusted: every artifact has its sha256 recorded; damage is named and only its stage is
redone; a full disk or a kill in the middle of a write leaves the previous good state.

All with the real haiku_xmap backend, on copies of the shortened embedded-default run that
test_kill_matrix.py beside it also uses (kill_matrix.py makes it once per session).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_testkit import load_script

km = load_script(Path(__file__).with_name("kill_matrix.py"))  # beside this file



@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return km.shared_reference(tmp_path_factory.getbasetemp() / "kill-matrix")


@pytest.fixture
def run(shared, tmp_path):
    """A copy of the finished reference run (file times kept)."""
    _, ref = shared
    dst = tmp_path / "run"
    shutil.copytree(ref.run_dir, dst)
    return dst


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def state(run: Path) -> dict[str, tuple[int, str]]:
    return {p.relative_to(run).as_posix(): (p.stat().st_mtime_ns, sha(p)) for p in sorted(run.rglob("*"))
            if p.is_file()}


def changed(before: dict, after: dict) -> set[str]:
    return {rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel)}


is_bookkeeping = km.is_bookkeeping  # rewritten by every start or every iteration: not stage outputs


def events_since(run: Path, offset: int) -> list[dict]:
    """The events logged after ``offset`` (a last line cut short by a fault left out)."""
    with open(run / "events.jsonl", "rb") as f:
        f.seek(offset)
        lines = f.read().split(b"\n")[:-1]
    return [json.loads(line) for line in lines if line.strip()]


def rerun(matrix: km.Matrix, run: Path, fault: str | None = None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The run command on ``run``; with ``fault``, under tests' fault injector (see FAULT)."""
    offset = (run / "events.jsonl").read_bytes().rfind(b"\n") + 1  # a torn last line is dropped by the run
    cmd = matrix.command(run)
    if fault is not None:
        injector = run.parent / "fault.py"
        injector.write_text(FAULT)
        cmd = [sys.executable, str(injector), fault, *cmd[3:]]  # cmd[:3] = python -m star_engine
    res = subprocess.run(cmd, capture_output=True, text=True, env=matrix.env, cwd=matrix.workdir, timeout=600)
    return res, events_since(run, offset)


# A fault injector at the layer every writer goes through (builtins.open): the n-th write to a
# file whose path contains a given text fails with ENOSPC after half its bytes, as a full
# disk does, or SIGKILLs the process. Usage: fault.py enospc|kill:TEXT:N star-engine args...
FAULT = textwrap.dedent('''
    import builtins, errno, os, signal, sys

    mode, text, nth = sys.argv[1].split(":")
    real_open, hits = builtins.open, [0]

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            hits[0] += 1
            if hits[0] == int(nth):
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                self.f.write(data[: len(data) // 2])
                self.f.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fault_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return Full(f) if ("w" in mode or "a" in mode) and text in str(file) else f

    builtins.open = fault_open
    sys.argv = ["star-engine", *sys.argv[2:]]
    from star_engine.cli import main
    sys.exit(main())
''')


# ------------------------------------------------------------------ checksums


def test_every_artifact_has_its_sha256_recorded(shared):
    _, ref = shared
    manifest = json.loads((ref.run_dir / "manifest.json").read_text())
    covered = set()
    for rel, rec in manifest["artifacts"].items():
        assert sha(ref.run_dir / rel) == rec["sha256"] and (ref.run_dir / rel).stat().st_size == rec["bytes"], rel
        covered.add(rel)
    assert set(manifest["checkpoints"]) == {"base/base_init", "base/model", "iterations/001/model",
                                            "iterations/002/model"}
    for rel, rec in manifest["checkpoints"].items():
        folder = ref.run_dir / rel
        files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
        assert set(rec["files"]) == files and "manifest.msgpack" in files and len(files) > 10, rel
        for name, f in rec["files"].items():
            assert sha(folder / name) == f["sha256"] and (folder / name).stat().st_size == f["bytes"]
            covered.add(f"{rel}/{name}")
        assert rec["id"] == sha(folder / "manifest.msgpack")  # the backend's checkpoint id
    stage_outputs = {rel for rel in state(ref.run_dir) if not is_bookkeeping(rel) and rel != "experiment.toml"}
    assert stage_outputs - covered == set()  # Parquet files, train.json files, checkpoint parts and manifests
    assert "metrics.parquet" in covered  # the top-level table is recorded too


# ------------------------------------------------------------------ damage is named, only its stage redone


def flip(path: Path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x01
    path.write_bytes(bytes(data))


def largest_part(folder: Path) -> Path:
    return max(folder.glob("*.zst"), key=lambda p: p.stat().st_size)


def test_flipped_bits_are_named_and_only_their_stages_redone(shared, run):
    matrix, ref = shared
    part = largest_part(run / "iterations/001/model")
    table = run / "iterations/002/generated.parquet"
    flip(part)
    flip(table)
    before = state(run)
    res, events = rerun(matrix, run)
    assert res.returncode == 0, res.stderr[-3000:]
    damaged = {e["event"]: e for e in events if e["event"].startswith("damaged_")}
    assert damaged["damaged_checkpoint"]["damaged"] == [str(part)]  # the part is named
    assert damaged["damaged_artifact"]["path"] == str(table)
    after = state(run)
    redone = {rel for rel in changed(before, after) if not is_bookkeeping(rel)}
    model1 = {rel for rel in before if rel.startswith("iterations/001/model/")}
    # Fine-tuning of iteration 1 (its checkpoint folder is written anew) and generation of
    # iteration 2; nothing else (evaluations, iteration 2's other stages and model).
    assert redone == model1 | {"iterations/001/train.json", "iterations/002/generated.parquet"}
    reference = state(ref.run_dir)
    assert all(after[rel][1] == reference[rel][1] for rel in model1)  # the same bytes as before the flip
    assert km.differences(ref, run) == []


def test_a_checkpoint_damaged_in_place_is_caught_when_loaded(shared, run):
    """Resuming trusts a checkpoint file whose size and time are as recorded (no re-hash); a byte
    changed under an unchanged time (bit rot) is caught when the backend loads the checkpoint:
    one line naming the file, exit 2, the checkpoint left for the user to move away."""
    import os

    matrix, ref = shared
    part = largest_part(run / "iterations/001/model")
    st = part.stat()
    flip(part)
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns))
    flip(run / "iterations/002/generated.parquet")  # iteration 2's generation loads model 1 again
    res, _ = rerun(matrix, run)
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert str(part) in res.stderr and f"{run / 'iterations/001/model'} is damaged: move it away" in res.stderr
    assert part.exists()
    shutil.rmtree(run / "iterations/001/model")  # what the line tells the user: move it away, rerun
    res, _ = rerun(matrix, run)
    assert res.returncode == 0, res.stderr[-3000:]
    assert km.differences(ref, run) == []


def test_truncated_files_are_named_and_only_their_stages_redone(shared, run):
    matrix, ref = shared
    table = run / "iterations/001/rationales.parquet"
    table.write_bytes(table.read_bytes()[:-100])
    base_part = largest_part(run / "base/base_init")
    base_part.write_bytes(base_part.read_bytes()[:-7])
    ckpt_manifest = run / "iterations/002/model/manifest.msgpack"
    flip(ckpt_manifest, 0.9)
    before = state(run)
    res, events = rerun(matrix, run)
    assert res.returncode == 0, res.stderr[-3000:]
    named = [e.get("damaged", [e["path"]]) for e in events if e["event"].startswith("damaged_")]
    assert sorted(x for names in named for x in names) == sorted([str(table), str(base_part), str(ckpt_manifest)])
    redone = {rel for rel in changed(before, state(run)) if not is_bookkeeping(rel)}
    folders = {rel for rel in before if rel.startswith(("base/base_init/", "iterations/002/model/"))}
    # The base init is written again by the backend (base training is not redone), iteration 1's
    # selection and iteration 2's fine-tuning are redone; nothing else.
    assert redone == folders | {"iterations/001/rationales.parquet", "iterations/002/train.json"}
    assert km.differences(ref, run) == []


def test_unreadable_run_manifest_is_named(shared, run):
    matrix, _ = shared
    manifest = run / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:-50])
    before = state(run)
    res, _ = rerun(matrix, run)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert f"{manifest}: unreadable manifest" in res.stderr
    assert {rel for rel in changed(before, state(run)) if rel not in ("config.json", "events.jsonl")} == set()


# ------------------------------------------------------------------ full disk, kill in the middle of a write


def forget_iteration_2_training(run: Path) -> None:
    """Put the run back to where it was before iteration 2's fine-tuning (files and records)."""
    gone = ("iterations/002/train.json", "iterations/002/eval_dev.parquet", "iterations/002/metrics.parquet")
    for rel in gone:
        (run / rel).unlink()
    shutil.rmtree(run / "iterations/002/model")
    manifest = json.loads((run / "manifest.json").read_text())
    for rel in gone:
        del manifest["artifacts"][rel]
    del manifest["checkpoints"]["iterations/002/model"]
    (run / "manifest.json").write_text(json.dumps(manifest))


def assert_consistent(run: Path) -> None:
    """Every record of the manifest matches its file: the run is in a good state."""
    manifest = json.loads((run / "manifest.json").read_text())
    for rel, rec in manifest["artifacts"].items():
        assert sha(run / rel) == rec["sha256"], rel
    for rel, rec in manifest["checkpoints"].items():
        for name, f in rec["files"].items():
            assert sha(run / rel / name) == f["sha256"], f"{rel}/{name}"


def test_disk_full_during_checkpoint_write(shared, run):
    matrix, ref = shared
    forget_iteration_2_training(run)
    before = state(run)
    res, _ = rerun(matrix, run, fault="enospc:iterations/002/.model.tmp-:5")
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{run / 'iterations/002/model'}: no space left on device" in res.stderr
    assert not km.temporaries(run) and not (run / "iterations/002/model").exists()  # nothing half-written
    assert {rel for rel in changed(before, state(run)) if not is_bookkeeping(rel)} == set()
    assert_consistent(run)
    res, _ = rerun(matrix, run)  # space again: it resumes
    assert res.returncode == 0, res.stderr[-3000:]
    assert km.differences(ref, run) == []


@pytest.mark.slow  # kept out of the default run for its time (~15 minutes); CI's slow step runs it
def test_disk_full_during_parquet_write_keeps_previous_version(shared, run):
    matrix, ref = shared
    forget_iteration_2_training(run)
    top = run / "metrics.parquet"  # rewritten at the end of every iteration: its previous version must survive
    before = state(run)
    res, _ = rerun(matrix, run, fault=f"enospc:{run}/.tmp-metrics.parquet:3")  # the 3rd write: iteration 2's
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{top}: no space left on device; the previous version is intact" in res.stderr
    assert not km.temporaries(run)
    assert_consistent(run)
    # The previous version: the table as written at the end of iteration 1, whole.
    rows = [{k: v for k, v in r.items() if k != "wall_seconds"} for r in pq.read_table(top).to_pylist()]
    assert rows == [r for r in ref.snap.parquet["metrics.parquet"] if r["iteration"] <= 1]
    # Iteration 2's model and metrics were written before the full disk: kept, not redone.
    after = state(run)
    assert "iterations/002/model/manifest.msgpack" in after and "iterations/002/metrics.parquet" in after
    assert {rel for rel in changed(before, after) if not is_bookkeeping(rel)
            and not rel.startswith("iterations/002/")} == set()
    kept = state(run)
    res, _ = rerun(matrix, run)
    assert res.returncode == 0, res.stderr[-3000:]
    final = state(run)
    assert all(final[rel] == kept[rel] for rel in kept if rel.startswith("iterations/"))  # not redone
    assert km.differences(ref, run) == []


def test_kill_in_the_middle_of_a_checkpoint_write(shared, run):
    matrix, ref = shared
    forget_iteration_2_training(run)
    res, _ = rerun(matrix, run, fault="kill:iterations/002/.model.tmp-:5")
    assert res.returncode == -9
    left = km.temporaries(run)
    assert left and all(".model.tmp-" in rel for rel in left)  # the backend's half-written folder
    res, events = rerun(matrix, run)
    assert res.returncode == 0, res.stderr[-3000:]
    resume = next(e for e in events if e["event"] == "resume")
    assert resume["temporaries_removed"] >= 1
    assert not km.temporaries(run)
    assert km.differences(ref, run) == []


@pytest.mark.slow  # kept out of the default run for its time (~15 minutes); CI's slow step runs it
def test_disk_full_on_the_event_log(shared, run):
    """The event log is written more often than anything else: a full disk there is one line
    too, the torn event is dropped on the next start, and the run resumes."""
    matrix, ref = shared
    forget_iteration_2_training(run)
    res, _ = rerun(matrix, run, fault="enospc:events.jsonl:3")
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{run / 'events.jsonl'}: cannot write the event log (No space left on device)" in res.stderr
    assert not (run / "events.jsonl").read_bytes().endswith(b"\n")  # half an event was written
    assert_consistent(run)
    res, _ = rerun(matrix, run)
    assert res.returncode == 0, res.stderr[-3000:]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]  # every line whole
    assert [e["event"] for e in events].count("resume") == 2  # the run cut by the full disk, the resume
    assert km.differences(ref, run) == []
