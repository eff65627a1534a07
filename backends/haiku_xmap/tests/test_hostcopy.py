"""runtime.hostcopy.shared: a replicated array on several CPU devices becomes one host buffer
that every device reads, with the same values; other leaves, a single device and an
allocation beyond the bound are left as they are. (Generation's tokens through it on sharded
meshes: test_continuous.py's sharded-equals-unsharded test.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from star_haiku_xmap.runtime import hostcopy, sharding
assert jax.device_count() == 4
mesh = sharding.make_mesh({"dp": 2, "mp": 2})
rep = jax.device_put(jnp.arange(4099, dtype=jnp.float32) * 0.5, NamedSharding(mesh, P()))
split = jax.device_put(jnp.ones((8, 6), jnp.bfloat16), NamedSharding(mesh, P("dp", "mp")))
half = jax.device_put(jnp.arange(12, dtype=jnp.int32).reshape(4, 3), NamedSharding(mesh, P("mp")))
one = jax.device_put(jnp.ones(5), jax.devices()[0])
tree = {"rep": rep, "split": split, "half": half, "one": one, "n": 3}
out = hostcopy.shared(tree)
ptrs = lambda x: {s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
res = {
    "rep_one_buffer": len(ptrs(out["rep"])) == 1 and len(ptrs(rep)) == 4,
    "rep_values": bool(np.array_equal(np.asarray(out["rep"]), np.asarray(rep))),
    "rep_sharding": out["rep"].sharding == rep.sharding and out["rep"].dtype == rep.dtype,
    "others_kept": out["split"] is split and out["one"] is one and out["n"] == 3,
    "partly_replicated_kept": out["half"] is half,
    "jit_reads_it": float(jax.jit(lambda x: x.sum())(out["rep"])) == float(rep.sum()),
}
hostcopy.available_bytes = lambda: 4 * rep.nbytes - 1  # the copy would pass a quarter of the memory
res["bounded"] = hostcopy.shared(tree)["rep"] is rep
print("RESULT " + json.dumps(res))
"""


def test_one_host_buffer_for_a_replicated_array_and_nothing_else_changes():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
    assert result == {k: True for k in result} and len(result) == 7, result


def test_a_single_device_tree_is_returned_as_it_is():
    import jax.numpy as jnp

    from star_haiku_xmap.runtime import hostcopy

    tree = {"w": jnp.ones((3, 3)), "b": jnp.zeros(3)}
    out = hostcopy.shared(tree)
    assert out["w"] is tree["w"] and out["b"] is tree["b"]
