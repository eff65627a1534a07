"""``--smoke`` checks the experiment as written before its smoke settings replace ``[model]`` and
``experiment.iterations``: a mistake that a full run would meet is not hidden by a smoke check."""

from __future__ import annotations

import os

import pytest

from star_testkit import REPO, cli


@pytest.mark.parametrize("old, new, key", [
    ("iterations = 5", 'iterations = "5"', "experiment.iterations"),
    ("n_layer = 6", "n_layer = 6\nn_layers = 6", "model.n_layers"),
    ("n_layer = 6", "n_layer = -6", "model.n_layer"),
])
def test_smoke_refuses_what_the_file_as_written_gets_wrong(tmp_path, old, new, key):
    text = (REPO / "experiments" / "addition.toml").read_text()
    assert old in text
    path = tmp_path / "addition.toml"
    path.write_text(text.replace(old, new, 1))
    res = cli("validate", str(path), "--smoke", env=dict(os.environ), cwd=tmp_path)
    assert res.returncode == 2 and key in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "runs").exists()
    ok = cli("validate", str(REPO / "experiments" / "addition.toml"), "--smoke", env=dict(os.environ), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
