"""Without math-verify, naming the checker is one line naming the package to install (exit code 2,
nothing written): found missing when the checker is made, or, should the worker process not find
it (another environment), when the worker starts."""

from __future__ import annotations

import re

import pytest
from star_testkit import TESTS, TOY_TOML

from star_engine.cli import main
from star_engine.errors import UserError
from star_mathverify import checker as checker_module
from star_mathverify.checker import MathVerifyChecker

PACKAGE = "math-verify[antlr4_13_2]"


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,star_mathverify.plugin")
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("SCRIPTED_KILL", raising=False)


@pytest.mark.parametrize("module", ["math_verify", "antlr4"])
def test_a_missing_package_is_one_line_naming_it(plugins, monkeypatch, tmp_path, capsys, module):
    real = checker_module.find_spec
    monkeypatch.setattr(checker_module, "find_spec", lambda name: None if name == module else real(name))
    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()).replace(
        'splits = ["dev"]', 'splits = ["dev"]\ncheckers = ["math_verify"]'))
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert (f"evaluation.checkers[0]: math_verify needs the package '{PACKAGE}' (module '{module}' is not "
                f"installed): pip install '{PACKAGE}'") in err
    assert not (tmp_path / "run").exists()


def test_a_worker_that_cannot_import_it_says_so(monkeypatch, tmp_path):
    """The worker imports what this process would: a folder first on the path whose
    ``math_verify`` fails to import stands for an environment without the package."""
    fake = tmp_path / "math_verify"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no math-verify here', name='math_verify')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    c = MathVerifyChecker()
    expected = f"math_verify needs the package '{PACKAGE}' (module 'math_verify' is missing in the worker process)"
    with pytest.raises(UserError, match="^" + re.escape(expected)):
        c.check_gold("1")
    c.close()


@pytest.mark.parametrize("options, message", [
    ('read = "answer"', "evaluation.checkers[0].read: must be one of generation, extracted, got 'answer'"),
    ("timeout_seconds = 0", "evaluation.checkers[0].timeout_seconds: must be > 0, got 0"),
    ("numeric_precision = 0", "evaluation.checkers[0].numeric_precision: must be >= 1, got 0"),
    ('gold_format = "tex"', "evaluation.checkers[0].gold_format: must be one of auto, latex, expr, got 'tex'"),
    ("memory_mb = 100", "evaluation.checkers[0].memory_mb: must be 0 (no cap) or at least 512"),
])
def test_a_bad_option_is_one_line_naming_its_key(plugins, tmp_path, capsys, options, message):
    """Options are checked as the checker declares them (before math-verify is looked for)."""
    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()).replace(
        'splits = ["dev"]', f'splits = ["dev"]\ncheckers = [{{ name = "math_verify", {options} }}]'))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and message in err, err
