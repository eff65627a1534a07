"""Adam's moments in the paper files' storage dtype follow fp32 moments over a long stage.

A replay of a STaR iteration's optimizer steps (9,495: iteration 31 of the paper's
40 x 1.2^n schedule) through the engine's own optimizer (``options.AdamW.build`` with the
paper files' ``[training.optimizer]`` table, wrapped by ``train.with_state_dtype``), with
gradients of steady scale and of a scale that halves every 2,000 steps, compares each
step's update with fp32 moments' (RMS ratio). Both-bf16 moments, rounded to nearest,
stop the second moment decaying (its 0.1 % step is under half a bf16 spacing) and fail;
the paper files' ``opt_state_dtype`` must stay within 5 %.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from star_haiku_xmap.train import trainer as train
from star_haiku_xmap.options import AdamW

REPO = Path(__file__).resolve().parents[3]
STEPS = 9495


def _paper(name: str) -> tuple[dict, str]:
    cfg = tomllib.loads((REPO / "experiments" / name).read_text())
    return dict(cfg["training"]["optimizer"]), cfg["model"]["opt_state_dtype"]


@jax.jit
def _noise(key):
    return jax.random.normal(key, (STEPS, 64, 64), jnp.float32)


def _rms_ratios(optimizer: dict, dtype: str, halve_every: int | None) -> np.ndarray:
    """Per-step RMS(update with ``dtype`` moments) / RMS(update with fp32 moments), the
    same gradients (scale 1e-3, or halved every ``halve_every`` steps) into both."""
    ref_tx = AdamW.from_table(optimizer).build(STEPS)
    tx = train.with_state_dtype(AdamW.from_table(optimizer).build(STEPS), dtype)
    params = {"w": jnp.zeros((64, 64), jnp.float32)}
    scales = 1e-3 * (0.5 ** (np.arange(STEPS) / halve_every) if halve_every else np.ones(STEPS))
    grads = _noise(jax.random.key(0)) * jnp.asarray(scales, jnp.float32)[:, None, None]

    def step(carry, g):
        ref_state, state = carry
        u_ref, ref_state = ref_tx.update({"w": g}, ref_state, params)
        u, state = tx.update({"w": g}, state, params)
        rms = lambda u: jnp.sqrt(jnp.mean(jnp.square(u["w"])))  # noqa: E731
        return (ref_state, state), rms(u) / rms(u_ref)

    _, ratios = jax.jit(lambda g: jax.lax.scan(step, (ref_tx.init(params), tx.init(params)), g))(grads)
    return np.asarray(ratios)


@pytest.mark.parametrize("experiment", ["cqa_paper.toml", "gsm8k_paper.toml"])
@pytest.mark.parametrize("halve_every", [None, 2000], ids=["steady", "decaying"])
def test_paper_files_moments_follow_fp32_over_a_long_stage(experiment, halve_every):
    optimizer, dtype = _paper(experiment)
    assert dtype != "float32"  # the files store moments narrower than fp32 (a v3-8 core's 16 GiB)
    ratios = _rms_ratios(optimizer, dtype, halve_every)
    for at in (206, 1277, 3178, STEPS):  # the step counts of iterations 10, 20, 25 and 31
        assert 0.95 <= ratios[at - 1] <= 1.05, (at, float(ratios[at - 1]))
    assert 0.95 <= ratios[-100:].min() and ratios[-100:].max() <= 1.05


@pytest.mark.parametrize("halve_every", [None, 2000], ids=["steady", "decaying"])
def test_bf16_moments_drift_from_fp32(halve_every):
    """The reason for the mixed dtype: both moments in bf16 leave the 5 % band (the issue's
    emulation: 0.71 at 9,495 steady steps, 0.09 with decaying gradients)."""
    optimizer, _ = _paper("cqa_paper.toml")
    ratios = _rms_ratios(optimizer, "bfloat16", halve_every)
    assert not 0.95 <= ratios[-1] <= 1.05, float(ratios[-1])
    assert 0.95 <= ratios[205] <= 1.05  # early in a stage it still agrees


def test_mixed_stores_the_first_moment_in_bf16_and_the_second_in_fp32():
    import optax
    from star_haiku_xmap.options import AdamW

    tx = train.with_state_dtype(AdamW.from_table({"lr": 1e-3}).build(10), "mixed")
    state = tx.init({"w": jnp.zeros((4, 4))})
    adam = [n for n in jax.tree.leaves(state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
            if isinstance(n, optax.ScaleByAdamState)]
    assert len(adam) == 1
    assert adam[0].mu["w"].dtype == jnp.bfloat16 and adam[0].nu["w"].dtype == jnp.float32
    _, state = tx.update({"w": jnp.ones((4, 4))}, state, {"w": jnp.zeros((4, 4))})
    adam = [n for n in jax.tree.leaves(state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
            if isinstance(n, optax.ScaleByAdamState)]
    assert adam[0].mu["w"].dtype == jnp.bfloat16 and adam[0].nu["w"].dtype == jnp.float32
