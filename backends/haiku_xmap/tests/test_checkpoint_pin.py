"""``model.checkpoint_sha256``: an experiment pins the checkpoint it starts from by its content id
(the manifest's sha256); another checkpoint at the path is refused at load, one line, exit 2."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from star_engine.cli import main
from star_engine.errors import UserError
from star_haiku_xmap.checkpoint import format as C
from star_haiku_xmap.checkpoint import write as CW
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.model.network import init_params
from star_haiku_xmap.options import ModelOptions, base_config

CFG = GPTJConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_ff=32, rotary_dim=4, n_ctx=512, vocab=257)
TOK = {"kind": "byte", "vocab_size": 257, "eos_id": 256}


def _save(path, seed=0):
    CW.save_checkpoint(path, jax.tree.map(np.asarray, init_params(CFG, seed)), model_config=CFG.to_dict(),
                       tokenizer=TOK)
    return C.manifest_sha256(path)


def test_the_pinned_checkpoint_loads_and_another_is_refused(tmp_path):
    sha = _save(tmp_path / "ck")
    base, tok = base_config(ModelOptions(checkpoint_path=str(tmp_path / "ck"), checkpoint_sha256=sha))
    assert base == CFG and tok == TOK
    # upper case is the same id
    base_config(ModelOptions(checkpoint_path=str(tmp_path / "ck"), checkpoint_sha256=sha.upper()))
    other = _save(tmp_path / "other", seed=1)
    assert other != sha
    with pytest.raises(UserError, match=rf"model.checkpoint_sha256: .*holds checkpoint {other}, not the {sha}"):
        base_config(ModelOptions(checkpoint_path=str(tmp_path / "other"), checkpoint_sha256=sha))


@pytest.mark.parametrize("bad", ["abc", "g" * 64, "0" * 63])
def test_a_value_that_is_no_sha256_is_refused(tmp_path, bad):
    _save(tmp_path / "ck")
    with pytest.raises(UserError, match="model.checkpoint_sha256: .* is not a sha256"):
        base_config(ModelOptions(checkpoint_path=str(tmp_path / "ck"), checkpoint_sha256=bad))


def test_a_pin_without_a_checkpoint_is_refused():
    with pytest.raises(UserError, match="model.checkpoint_sha256: has no effect without model.checkpoint_path"):
        base_config(ModelOptions(checkpoint_sha256="0" * 64))


def _experiment(tmp_path, sha):
    f = tmp_path / "exp.toml"
    f.write_text(f"""
[experiment]
name = "pin"
iterations = 1
[task]
dataset = "addition"
options = {{ n_train = 20, n_dev = 5, max_digits = 2, n_shots = 0 }}
checker = "exact"
[model]
backend = "haiku_xmap"
checkpoint_path = "ck"
checkpoint_sha256 = "{sha}"
""")
    return f


def test_validate_and_run_refuse_a_checkpoint_that_is_not_the_pinned_one(tmp_path, capsys):
    sha = _save(tmp_path / "ck")
    assert main(["validate", str(_experiment(tmp_path, sha))]) == 0
    capsys.readouterr()
    wrong = "f" * 64
    f = _experiment(tmp_path, wrong)
    for command in ("validate", "run"):
        assert main([command, str(f)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "model.checkpoint_sha256" in err[0] and sha in err[0] and wrong in err[0]
    assert not (tmp_path / "runs").exists()  # nothing written


def test_a_pinned_checkpoint_that_is_missing_says_which_one_to_point_at(tmp_path):
    """A copied experiment whose relative checkpoint_path no longer reaches the committed base:
    the message names the pinned id and the key, not a conversion that cannot make it."""
    with pytest.raises(UserError) as e:
        base_config(ModelOptions(checkpoint_path=str(tmp_path / "gone"), checkpoint_sha256="a" * 64))
    msg = str(e.value)
    assert msg.startswith("model.checkpoint_path: ") and "does not exist" in msg and "a" * 64 in msg
    assert "convert" not in msg
