"""Mesh construction, the sharding rule table, and sharded == unsharded (logits,
gradients and one optimizer step) on 1x8, 2x4 and 8x1 meshes of 8 host devices
(2x4 in the default run, the others in the slow step).

The multi-device checks run in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``: by the time pytest
imports this file another test module may already have started jax with one device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest


from star_haiku_xmap.model import network as model
from star_haiku_xmap.runtime import sharding
from star_haiku_xmap.model.config import GPTJConfig

CFG = GPTJConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64, vocab=72)


def test_mesh_shape_resolution():
    assert sharding.mesh_shape(None, 8) == (8, 1)
    assert sharding.mesh_shape({"dp": -1, "mp": 2}, 8) == (4, 2)
    assert sharding.mesh_shape({"dp": 2, "mp": -1}, 8) == (2, 4)
    assert sharding.mesh_shape({"dp": 2, "mp": 4}, 8) == (2, 4)
    with pytest.raises(ValueError, match="not divisible"):
        sharding.mesh_shape({"dp": -1, "mp": 3}, 8)
    with pytest.raises(ValueError, match="!= 8 devices"):
        sharding.mesh_shape({"dp": 2, "mp": 2}, 8)
    with pytest.raises(ValueError, match="unknown axes"):
        sharding.mesh_shape({"dp": -1, "tp": 2}, 8)
    with pytest.raises(ValueError, match="positive int"):
        sharding.mesh_shape({"dp": 0}, 8)


def test_make_mesh_on_available_devices():
    mesh = sharding.make_mesh({"dp": -1, "mp": 1})
    assert mesh.axis_names == ("dp", "mp")
    assert mesh.shape["dp"] == jax.device_count() and mesh.shape["mp"] == 1


def test_rules_cover_every_param_and_megatron_layout():
    P = jax.sharding.PartitionSpec
    shapes = jax.eval_shape(lambda k: model.init_params(CFG, k), jax.random.key(0))
    specs = sharding.tree_specs(shapes)
    assert specs["h_1/attn/q"]["w"] == P(None, "mp")
    assert specs["h_1/attn/out"]["w"] == P("mp", None)
    assert specs["h_0/mlp/fc_in"]["b"] == P("mp")
    assert specs["h_0/mlp/fc_out"]["w"] == P("mp", None)
    assert specs["h_0/mlp/fc_out"]["b"] == P()
    assert specs["wte"]["embeddings"] == P("mp", None)
    assert specs["lm_head"]["w"] == P(None, "mp") and specs["lm_head"]["b"] == P("mp")
    assert specs["ln_f"]["scale"] == P() and specs["h_1/ln"]["offset"] == P()


def test_unmatched_parameter_raises():
    with pytest.raises(KeyError, match="h_0/attn/q_proj/w"):
        sharding.tree_specs({"h_0/attn/q_proj": {"w": np.zeros((4, 4))}})
    with pytest.raises(KeyError, match="no sharding rule"):
        sharding.tree_specs({"adapter": {"w": np.zeros((4, 4))}})


_SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from star_haiku_xmap import model, sharding, train
from star_haiku_xmap.options import AdamW
from star_haiku_xmap.sampling import static as sample
from star_haiku_xmap.model.config import GPTJConfig
cfg = GPTJConfig(**json.loads(sys.argv[1]))
assert jax.device_count() == 8, jax.device_count()
params = model.init_params(cfg, 0)
rng = np.random.default_rng(0)
tokens = rng.integers(0, cfg.vocab, (8, 16)).astype(np.int32)
mask = np.arange(16)[None] >= rng.integers(0, 6, 8)[:, None]     # left padding
loss_mask = mask & (np.arange(16)[None] >= 10)
def loss(p, t, m, lm):
    mb = {"tokens": t, "targets": jnp.roll(t, -1, axis=1), "weights": jnp.roll(lm, -1, axis=1).at[:, -1].set(False),
          "segments": m.astype(jnp.int32), "positions": model.default_positions(m)}
    s, n = train.token_loss(p, mb, cfg)
    return s / n
def logits_and_grads(p, t, m, lm):
    return model.forward(p, t, cfg, mask=m), jax.grad(loss)(p, t, m, lm)
tx = AdamW.from_table({"lr": 1e-2, "warmup_steps": 0, "clip_norm": 0.5, "weight_decay": 0.1}).build(10)
w = np.roll(loss_mask, -1, axis=1)
w[:, -1] = False
batch = {"tokens": tokens[None], "targets": np.roll(tokens, -1, axis=1)[None], "weights": w[None],
         "segments": mask.astype(np.int32)[None], "positions": np.asarray(model.default_positions(mask))[None]}
cpu0 = jax.devices()[0]
ref_logits, ref_grads = jax.jit(logits_and_grads)(*jax.device_put((params, tokens, mask, loss_mask), cpu0))
ref_params = jax.tree.map(jnp.copy, jax.device_put(params, cpu0))  # the update donates its state
ref_state, _ = train.make_update(cfg, tx)(train.init_state(ref_params, tx), batch)
prompts, _ = sample.left_pad([list(rng.integers(1, cfg.vocab, n)) for n in rng.integers(1, 12, 8)], 0)
prompt_mask = prompts != 0
keys = sample.keys_from_seeds(range(8))
def gen(p, t, m, k, temperature, mesh=None):
    return np.asarray(sample.generate(p, t, m, k, temperature, 0.9, config=cfg, max_new_tokens=12, eos_id=3,
                                      mesh=mesh))
ref_gen = [gen(*jax.device_put((params, prompts, prompt_mask, keys), cpu0), temp) for temp in (0.0, 1.0)]
out = {}
for dp, mp in (map(int, m.split("x")) for m in sys.argv[2].split(",")):
    mesh = sharding.make_mesh({"dp": dp, "mp": mp})
    p = sharding.shard_tree(params, mesh)
    q = p["h_0/attn/q"]["w"]
    assert q.sharding.shard_shape(q.shape) == (cfg.d_model, cfg.n_head * cfg.d_head // mp), q.sharding
    bs = sharding.batch_sharding(mesh)
    t, m, lm = (jax.device_put(x, bs) for x in (tokens, mask, loss_mask))
    logits, grads = jax.jit(logits_and_grads)(p, t, m, lm)
    assert logits.sharding.shard_shape(logits.shape)[0] == 8 // dp
    state = train.init_state(jax.tree.map(jnp.copy, p), tx)
    state, metrics = train.make_update(cfg, tx, mesh, state)(state, batch)
    assert state.params["h_0/mlp/fc_in"]["w"].sharding.spec == jax.sharding.PartitionSpec(None, "mp")
    # Sampling with each dp shard in its own decode loop gives the unsharded tokens.
    gen_args = (p, jax.device_put(prompts, bs), jax.device_put(prompt_mask, bs),
                jax.device_put(keys, sharding.batch_sharding(mesh, ndim=1)))
    same_gen = [bool((gen(*gen_args, temp, mesh) == ref).all()) for temp, ref in zip((0.0, 1.0), ref_gen)]
    diff = lambda a, b: max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                            for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    scale = lambda a: max(float(np.max(np.abs(np.asarray(x)))) for x in jax.tree.leaves(a))
    out[f"{dp}x{mp}"] = {"logits": diff(logits, ref_logits) / scale(ref_logits),
                         "grads": diff(grads, ref_grads) / scale(ref_grads),
                         "step": diff(state.params, ref_state.params),
                         "moved": diff(ref_state.params, params), "same_generation": same_gen}
print("RESULT " + json.dumps(out))
"""


# both axes on one mesh in the default run; the 1-axis meshes in the slow step
@pytest.mark.parametrize("meshes", ["2x4", pytest.param("1x8,8x1", marks=pytest.mark.slow)])
def test_sharded_equals_unsharded_on_8_devices(meshes):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(CFG.to_dict()), meshes], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert sorted(result) == sorted(meshes.split(","))
    for mesh, diffs in result.items():
        assert diffs["logits"] < 1e-5, (mesh, diffs)
        assert diffs["grads"] < 1e-5, (mesh, diffs)
        # Adam divides by sqrt(v): a ~1e-7 difference in a near-zero gradient can move
        # that weight's update by a fraction of lr (1e-2). A wrong optimizer-state
        # layout would differ by whole steps.
        assert diffs["moved"] > 5e-3, diffs
        assert diffs["step"] < 1e-3, (mesh, diffs)
        assert diffs["same_generation"] == [True, True], (mesh, diffs)
