"""The file format: each table's columns (names, order, Arrow types) written out, against the schema
derived from its record type (``star_engine.rundir.records``), and records surviving a trip through Arrow."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from star_engine.api import Candidate
from star_engine.errors import IntegrityError
from star_engine.rundir.records import (GREEDY, CheckerAccuracy, CheckerVerdict, Chunk, Evaluation, FilterCount, Metrics, Question, VerifierScore,
                                 Rationale, read, row, schema, table)

s, i32, i64, f64, b = pa.string(), pa.int32(), pa.int64(), pa.float64(), pa.bool_()
verdicts = pa.list_(pa.struct([("checker", s), ("predicted", s), ("correct", b), ("timed_out", b)]))
accuracies = pa.list_(pa.struct([("checker", s), ("accuracy", f64), ("n", i64), ("correct", i64), ("timed_out", i64),
                                 ("skipped", i64)]))

# The columns of every table a run writes, as the files have them: changing one is a change of
# the file format (files written before must still read).
FORMAT = {
    "chunk": (schema(Chunk), [("index", i64), ("text", s), ("model_version", s), ("sampled_by", s)]),
    "rationales": (schema(Rationale), [
        ("question_id", s), ("class", s), ("iteration", i32), ("sample", i32), ("prompt", s), ("rationale", s),
        ("predicted", s), ("gold", s), ("correct", b), ("was_hinted", b), ("kept", b), ("rejected_by", s),
        ("checker", s), ("model_checkpoint", s), ("prompt_hash", s), ("seed", i64), ("leak_strings", pa.list_(s)),
        ("prompt_truncated", b), ("model_version", s), ("sampled_by", s)]),
    "eval": (schema(Evaluation, GREEDY), [
        ("question_id", s), ("class", s), ("iteration", i32), ("split", s), ("generation", s), ("predicted", s),
        ("gold", s), ("correct", b), ("checker", s), ("model_checkpoint", s), ("prompt_hash", s),
        ("verdicts", verdicts), ("prompt_truncated", b), ("question", s), ("model_version", s), ("sampled_by", s)]),
    "eval_samples": (schema(Evaluation), [
        ("question_id", s), ("class", s), ("iteration", i32), ("sample", i32), ("split", s), ("generation", s),
        ("predicted", s), ("gold", s), ("correct", b), ("checker", s), ("model_checkpoint", s),
        ("prompt_hash", s), ("verdicts", verdicts), ("prompt_truncated", b), ("question", s), ("model_version", s),
        ("sampled_by", s)]),
    "questions": (schema(Question), [
        ("iteration", i32), ("question_id", s), ("class", s), ("samples", i32), ("correct", i32),
        ("hinted_samples", i32), ("hinted_correct", i32), ("solved", b), ("solved_with_hint", b), ("kept", i32),
        ("distinct_correct", i32), ("tokens", i64), ("times_seen", i32), ("times_solved", i32),
        ("first_solved", i32), ("last_solved", i32)]),
    "metrics": (schema(Metrics), [
        ("iteration", i32), ("split", s), ("class", s), ("accuracy", f64), ("n", i64), ("generated", i64),
        ("correct", i64), ("rationalized", i64), ("kept", i64), ("train_steps", i64), ("train_tokens", i64),
        ("train_loss", f64), ("wall_seconds", f64), ("coverage", f64), ("pass_k", i64), ("pass_at_k", f64),
        ("pass_at_1", f64), ("majority", f64), ("distinct_correct", f64), ("kept_len_mean", f64),
        ("kept_len_std", f64), ("checkers", accuracies), ("prompts_truncated", i64), ("trained_on", s),
        ("first_sample", f64), ("verifier_at_k", f64), ("temperature", f64), ("groups_all_right", i64),
        ("groups_all_wrong", i64),
        ("rejected", pa.list_(pa.struct([("filter", s), ("examples", i64), ("questions", i64)]))),
        ("agreement", f64)]),
    "verifier_scores": (schema(VerifierScore), [
        ("question_id", s), ("class", s), ("iteration", i32), ("sample", i32), ("split", s), ("score", f64),
        ("logp", f64), ("logp_reference", f64), ("verifier_checkpoint", s), ("reference_checkpoint", s)]),
}


@pytest.mark.parametrize("name", FORMAT)
def test_each_derived_schema_is_the_file_format(name):
    derived, columns = FORMAT[name]
    assert derived.equals(pa.schema(columns), check_metadata=True), name
    assert all(f.nullable for f in derived)  # as every file has been written


def test_the_modules_name_the_derived_schemas():
    from star_engine.rundir.ledger import LEDGER_SCHEMA
    from star_engine.rundir.metrics import METRICS_SCHEMA

    assert LEDGER_SCHEMA.equals(schema(Question)) and METRICS_SCHEMA.equals(schema(Metrics))


# ----------------------------------------------------------------------------- round trips

text = st.text(max_size=12)
i32s, i64s = st.integers(-2**31, 2**31 - 1), st.integers(-2**63, 2**63 - 1)
floats = st.floats(allow_nan=False)


def records_of(kind: type) -> st.SearchStrategy:
    """Any record of ``kind``: each field drawn by its column's Arrow type (null where the field allows it)."""
    fields = {}
    items = {"verdicts": CheckerVerdict, "checkers": CheckerAccuracy, "rejected": FilterCount}  # the lists of records
    for f, col in ((f, f.metadata.get("column", f.name)) for f in dataclasses.fields(kind)):
        typ = schema(kind).field(col).type
        base = (i32s if typ == i32 else i64s if typ == i64 else floats if typ == f64 else st.booleans() if typ == b
                else st.lists(records_of(items[col]), max_size=3).map(tuple) if col in items
                else st.lists(text, max_size=3).map(tuple) if pa.types.is_list(typ) else text)
        fields[f.name] = st.one_of(st.none(), base) if "None" in str(f.type) else base
    return st.builds(kind, **fields)


@pytest.mark.parametrize("kind", [Chunk, Rationale, Evaluation, Question, Metrics])
def test_records_survive_a_trip_through_arrow(kind):
    @settings(max_examples=60, deadline=None)
    @given(st.lists(records_of(kind), max_size=4))
    def trip(recs):
        t = table(recs, kind)
        assert t.schema.equals(schema(kind))
        assert read(t, kind) == recs
        assert t.to_pylist() == [row(r) for r in recs]

    trip()


def test_a_greedy_evaluation_is_written_without_sample_and_reads_back():
    e = Evaluation(question_id="q", cls="3", iteration=1, split="dev", generation=" 4.", predicted="4", gold="4",
                   correct=True, checker="exact", model_checkpoint="m", prompt_hash="h")
    t = table([e], Evaluation, GREEDY)
    assert "sample" not in t.column_names and t.column("class").to_pylist() == ["3"]
    assert read(t, Evaluation) == [e]


def test_files_of_older_versions_read():
    """An eval file written before the ``checker`` column: the column reads as null. A column
    without a default is an IntegrityError naming the file."""
    old = pa.table({"question_id": ["q"], "class": ["all"], "iteration": pa.array([0], i32), "split": ["dev"],
                    "generation": ["x"], "predicted": [None], "gold": ["1"], "correct": [False],
                    "model_checkpoint": ["m"], "prompt_hash": ["h"]})
    (e,) = read(old, Evaluation)
    assert e.checker is None and e.sample is None and e.cls == "all" and e.verdicts == () and e.question is None
    with pytest.raises(IntegrityError, match="eval_dev.parquet.*no column 'prompt_hash'"):
        read(old.drop(["prompt_hash"]), Evaluation, "eval_dev.parquet")


def test_the_evaluation_checkers_verdicts_are_records_in_a_list_of_structs():
    """``verdicts`` (per answer) and ``checkers`` (per metrics row) hold records: a null verdict
    (a skipped gold) and a timeout survive the trip, and a row holds them as plain dicts."""
    v = (CheckerVerdict(checker="math_verify", predicted="1/2", correct=True),
         CheckerVerdict(checker="gsm8k_strict", predicted=None, correct=None, timed_out=True))
    e = Evaluation(question_id="q", cls="3", iteration=1, split="dev", generation=" 4.", predicted="4", gold="4",
                   correct=True, checker="exact", model_checkpoint="m", prompt_hash="h", verdicts=v)
    t = table([e], Evaluation, GREEDY)
    assert t.column("verdicts").to_pylist() == [[
        {"checker": "math_verify", "predicted": "1/2", "correct": True, "timed_out": False},
        {"checker": "gsm8k_strict", "predicted": None, "correct": None, "timed_out": True}]]
    assert read(t, Evaluation) == [e] and row(e)["verdicts"] == t.column("verdicts").to_pylist()[0]


def test_filters_see_a_rationale_as_the_candidate_of_the_plugin_contract():
    r = Rationale(question_id="q", cls="c", iteration=2, sample=1, prompt="Q:", rationale=" 4.", predicted="4",
                  gold="4", correct=True, was_hinted=True, checker="exact", model_checkpoint="m", prompt_hash="h",
                  seed=9, leak_strings=("4",))
    assert r.candidate() == Candidate("q", 2, 1, "Q:", " 4.", "4", "4", True, True, ("4",))
    assert {f.name for f in dataclasses.fields(Candidate)} <= {f.name for f in dataclasses.fields(Rationale)}
