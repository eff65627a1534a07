"""Every environment variable a run reads is checked by ``validate`` as ``run`` would: one line
naming the variable, exit 2 (``STAR_ENGINE_PROGRESS_INTERVAL``; the backend's
``STAR_HAIKU_XMAP_BARRIER_TIMEOUT``, ``STAR_HAIKU_XMAP_PEER_TIMEOUT``, ``STAR_HAIKU_XMAP_ATTENTION``)."""

from __future__ import annotations

import pytest

from star_testkit import REPO, cli, scripted_env


@pytest.mark.parametrize("name, value", [("STAR_ENGINE_PROGRESS_INTERVAL", "fast"),
                                         ("STAR_ENGINE_PROGRESS_INTERVAL", "-1")])
def test_a_bad_progress_interval_fails_validate_as_it_fails_run(toy_toml, name, value):
    path = toy_toml()
    for command in ("validate", "run"):
        res = cli(command, str(path), env=scripted_env(**{name: value}))
        assert res.returncode == 2 and name in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (path.parent / "run").exists()


@pytest.mark.parametrize("name, bad, good", [("STAR_HAIKU_XMAP_BARRIER_TIMEOUT", "soon", "90"),
                                            ("STAR_HAIKU_XMAP_PEER_TIMEOUT", "0", "90"),
                                            ("STAR_HAIKU_XMAP_ATTENTION", "flash", "xla")])
def test_the_backends_variables_are_checked_by_validate(tmp_path, name, bad, good):
    import os
    env = dict(os.environ, **{name: bad})
    res = cli("validate", str(REPO / "experiments" / "addition.toml"), "--smoke", env=env, cwd=tmp_path)
    assert res.returncode == 2 and name in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    ok = cli("validate", str(REPO / "experiments" / "addition.toml"), "--smoke", env=dict(os.environ, **{name: good}),
             cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
