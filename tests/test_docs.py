"""docs/plugins.md keeps up with the code: every hook documented (heading and exact
signature) and tested, every component protocol and method documented, every
environment switch documented, and the "new plugin in 5 minutes" code works.

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

import star_engine.api as api
import star_engine.registry as registry
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
    return {p.name: p.read_text() for p in sorted(tests_dir.glob("test_*.py")) if p.name != Path(__file__).name}


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
    assert not untested([name], read_test_files(REPO / "tests")), f"no test file in tests/ mentions {name}"


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


def test_option_helpers_are_documented():
    import star_engine.options as options

    helpers = [n for n, f in inspect.getmembers(options, inspect.isfunction) if n.startswith("require_")]
    text = section(DOC.read_text(), "Options")
    assert helpers and all(f"`{h}" in text for h in helpers)
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
    from star_engine.registry import Registry

    reg = Registry(autoload=False)
    assert reg.add(module).components == {"checker": ["within_percent"], "filter": ["has_digit"]}
    with pytest.raises(UserError, match="percnt: unknown option"):
        reg.create("checker", "within_percent", {"percnt": 0.5}, "task.checker")
    with pytest.raises(UserError, match="task.checker: percent: must be a number"):
        reg.create("checker", "within_percent", {"percent": "half"}, "task.checker")
    from star_engine.api import Candidate

    flt = reg.create("filter", "has_digit", {}, "task.filters[1]")
    cands = [Candidate("q", 1, 0, "Q:", r, None, "1", True, False) for r in (" 2 apples.", " two apples.")]
    assert flt.keep(cands, []) == [True, False]


def test_backend_options_are_documented():
    """Every ``[model]`` option of the haiku_xmap backend (its constructor's keyword
    arguments, ``architecture`` and ``n_kv_head`` included) has a row in the options
    table of backends/haiku_xmap/README.md."""
    from star_haiku_xmap.plugin import HaikuXmapBackend

    readme = (REPO / "backends" / "haiku_xmap" / "README.md").read_text()
    table = readme.split("## Options", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `")]
    names = [n for n in inspect.signature(HaikuXmapBackend.__init__).parameters if n != "self"]
    assert {"architecture", "n_kv_head", "preset"} <= set(names)
    missing = [n for n in names if not any(f"`{n}`" in row for row in rows)]
    assert not missing, f"[model] options without a row in backends/haiku_xmap/README.md: {missing}"
