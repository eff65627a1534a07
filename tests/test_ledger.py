"""The per-question ledger (questions.parquet): its columns, agreement with the rationales,
the queries docs/ledger.md shows, and resuming it byte for byte after a kill."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from star_testkit import cli, scripted_env
from star_engine.cli import main
from star_engine.rundir.ledger import LEDGER_SCHEMA, latest, summary

DOC = Path(__file__).resolve().parents[1] / "docs" / "ledger.md"


def rows(run: Path, rel: str) -> list[dict]:
    return pq.read_table(run / rel).to_pylist()


def run_toy(toy_toml, extra: str = "") -> Path:
    path = toy_toml(extra=extra)
    assert main(["run", str(path), "--quiet"]) == 0
    return path.parent / "run"


def test_ledger_columns_and_counts_agree_with_the_rationales(scripted, toy_toml):
    run = run_toy(toy_toml)
    ledger = pq.read_table(run / "questions.parquet")
    assert ledger.schema.names == LEDGER_SCHEMA.names
    assert ledger.schema.field("first_solved").type == LEDGER_SCHEMA.field("first_solved").type
    table = ledger.to_pylist()
    per_iteration = [r for n in (1, 2, 3) for r in rows(run, f"iterations/{n:03d}/questions.parquet")]
    assert table == per_iteration  # the run's ledger is its iterations' ledgers, in order
    manifest = json.loads((run / "manifest.json").read_text())
    assert {"questions.parquet", "iterations/002/questions.parquet"} <= set(manifest["artifacts"])
    for n in (1, 2, 3):
        cands = rows(run, f"iterations/{n:03d}/rationales.parquet")
        mine = [r for r in table if r["iteration"] == n]
        assert {r["question_id"] for r in mine} == {c["question_id"] for c in cands}
        for r in mine:
            c = [x for x in cands if x["question_id"] == r["question_id"]]
            plain = [x for x in c if not x["was_hinted"]]
            hinted = [x for x in c if x["was_hinted"]]
            assert (r["samples"], r["correct"]) == (len(plain), sum(x["correct"] for x in plain))
            assert (r["hinted_samples"], r["hinted_correct"]) == (len(hinted), sum(x["correct"] for x in hinted))
            assert r["kept"] == sum(x["kept"] for x in c)
            assert r["solved"] == any(x["correct"] for x in plain)
            assert r["solved_with_hint"] == (not r["solved"] and any(x["correct"] for x in hinted))
            assert r["tokens"] == sum(len(x["rationale"].encode()) for x in c)  # the scripted backend: bytes
    # History columns: cumulative over the iterations so far.
    for q, last in latest(table).items():
        mine = sorted((r for r in table if r["question_id"] == q), key=lambda r: r["iteration"])
        solved_in = [r["iteration"] for r in mine if r["solved"]]
        assert last["times_seen"] == len(mine) and last["times_solved"] == len(solved_in)
        assert last["first_solved"] == (solved_in[0] if solved_in else None)
        assert last["last_solved"] == (solved_in[-1] if solved_in else None)


def test_queries_over_the_ledger(scripted, toy_toml):
    """Coverage, "only ever solved with a hint" and "never solved": one query each (the docs'),
    equal to the run's own coverage and to a count over the rationales."""
    run = run_toy(toy_toml)
    path = str(run / "questions.parquet")
    doc = DOC.read_text()
    assert "questions.parquet" in doc and "only_with_hint" in doc
    con = duckdb.connect()
    q = con.execute(f"""
        SELECT question_id, bool_or(solved) AS ever_solved, bool_or(solved_with_hint) AS hint_only_sometime
        FROM '{path}' GROUP BY question_id""").fetchall()
    only_hint = sorted(r[0] for r in q if r[2] and not r[1])
    never = sorted(r[0] for r in q if not r[1] and not r[2])
    coverage = sum(r[1] for r in q) / 24  # the toy task's 24 train questions
    s = summary(rows(run, "questions.parquet"), 24)
    assert (s["only_with_hint"], s["never_solved"]) == (only_hint, never)
    metrics = [m for m in rows(run, "metrics.parquet") if m["split"] == "train" and m["class"] == "all"]
    assert coverage == pytest.approx(metrics[-1]["coverage"]) == pytest.approx(s["coverage"])
    # Brute force over the rationales: solved without a hint never, but right with it at least once.
    cands = [r for n in (1, 2, 3) for r in rows(run, f"iterations/{n:03d}/rationales.parquet")]
    plain_ok = {r["question_id"] for r in cands if r["correct"] and not r["was_hinted"]}
    hint_ok = {r["question_id"] for r in cands if r["correct"] and r["was_hinted"]}
    assert only_hint == sorted(hint_ok - plain_ok) and only_hint  # the toy run has some
    # The docs' query runs as written.
    sql = doc.split("```sql\n", 1)[1].split("```", 1)[0].replace("runs/addition/questions.parquet", path)
    got = dict(con.execute(sql).fetchall())
    assert set(got) <= {"never solved", "only with a hint", "solved"}
    assert (got.get("only with a hint", 0), got.get("never solved", 0)) == (len(only_hint), len(never))
    assert got["solved"] == s["solved"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


LEDGERS = ("questions.parquet", "iterations/001/questions.parquet", "iterations/003/questions.parquet")


@pytest.mark.parametrize("kill", ["generate:40", "train_step:5"])
def test_ledger_resumes_byte_identical_after_a_kill(toy_toml, kill):
    path = toy_toml()
    run = path.parent / "run"
    assert cli("run", str(path), "--quiet").returncode == 0
    reference = {rel: sha(run / rel) for rel in LEDGERS}
    shutil.rmtree(run)
    res = cli("run", str(path), "--quiet", env=scripted_env(SCRIPTED_KILL=kill))
    assert res.returncode == -9, res.stderr  # it died mid-run
    assert cli("run", str(path), "--quiet").returncode == 0
    assert {rel: sha(run / rel) for rel in LEDGERS} == reference


def test_a_resumed_run_rewrites_the_ledger_byte_for_byte(scripted, toy_toml):
    run = run_toy(toy_toml)
    before = {p: sha(run / p) for p in ("questions.parquet", "iterations/002/questions.parquet")}
    (run / "questions.parquet").unlink()
    assert main(["run", str(run.parent / "toy.toml"), "--quiet"]) == 0
    assert {p: sha(run / p) for p in before} == before


def test_a_second_process_decides_the_ledger_write_as_process_0_does(scripted, toy_toml):
    """Process 0 may rewrite questions.parquet before a slower process 1 reaches the same
    ``save_ledger``: process 1 must still take the same path (a write, whose barrier it
    joins), from the row count it read before any process could change the file, not
    read the rewritten file and skip (or call it damaged), which diverged a 2-process run."""
    import star_engine.rundir.procs as procs
    from star_engine.config.load import Config
    from star_engine.config.registry import Registry
    from star_engine.run.experiment import build
    from star_engine.run.stages import Stages
    from star_engine.rundir.store import RunStore

    run = run_toy(toy_toml)
    cfg = json.loads((run / "config.json").read_text())
    exp = build(Config.from_dict(cfg), Registry())
    names: list[str] = []
    stages = Stages(exp, RunStore(run, {}, processes=procs.Processes(index=1, count=2, barrier=names.append)))
    rows = pq.read_table(run / "questions.parquet").to_pylist()
    grown = rows + rows[:3]
    # process 0, ahead, has already written the grown ledger
    pq.write_table(pa.Table.from_pylist(grown, schema=LEDGER_SCHEMA), run / "questions.parquet")
    stages.save_ledger(grown)
    assert [n.split(": ", 1)[1] for n in names] == ["ledger counted", "write questions.parquet", "write manifest.json"]
    stages.save_ledger(grown)  # nothing new: no write, no barrier, in every process alike
    assert len(names) == 3
