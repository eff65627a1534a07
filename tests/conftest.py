"""Shared fixtures: a toy experiment run by the scripted backend (tests only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import TESTS, TOY_TOML


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
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "scripted_plugin")
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("SCRIPTED_KILL", raising=False)
    monkeypatch.delenv("SCRIPTED_SLEEP", raising=False)
