"""Shared fixtures: a toy experiment run by the scripted backend (tests only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from star_testkit import TESTS, TOY_TOML


@pytest.fixture
def toy_toml(tmp_path: Path):
    """Write a toy experiment; returns a function (out_dir, extra TOML) -> path."""

    def make(out: str = "run", extra: str = "", name: str = "toy.toml") -> Path:
        path = tmp_path / name
        path.write_text(TOY_TOML.format(out=(tmp_path / out).as_posix()) + extra)
        return path

    return make


@pytest.fixture
def scripted(monkeypatch):
    """In-process: only the scripted plugin is loaded."""
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted")
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("SCRIPTED_KILL", raising=False)
    monkeypatch.delenv("SCRIPTED_SLEEP", raising=False)


@pytest.fixture
def generate_calls(scripted, monkeypatch) -> list:
    """Every call the scripted backend's ``generate`` gets, in order, as ``(requests, spec)``;
    the calls still generate as before."""
    from star_testkit import scripted as scripted_plugin

    calls: list = []
    real = scripted_plugin.ScriptedBackend.generate

    def spy(self, checkpoint, requests, spec, progress=None):
        calls.append((list(requests), spec))
        return real(self, checkpoint, requests, spec, progress)

    monkeypatch.setattr(scripted_plugin.ScriptedBackend, "generate", spy)
    return calls
