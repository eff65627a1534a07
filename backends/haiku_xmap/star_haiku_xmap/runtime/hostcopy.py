"""One host copy of a replicated array for every CPU device of a mesh.

XLA:CPU devices are threads of one process over one memory, yet a replicated array placed with
``jax.device_put`` holds a copy a device: on a mesh of dp CPU devices, each decode step of every
dp shard streams its own copy of the weights through the memory system. ``shared`` gives the
devices one copy instead: the array's bytes in one 64-byte-aligned host buffer that each
device's shard wraps without a copy (PJRT's zero-copy host buffers). The values are the same,
so the programs and their results are too; what changes is the memory traffic. On the
CommonsenseQA-shaped mix (an output layer of 50,400 x 256 fp32, 51.6 MB a step for each of two
shards) a generation call took 3.52 s instead of 4.22 (docs/performance.md §3.8).

For reading only: a device writing into a buffer the others read (a donated argument) would
race, so generation calls ``shared`` and training never does. Arrays that are sharded, on one
device, on another platform or in a run of several processes are returned as they are, and so is
everything when their bytes would take more than a quarter of the memory available (the shared
copy is made while the devices' copies still exist).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

ALIGN = 64  # bytes: what PJRT's CPU client needs to wrap a host buffer without copying


def available_bytes() -> int | None:
    """The memory Linux says is available (``MemAvailable``), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _eligible(x: Any) -> bool:
    if not isinstance(x, jax.Array) or not x.is_fully_addressable or not x.sharding.is_fully_replicated:
        return False
    devices = x.sharding.device_set
    return len(devices) > 1 and all(getattr(d, "platform", None) == "cpu" for d in devices)


def _one_copy(x: jax.Array) -> jax.Array:
    host = np.asarray(x.addressable_shards[0].data)
    buf = np.empty(host.nbytes + ALIGN, np.uint8)
    start = -buf.ctypes.data % ALIGN
    aligned = buf[start:start + host.nbytes].view(host.dtype).reshape(host.shape)
    aligned[...] = host
    shards = [jax.device_put(aligned, s.device) for s in x.addressable_shards]
    if len({s.unsafe_buffer_pointer() for s in shards}) != 1:  # this jaxlib copied: keep the original
        return x
    return jax.make_array_from_single_device_arrays(x.shape, x.sharding, shards)


def shared(tree: Any) -> Any:
    """``tree`` with each replicated multi-device CPU array as one host buffer all its devices
    read (the same values); every other leaf as it is. For arrays that no program writes into."""
    if jax.process_count() > 1:
        return tree
    leaves = [x for x in jax.tree.leaves(tree) if _eligible(x)]
    need = sum(x.nbytes for x in leaves)
    have = available_bytes()
    if not leaves or (have is not None and need > have // 4):
        return tree
    return jax.tree.map(lambda x: _one_copy(x) if _eligible(x) else x, tree)
