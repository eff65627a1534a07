"""Fuzzing the TOML layer (hypothesis, fixed budget: see conftest.py): arbitrary and mutated
experiment files, arbitrary ``--set`` overrides. Each ends in a configuration or a one-line
``UserError`` naming the file, a line or a key (or the ``--set`` that gave it); never in
another exception."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from star_testkit.fuzzing import budget, json_values, mutated
from star_testkit import TOY_TOML
from star_engine.config.load import SCHEMA, Config, Origins, load_experiment, parse_override
from star_engine.errors import UserError

GOOD = TOY_TOML.format(out="runs/fuzz").encode()
KEYS = [f"{section}.{key}" for section, table in SCHEMA.items() if isinstance(table, dict) for key in table] + [
    "model.backend", "model.n_layer", "task.options.prompts_file", "task.data.train", "training.optimizer.lr",
    "experiment", "model", "task.filters", "task.checker.name"]


def toml_value(v) -> str:
    """``v`` as a TOML inline value (JSON's string escapes are TOML's; tables inline)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    return str(v) if v is not None else '""'


overrides = st.lists(st.one_of(
    st.builds(lambda k, v: f"{k}={toml_value(v)}", st.sampled_from(KEYS), json_values),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), st.text(max_size=20)),
    st.text(max_size=30)), max_size=3)


def check(path: Path, sets: list[str]) -> None:
    try:
        cfg = load_experiment(path, sets)
    except UserError as e:
        message = str(e)
        assert message and not message.startswith("Traceback")
        blamed = Origins(path, sets).blame(e)  # what the CLI shows: still a str, never an exception
        assert isinstance(blamed, str)
        return
    assert isinstance(cfg, Config) and set(cfg.as_dict()) == set(SCHEMA) - {"sweep"}  # [sweep]: never a run's
    assert isinstance(cfg.experiment.output_dir, str) and cfg.model["backend"]


@budget(150)
@given(data=mutated(GOOD, max_edits=6), sets=overrides)
def test_mutated_experiment_files(tmp_path_factory, data, sets):
    path = tmp_path_factory.mktemp("fuzz") / "exp.toml"
    path.write_bytes(data)
    check(path, sets)


@budget(100)
@given(text=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_arbitrary_documents(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "exp.toml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    check(path, [])


@budget(150)
@given(tables=st.dictionaries(st.sampled_from(list(SCHEMA) + ["extra"]),
                              st.dictionaries(st.sampled_from(KEYS + ["name", "backend", "seed", "x"])
                                              .map(lambda k: k.split(".")[-1]), json_values, max_size=5),
                              max_size=5),
       sets=overrides)
def test_well_formed_documents_with_any_values(tmp_path_factory, tables, sets):
    """Valid TOML whose tables hold values of every type and range (NaN, inf, huge integers,
    NUL characters, nested tables where numbers belong)."""
    lines = []
    for section, table in tables.items():
        lines.append(f"[{section}]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    path = tmp_path_factory.mktemp("fuzz") / "exp.toml"
    path.write_text("\n".join(lines) + "\n")
    check(path, sets)


@budget(150)
@given(item=st.text(max_size=60) | st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), st.text(max_size=40)))
def test_any_override_parses_or_is_refused(item):
    try:
        parts, _ = parse_override(item)
    except UserError as e:
        assert str(e).startswith(f"--set {item}")
        return
    assert parts and all(parts)


@pytest.mark.parametrize("doc", [
    "a = " + "[" * 100_000,  # nested too deeply for the parser's recursion
    "a = " + "{b = " * 5_000 + "1" + "}" * 5_000,
    "a = " + "9" * 5_000,  # an integer of more than 4300 digits
], ids=["deep_arrays", "deep_tables", "huge_integer"])
def test_pathological_documents_are_one_line(tmp_path, doc):
    path = tmp_path / "exp.toml"
    path.write_text(doc)
    with pytest.raises(UserError, match=str(path)):
        load_experiment(path)
    good = tmp_path / "good.toml"
    good.write_bytes(GOOD)
    value = doc.split("= ", 1)[1]
    assert load_experiment(good, ["experiment.name=" + value]).experiment.name == value  # --set: a string
