"""What every test folder shares: the fuzz tests' hypothesis profiles, and the ``star``
fixture (the CLI in the test's own process).

``ci`` (the default) is a fixed budget: ``derandomize=True`` makes every run draw the same
examples, so CI is reproducible, and each property's ``max_examples`` is fixed (``fuzz_budget``).
``HYPOTHESIS_PROFILE=thorough`` multiplies the budgets by 20 and draws new examples each run,
for a longer search on a developer's machine. The example counts are printed at the end of a
run (``--hypothesis-show-statistics`` in pyproject.toml's addopts).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

_common = {"deadline": None, "print_blob": True,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture]}
settings.register_profile("ci", derandomize=True, database=None, **_common)
settings.register_profile("thorough", derandomize=False, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def star(monkeypatch, capsys):
    """``star(*args)``: the CLI in this process (installed plugins, no tracker) -> (exit code,
    stderr). For refusals that end before any work: no interpreter or jax to start, so a case
    takes milliseconds where a subprocess takes seconds."""
    from star_engine.cli import main

    for key in [k for k in os.environ if k.startswith("STAR_ENGINE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("STAR_ENGINE_BLOCK_PLUGINS", "tracking")

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(list(args))
        return code, capsys.readouterr().err

    return run
