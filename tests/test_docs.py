"""docs/plugins.md keeps up with the code: every hook documented (heading and exact
signature) and tested, every component protocol and method documented, every
environment switch documented, and the "new plugin in 5 minutes" code works.
So do the gaps a third-party task package once needed the source for: the stop
string a completion ends with, what ``read_jsonl`` returns, how ``prompt(kind)`` and
``context()`` are joined (checked against what a run asks its backend), how to test a
task and its hint with ``Registry.create`` (the documented test runs here), and which
checker ran (``config.json`` and the evaluation files name it).

As datasette does for its plugin hooks: adding a hook to ``star_engine.hooks``
without a section in docs/plugins.md, or without a test file in tests/ that
mentions it, fails here.
"""

from __future__ import annotations

import inspect
import re
import sys
import tomllib
import types
from pathlib import Path

import pluggy
import pytest

import star_engine
import star_engine.api as api
import star_engine.config.registry as registry
from star_engine import hooks

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "plugins.md"
PROTOCOLS = ("Task", "Checker", "HintFormatter", "RationaleFilter", "StepSchedule", "QuestionSampler", "Backend")


def hook_signatures(module: types.ModuleType) -> dict[str, str]:
    """``{name: "name(arg: Type, ...) -> None"}`` for every hook specification in ``module``."""
    out = {}
    for name, fn in inspect.getmembers(module, inspect.isfunction):
        if hasattr(fn, "star_engine_spec"):
            out[name] = name + str(inspect.signature(fn)).replace("'", "")  # annotations are strings
    return out


def undocumented(signatures: dict[str, str], doc: str) -> list[str]:
    """Hooks with neither a heading naming them nor their exact signature in ``doc``."""
    return [name for name, sig in signatures.items()
            if not re.search(rf"^#+ .*\b{name}\b", doc, re.MULTILINE) and sig not in doc]


def wrong_signature(signatures: dict[str, str], doc: str) -> list[str]:
    return [sig for sig in signatures.values() if sig not in doc]


def read_test_files(tests_dir: Path) -> dict[str, str]:
    """Every test file under ``tests_dir``, its sub-folders (``e2e/``) included, but this one."""
    return {p.relative_to(tests_dir).as_posix(): p.read_text() for p in sorted(tests_dir.rglob("test_*.py"))
            if p.resolve() != Path(__file__).resolve()}


def untested(names: list[str], files: dict[str, str]) -> list[str]:
    return [n for n in names if not any(re.search(rf"\b{n}\b", text) for text in files.values())]


SIGNATURES = hook_signatures(hooks)


def test_hooks_are_found():
    assert set(SIGNATURES) >= {"register_tasks", "on_run_start", "on_iteration_end"}
    assert set(SIGNATURES) == set(registry.KINDS.values()) | set(registry.OBSERVER_HOOKS)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_hook_is_documented(name):
    doc = DOC.read_text()
    assert not undocumented({name: SIGNATURES[name]}, doc), f"{name}: no section in {DOC}"
    assert not wrong_signature({name: SIGNATURES[name]}, doc), f"{DOC} lacks the signature {SIGNATURES[name]}"


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_hook_has_a_test(name):
    assert not untested([name], read_test_files(REPO / "tests")), f"no test file under tests/ mentions {name}"


def test_the_checks_can_fail(tmp_path):
    spec = pluggy.HookspecMarker("star_engine")
    fake = types.ModuleType("fake_hooks")

    def on_checkpoint_saved(run_dir, checkpoint: str) -> None:
        """A hook nobody documented or tested."""

    fake.on_checkpoint_saved = spec(on_checkpoint_saved)
    sigs = hook_signatures(fake)
    assert sigs == {"on_checkpoint_saved": "on_checkpoint_saved(run_dir, checkpoint: str) -> None"}
    assert undocumented(sigs, DOC.read_text()) == ["on_checkpoint_saved"]
    assert untested(["on_checkpoint_saved"], read_test_files(REPO / "tests")) == ["on_checkpoint_saved"]
    # A heading is enough to count as documented; a stale signature is still caught.
    doc = "### `on_checkpoint_saved`\n```python\non_checkpoint_saved(run_dir) -> None\n```\n"
    assert undocumented(sigs, doc) == [] and wrong_signature(sigs, doc) == [sigs["on_checkpoint_saved"]]
    (tmp_path / "test_x.py").write_text("def test_it():\n    on_checkpoint_saved_later = 1\n")
    assert untested(["on_checkpoint_saved"], read_test_files(tmp_path)) == ["on_checkpoint_saved"]  # whole words only


def section(doc: str, heading: str) -> str:
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", doc, re.MULTILINE)
    assert m, f"no heading '{heading}' in {DOC}"
    level = len(m.group(1))
    end = re.search(rf"^#{{1,{level}}} ", doc[m.end():], re.MULTILINE)
    return doc[m.end(): m.end() + end.start()] if end else doc[m.end():]


@pytest.mark.parametrize("name", PROTOCOLS)
def test_protocol_is_documented(name):
    text = section(DOC.read_text(), name)
    cls = getattr(api, name)
    methods = [m for m, v in vars(cls).items() if callable(v) and not m.startswith("_")]
    assert methods
    for m in methods:
        assert f"`{m}(" in text, f"{name}.{m} is not documented under '### {name}'"
    for attr in getattr(cls, "__annotations__", {}):
        assert f"`{attr}" in text, f"{name}.{attr} is not documented"


def optional_methods(cls: type) -> list[str]:
    """Methods a protocol's docstring lists as optional (``name(...) -> ...`` lines
    after "Optional method")."""
    doc = inspect.getdoc(cls) or ""
    tail = doc.split("Optional method", 1)[1] if "Optional method" in doc else ""
    return re.findall(r"^``(\w+)\(", tail, re.MULTILINE)


@pytest.mark.parametrize("name", PROTOCOLS)
def test_optional_methods_are_documented(name):
    text = section(DOC.read_text(), name)
    for m in optional_methods(getattr(api, name)):
        assert f"optional `{m}(" in text, f"{name}.{m} (optional) is not documented under '### {name}'"


def test_optional_method_check_can_fail():
    assert optional_methods(api.Task) == ["trim"]

    class Fake:
        """A protocol.

        Optional method (the core calls it when present):

        ``frobnicate(x: int) -> int``
            Nobody documented it.
        """

    assert optional_methods(Fake) == ["frobnicate"]
    assert "optional `frobnicate(" not in section(DOC.read_text(), "Task")


def test_environment_switches_are_documented():
    switches = set(re.findall(r"STAR_ENGINE_[A-Z_]+", inspect.getsource(registry)))
    assert switches == {"STAR_ENGINE_DISABLE_AUTOLOAD", "STAR_ENGINE_BLOCK_PLUGINS", "STAR_ENGINE_PLUGINS"}
    text = section(DOC.read_text(), "Environment switches")
    assert all(f"`{s}" in text for s in switches)


def test_option_markers_are_documented():
    """Every marker of the plugin API that declares an option's range is in the Options section."""
    markers = ("at_least", "above", "between", "NON_EMPTY", "NonNegInt", "PosInt", "NonNegFloat", "Fraction")
    assert set(markers) <= set(star_engine.__all__)
    text = section(DOC.read_text(), "Options")
    assert [m for m in markers if not re.search(rf"\b{m}\b", text)] == []
    assert all(s in text for s in ("`_file`", "`_path`", "`_dir`", "UserError"))


def code_block_after(doc: str, marker: str, lang: str) -> str:
    m = re.search(re.escape(marker) + rf".*?```{lang}\n(.*?)```", doc, re.DOTALL)
    assert m, f"no ```{lang} block after {marker!r}"
    return m.group(1)


def test_five_minute_plugin_works(monkeypatch):
    doc = DOC.read_text()
    pyproject = tomllib.loads(code_block_after(doc, "**2. `pyproject.toml`.**", "toml"))
    assert pyproject["project"]["entry-points"]["star_engine"] == {"percent": "star_plugin_percent.plugin"}
    source = code_block_after(doc, "**3. `star_plugin_percent/plugin.py`.**", "python")
    module = types.ModuleType("star_plugin_percent.plugin")
    exec(compile(source, "docs/plugins.md", "exec"), module.__dict__)
    package = types.ModuleType("star_plugin_percent")
    package.plugin = module
    monkeypatch.setitem(sys.modules, "star_plugin_percent", package)
    monkeypatch.setitem(sys.modules, "star_plugin_percent.plugin", module)
    test_source = code_block_after(doc, "**6. Test it**", "python")
    namespace: dict = {}
    exec(compile(test_source, "docs/plugins.md", "exec"), namespace)
    namespace["test_within_percent"]()  # the documented test passes
    from star_engine.errors import UserError
    from star_engine.config.registry import Registry

    reg = Registry(autoload=False)
    assert reg.add(module).components == {"checker": ["within_percent"], "filter": ["has_digit"]}
    with pytest.raises(UserError, match=r"^task\.checker\.percnt: unknown option"):
        reg.create("checker", "within_percent", {"percnt": 0.5}, "task.checker")
    with pytest.raises(UserError, match=r"^task\.checker\.percent: expected a number, got string 'half'$"):
        reg.create("checker", "within_percent", {"percent": "half"}, "task.checker")
    with pytest.raises(UserError, match=r"^task\.checker\.percent: must be > 0, got 0$") as e:
        reg.create("checker", "within_percent", {"percent": 0}, "task.checker")
    assert e.value.key == "task.checker.percent"
    from star_engine.api import Candidate

    flt = reg.create("filter", "has_digit", {}, "task.filters[1]")
    cands = [Candidate("q", 1, 0, "Q:", r, None, "1", True, False) for r in (" 2 apples.", " two apples.")]
    assert flt.keep(cands, []) == [True, False]


# ----------------------------------------------------------------------------- task authors' gaps


def plain_signature(fn, name: str) -> str:
    """``name(arg: Type, ...) -> Ret`` as inspect writes it, ``self`` dropped, string annotations unquoted."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.name != "self"]
    return name + str(sig.replace(parameters=params)).replace("'", "")


@pytest.mark.parametrize("fn, heading", [
    ("read_jsonl", "Task"), ("get", "Task"),
    ("Registry.__init__", "Testing a task and its hint"), ("Registry.add", "Testing a task and its hint"),
    ("Registry.create", "Testing a task and its hint"),
])
def test_helpers_for_task_authors_are_documented_with_exact_signatures(fn, heading):
    import star_engine.config.datafiles as datafiles

    obj = registry if fn.startswith("Registry") else datafiles
    for part in fn.split("."):
        obj = getattr(obj, part)
    shown = fn.replace(".__init__", "")
    want = plain_signature(obj, shown)
    assert want in section(DOC.read_text(), heading), f"{DOC}: '### {heading}' lacks `{want}`"


def test_the_joining_of_texts_and_the_stop_strings_are_documented():
    text = section(DOC.read_text(), "Task")
    for needle in ("`prompt(kind) + context(example)`", '`prompt("hint") + hint.context(task, example)`',
                   "`TrainExample(prompt=context(example), completion=", "end-of-text",
                   "`gold_completion(...)`", "`seed_examples()`", "stop string"):
        assert needle in text, f"{DOC}: '### Task' no longer says {needle}"
    stop = section(DOC.read_text(), "Stop strings and the completions a task writes")
    assert "End it with one of the task's stop strings" in stop and "no stop string before its end" in stop


def test_a_run_asks_its_backend_what_the_docs_say(tmp_path, monkeypatch, scripted, toy_toml, generate_calls):
    """``prompt(kind) + context(example)`` and ``prompt("hint") + hint.context(task, example)``,
    nothing in between; a kept rationale is stored with the bare context (the scripted toy run)."""
    from star_testkit import scripted as scripted_plugin
    from star_engine.cli import main

    monkeypatch.setattr(scripted_plugin.ToyTask, "prompt", lambda self, kind: f"<{kind} shots>\n")
    assert main(["run", str(toy_toml()), "--quiet", "--set", "experiment.iterations=1"]) == 0
    asked = [r.prompt for reqs, _ in generate_calls for r in reqs]
    task, hint = scripted_plugin.ToyTask(), scripted_plugin.ToyHint()
    train = {e.id: e for e in task.load("train", None)}
    plain = {task.prompt("rationale") + task.context(e) for e in [*train.values(), *task.load("dev", None)]}
    hinted = {task.prompt("hint") + hint.context(task, e) for e in train.values()}
    assert set(asked) <= plain | hinted and set(asked) & hinted and set(asked) & plain
    import pyarrow.parquet as pq

    kept = [r for r in pq.read_table(tmp_path / "run/iterations/001/rationales.parquet").to_pylist() if r["kept"]]
    assert kept and all(r["prompt"] == task.context(train[r["question_id"]]) for r in kept)


def test_the_documented_task_and_hint_test_runs(tmp_path):
    source = code_block_after(DOC.read_text(), "## Testing a task and its hint", "python")
    namespace: dict = {}
    exec(compile(source, "docs/plugins.md", "exec"), namespace)
    namespace["test_task_and_hint"](tmp_path)


def test_which_checker_ran_is_documented_and_recorded():
    from star_engine.rundir.records import Evaluation, Rationale, schema

    text = section(DOC.read_text(), "What a run records about its components")
    for needle in ("`config.json`", "`task.checker", "`default_checker`", "`eval_<split>.parquet`",
                   "`checker` column", "resumes"):
        assert needle in text, f"{DOC}: 'What a run records about its components' lacks {needle}"
    for kind in (Rationale, Evaluation):
        assert "checker" in schema(kind).names
    assert "name the components that run" in section(DOC.read_text(), "`on_run_start`")


def test_the_experiment_reference_lists_every_key():
    from star_engine.config.load import SCHEMA
    from star_haiku_xmap.options import AdamW

    ref = tomllib.loads(code_block_after((REPO / "docs" / "experiments.md").read_text(), "## Every key", "toml"))
    assert set(ref) == set(SCHEMA)
    for name, fields in SCHEMA.items():
        if name not in ("model", "sweep"):  # the backend's options: its own README; [sweep]: any dotted keys
            assert set(ref[name]) == set(fields), f"docs/experiments.md: [{name}] differs from the schema"
    for section in ("base_training", "training"):  # the backend's table, with its defaults
        assert ref[section]["optimizer"] == {} or set(ref[section]["optimizer"]) <= set(AdamW.schema())
    assert ref["training"]["optimizer"] == {k: f.default for k, f in AdamW.schema().items()}


def test_readme_keeps_the_set_up_commands_ci_runs():
    readme = (REPO / "README.md").read_text()
    block = code_block_after(readme, "## Set-up", "sh")
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["python3 -m pip install -r requirements.txt", "python3 -m pytest"]
    ci = (REPO / ".ci" / "run").read_text()
    assert "python -m pip install -r requirements.txt" in ci and "\npython -m pytest\n" in ci


def test_contracts_lists_the_built_in_component_names():
    """docs/CONTRACTS.md's "Component names" against what the built-in packages register
    (backends left out: a backend package may add model families of its own)."""
    text = section((REPO / "docs" / "CONTRACTS.md").read_text(), "Component names")
    listed = {m.group(1): set(re.findall(r"`(\w+)`", m.group(2)))
              for m in re.finditer(r"^- ([\w ]+): (.*)$", text, re.MULTILINE)}
    kinds = {"tasks": "task", "hint formatters": "hint", "checkers": "checker", "filters": "filter",
             "schedules": "schedule", "question samplers": "sampler", "sampling tuners": "tuner"}
    reg = registry.Registry(autoload=True, blocked=set())
    for label, kind in kinds.items():
        built_in = {name for name, comp in reg.components[kind].items()
                    if comp.plugin.distribution.replace("_", "-").startswith("star-engine")}
        assert listed[label] == built_in, f"docs/CONTRACTS.md lists {label} {sorted(listed[label])}, registered: {sorted(built_in)}"


def test_backend_options_are_documented():
    """Every ``[model]`` option of the haiku_xmap backend (the fields of its ``Options``,
    ``architecture`` and ``n_kv_head`` included) has a row in the options table of
    backends/haiku_xmap/README.md."""
    import dataclasses

    from star_haiku_xmap.plugin import HaikuXmapBackend

    readme = (REPO / "backends" / "haiku_xmap" / "README.md").read_text()
    table = readme.split("## Options", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `")]
    names = [f.name for f in dataclasses.fields(HaikuXmapBackend.Options)]
    assert {"architecture", "n_kv_head", "preset"} <= set(names)
    missing = [n for n in names if not any(f"`{n}`" in row for row in rows)]
    assert not missing, f"[model] options without a row in backends/haiku_xmap/README.md: {missing}"


def test_the_readme_plugin_example_works_and_its_option_is_checked():
    """README.md's "Writing a plugin" code, run as written: the declared option is checked
    by the core before the checker is built."""
    import types

    from star_engine import Registry, UserError

    readme = (REPO / "README.md").read_text()
    code = readme[readme.index("# my_star_plugin/plugin.py"):]
    module = types.ModuleType("my_star_plugin")
    exec(compile(code[:code.index("```")], "README.md", "exec"), module.__dict__)
    registry = Registry(autoload=False)
    registry.add(module)
    assert registry.create("checker", "within_one", {"slack": 0.5}, "task.checker").check("", "3", "3.4").correct
    with pytest.raises(UserError) as e:
        registry.create("checker", "within_one", {"slack": -1}, "task.checker")
    assert (str(e.value), e.value.key) == ("task.checker.slack: must be >= 0, got -1", "task.checker.slack")
