"""How fast this machine multiplies fp32 matrices through XLA (``Backend.matmul_gflops``): the
figure a CPU run's time scales with, measured at start so that a run can say how long it
expects to take here (``experiment.expected_minutes``) and its summary can name it."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

SIZES = (1024, 2048)  # square matmuls of 2 and 17 GFLOP: Eigen's blocked kernels at full speed
CALLS = 3


def matmul_gflops(sizes: tuple[int, ...] = SIZES, calls: int = CALLS, dtype: str = "float32") -> float:
    """The best GFLOP/s of ``calls`` timed ``n x n @ n x n`` products per size in ``dtype``
    (fp32 for a run; the benchmarks' ``matmul_peak`` also asks for bf16), on the default device (XLA:CPU's intra-op thread pool spans every core it may use), compile
    excluded. The best call is the least disturbed by other processes; on an idle machine it
    is the speed every fp32 matmul of a run is measured against (docs/performance.md §4)."""
    best = 0.0
    for n in sizes:
        x = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32), dtype)
        square = jax.jit(lambda a: a @ a)
        square(x).block_until_ready()  # compiled and warmed outside the timing
        for _ in range(calls):
            t = time.perf_counter()
            square(x).block_until_ready()
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
    return best / 1e9
