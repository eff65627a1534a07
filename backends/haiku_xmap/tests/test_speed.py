"""runtime/speed.py: the matmul speed a run names (Backend.matmul_gflops)."""

from __future__ import annotations

import math

from star_haiku_xmap.runtime import speed


def test_the_speed_is_the_best_timed_call_in_gflops(monkeypatch):
    """2 n^3 FLOP over the fastest of the timed calls (the compile and warm-up call untimed)."""
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 3.0])  # three timed calls of 0.5, 0.25 and 1.0 s
    monkeypatch.setattr(speed.time, "perf_counter", lambda: next(ticks))
    assert math.isclose(speed.matmul_gflops(sizes=(64,), calls=3), 2 * 64 ** 3 / 0.25 / 1e9)


def test_a_real_measurement_is_positive_and_finite():
    g = speed.matmul_gflops(sizes=(128,), calls=2)
    assert math.isfinite(g) and g > 0
