"""ZeRO-1 on 8 simulated CPU devices (dp 4 x mp 2): the optimizer moments are
split over "dp" on top of the rule table's "mp", the parameters are not, and a few
training steps give the same losses and parameters as without ZeRO; bf16
optimizer state stays close. The backend's ``zero`` / ``opt_state_dtype`` options.
Packed training on the (dp, mp) mesh and with ZeRO-1 (fp32 master weights of bf16
compute split over dp) gives the single-device steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from jax.sharding import PartitionSpec as P

from star_engine.errors import UserError
from star_haiku_xmap.runtime import sharding

SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.runtime import sharding
    from star_haiku_xmap.session import distributed as D
    from star_haiku_xmap.train import trainer as tr
    from star_haiku_xmap.model.config import GPTJConfig
    from star_haiku_xmap.options import AdamW

    cfg32 = GPTJConfig(n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=256, rotary_dim=8, n_ctx=64, vocab=72)
    cfg = cfg32.replace(dtype="bfloat16")
    rng = np.random.default_rng(0)
    enc = [tr.Encoded(rng.integers(0, 72, size=int(rng.integers(10, 40))).astype(np.int32), 5) for _ in range(40)]
    mesh = sharding.make_mesh({"dp": 4, "mp": 2})
    out = {}
    # fp32 parameters: ZeRO-1 vs plain; bf16 parameters with fp32 and bf16 optimizer state
    runs = {"plain32": (cfg32, 0, "float32"), "zero1_32": (cfg32, 1, "float32"),
            "plain": (cfg, 0, "float32"), "zero1_bf16": (cfg, 1, "bfloat16")}
    for name, (c, zero, dt) in runs.items():
        params = model.init_params(c, 0)
        p, losses, n = tr.train(params, c, enc, tr.TrainConfig(steps=4, batch_size=8, grad_accum=2, seed=0,
                               optimizer={"lr": 1e-2, "warmup_steps": 1}, seq_len=64, pad_id=0,
                               zero=zero, opt_state_dtype=dt), mesh=mesh)
        out[name] = {"losses": losses, "params": {"/".join(k): v.astype(np.float32).ravel()[:256].tolist()
                                                  for k, v in D.host_leaves(p)},
                     "param_spec": str(p["h_0/attn/q"]["w"].sharding.spec)}
    # the state itself: where the moments live
    params = model.init_params(cfg, 0)
    tx = AdamW.from_table({"lr": 1e-2, "warmup_steps": 0}).build(4)
    def state_on(params, tx):  # as tr.train makes it: the moments born in their ZeRO-1 shardings
        abstract = jax.eval_shape(lambda p: tr.init_state(p, tx), params)
        return tr.build_state(params, tx, tr.state_shardings(abstract, mesh, 1, jax.tree.leaves(params)[0].dtype))

    state = state_on(D.place(params, mesh), tx)
    adam = state.opt_state[1][0]
    specs = {k: str(getattr(adam.mu[k.rsplit("/", 1)[0]][k.rsplit("/", 1)[1]], "sharding").spec)
             for k in ("h_0/attn/q/w", "h_0/attn/out/w", "h_0/mlp/fc_in/b", "h_0/mlp/fc_out/b", "h_0/ln/scale",
                       "wte/embeddings", "lm_head/b")}
    shard = adam.mu["h_0/attn/q"]["w"].addressable_shards[0].data.shape
    nu_dtype = str(adam.nu["h_0/attn/q"]["w"].dtype)
    st16 = state_on(D.place(params, mesh), tr.with_state_dtype(tx, "bfloat16"))
    out["state"] = {"mu_specs": specs, "mu_shard_shape": list(shard), "fp32_nu": nu_dtype,
                    "bf16_nu": str(st16.opt_state[1][0].nu["h_0/attn/q"]["w"].dtype),
                    "param_spec": str(state.params["h_0/attn/q"]["w"].sharding.spec)}
    print("RESULT " + json.dumps(out))
""")


PACKED_SCRIPT = textwrap.dedent("""
    import json
    import jax, numpy as np
    from star_haiku_xmap import distributed as D, model, packing, sharding, train as tr
    from star_haiku_xmap.model.config import GPTJConfig

    cfg32 = GPTJConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_ff=256, rotary_dim=8, n_ctx=128, vocab=72)
    rng = np.random.default_rng(0)
    enc = [tr.Encoded(rng.integers(1, 72, size=int(rng.integers(8, 60))).astype(np.int32), int(rng.integers(1, 7)))
           for _ in range(48)]
    kw = dict(steps=3, batch_size=8, grad_accum=2, seed=1, optimizer={"lr": 1e-2, "warmup_steps": 1}, seq_len=128,
              pad_id=0, packing="segments")
    def leaves(p):
        return {"/".join(k): np.asarray(v, np.float32).ravel()[:512].tolist() for k, v in D.host_leaves(p)}
    out = {}
    for name, c in (("fp32", cfg32), ("bf16", cfg32.replace(dtype="bfloat16"))):
        params = model.init_params(c, 0)
        p, losses, n = tr.train(params, c, enc, tr.TrainConfig(**kw),
                                mesh=sharding.make_mesh({"dp": 1, "mp": 1}, jax.devices()[:1]))
        out[f"{name}/1x1"] = {"losses": losses, "tokens": n, "params": leaves(p)}
        for dp, mp, zero in ((2, 4, 0), (4, 2, 1), (8, 1, 1))[:3 if name == "fp32" else 2]:
            mesh = sharding.make_mesh({"dp": dp, "mp": mp})
            p, losses, n = tr.train(params, c, enc, tr.TrainConfig(zero=zero, **kw), mesh=mesh)
            shapes = [b["tokens"].shape for b in packing.step_batches(enc, dp=dp, dims=tr.dims(c), **{
                k: v for k, v in kw.items() if k not in ("optimizer",)})]
            out[f"{name}/{dp}x{mp}/zero{zero}"] = {
                "losses": losses, "tokens": n, "params": leaves(p), "shapes": [list(s) for s in shapes],
                "q_spec": str(p["h_0/attn/q"]["w"].sharding.spec), "q_dtype": str(p["h_0/attn/q"]["w"].dtype)}
    print("RESULT " + json.dumps(out))
""")




def _on_8_devices(script: str) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def run8():
    return _on_8_devices(SCRIPT)


@pytest.fixture(scope="module")
def packed8():
    return _on_8_devices(PACKED_SCRIPT)


def _norm(spec: str) -> str:
    return spec.replace("PartitionSpec", "P")


def test_moments_are_split_over_dp(run8):
    s = run8["state"]
    specs = {k: _norm(v) for k, v in s["mu_specs"].items()}
    assert specs["h_0/attn/q/w"] == "P('dp', 'mp')"  # (D, HK): mp on the output dim, dp on the input dim
    assert specs["h_0/attn/out/w"] == "P('mp', 'dp')"
    assert specs["wte/embeddings"] == "P('mp', 'dp')"
    assert specs["h_0/mlp/fc_out/b"] == "P('dp',)" and specs["h_0/ln/scale"] == "P('dp',)"
    assert specs["h_0/mlp/fc_in/b"] == "P(('mp', 'dp'),)"  # (F,) over mp x dp = 8 ways
    assert specs["lm_head/b"] == "P(('mp', 'dp'),)"
    assert s["mu_shard_shape"] == [64 // 4, 64 // 2]  # each device holds 1/8 of q's moment
    assert _norm(s["param_spec"]) == "P(None, 'mp')"  # parameters are not partitioned over dp (ZeRO-1)
    assert s["fp32_nu"] == "float32" and s["bf16_nu"] == "bfloat16"


def test_zero1_matches_plain_data_parallel(run8):
    # fp32 parameters: the same up to float reassociation in the reductions
    plain, zero = run8["plain32"], run8["zero1_32"]
    np.testing.assert_allclose(zero["losses"], plain["losses"], rtol=1e-5)
    for k, v in plain["params"].items():
        np.testing.assert_allclose(zero["params"][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    assert plain["losses"][-1] < plain["losses"][0]  # it trains
    assert _norm(zero["param_spec"]) == "P(None, 'mp')"


def test_bf16_params_with_bf16_optimizer_state_is_close(run8):
    """bf16 parameters: ZeRO-1 with the moments stored in bf16 against plain data
    parallelism with fp32 moments (a last-bit difference can round a bf16
    parameter one ulp the other way, and bf16 moments add their own rounding)."""
    plain, bf16 = run8["plain"], run8["zero1_bf16"]
    np.testing.assert_allclose(bf16["losses"], plain["losses"], rtol=2e-2)
    diffs = [np.abs(np.asarray(bf16["params"][k]) - np.asarray(v)).max() for k, v in plain["params"].items()]
    assert max(diffs) < 0.05


def test_zero_spec_rules():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("dp", "mp"))
    assert sharding.zero_spec(P(None, "mp"), (8, 8), mesh) == P(None, "mp")  # dp = 1: unchanged

    class FakeMesh:  # zero_spec only reads mesh.shape
        shape = {"dp": 4, "mp": 2}

    m = FakeMesh()
    assert sharding.zero_spec(P(None, "mp"), (64, 64), m) == P("dp", "mp")
    assert sharding.zero_spec(P(), (6,), m) == P()  # 6 % 4: stays replicated
    assert sharding.zero_spec(P("mp"), (8,), m) == P(("mp", "dp"))
    assert sharding.zero_spec(P("mp"), (6,), m) == P("mp")
    assert sharding.zero_spec(P(), (), m) == P()


def test_backend_options_are_checked():
    from star_haiku_xmap.plugin import HaikuXmapBackend

    b = HaikuXmapBackend.from_table(preset="tiny", zero=1, opt_state_dtype="bfloat16")
    assert b.describe()["zero"] == 1 and b.describe()["opt_state_dtype"] == "bfloat16"
    with pytest.raises(UserError, match="model.zero"):
        HaikuXmapBackend.from_table(preset="tiny", zero=2)
    with pytest.raises(UserError, match="model.opt_state_dtype"):
        HaikuXmapBackend.from_table(preset="tiny", opt_state_dtype="float16")


def test_packed_steps_on_a_mesh_equal_one_device(packed8):
    ref = packed8["fp32/1x1"]
    assert ref["losses"][-1] < ref["losses"][0]
    for key in ("fp32/2x4/zero0", "fp32/4x2/zero1", "fp32/8x1/zero1"):
        got = packed8[key]
        assert got["tokens"] == ref["tokens"], key
        np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-5, err_msg=key)
        for leaf, v in ref["params"].items():
            np.testing.assert_allclose(got["params"][leaf], v, rtol=1e-4, atol=1e-5, err_msg=f"{key} {leaf}")
        dp = int(key.split("/")[1].split("x")[0])
        assert all(s[1] % dp == 0 for s in got["shapes"]), (key, got["shapes"])  # rows split evenly over dp
        assert len({tuple(s) for s in got["shapes"]}) <= 4


def test_zero1_splits_fp32_masters_of_bf16_compute_over_dp(packed8):
    """bf16 compute: ZeRO-1 keeps the fp32 master weights split over dp like the
    moments and gives the single-device steps (up to bf16 rounding of the compute)."""
    ref = packed8["bf16/1x1"]
    for key in ("bf16/4x2/zero1",):
        got = packed8[key]
        assert got["q_dtype"] == "float32"
        assert "dp" in got["q_spec"], got["q_spec"]
        np.testing.assert_allclose(got["losses"], ref["losses"], rtol=2e-2, err_msg=key)
        diffs = [np.abs(np.asarray(got["params"][k]) - np.asarray(v)).max() for k, v in ref["params"].items()]
        assert max(diffs) < 2e-2, key
    assert "dp" not in packed8["bf16/2x4/zero0"]["q_spec"] and packed8["bf16/2x4/zero0"]["q_dtype"] == "float32"
    assert "dp" not in packed8["fp32/4x2/zero1"]["q_spec"]  # fp32 compute: the weights are not a separate master
