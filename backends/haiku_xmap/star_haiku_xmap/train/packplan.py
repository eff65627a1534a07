"""Which examples each optimizer step takes, and for packed steps the rows and the
compiled shape they go into.

Steps come from seeded permutations of the examples, a window of 8 steps at a time
(``plan_steps``). For padded batches a window is sorted by length and cut into
consecutive steps (similar lengths pad little); for packed batches it is sorted and
dealt out round-robin (``stratified``), so every step holds the window's spread of
lengths at about the same total: short examples fill the rows long ones leave, and
the steps need about the same number of rows.

A packed step's examples go into rows of T tokens by first-fit decreasing; its
micro-batches get R rows each. ``plan_packed`` knows every step in advance, so it
picks the compiled (R, T) shapes for the whole run at once: T from the multiples
of 64 (and the powers of two below 64) up to ``seq_len``, and at most ``MAX_SHAPES``
shapes, added greedily while each saves more than ``COMPILE_STEPS`` steps' worth of
its own work (``step_cost``); each step then takes the cheapest shape it fits.
"""

from __future__ import annotations

from typing import NamedTuple
from collections.abc import Sequence

import numpy as np

# Relative cost of one attention FLOP against one matmul FLOP of the train step on
# XLA:CPU (fp32 scores and softmax, block-causal), fitted from step times of the
# addition model (4 x d128, 8 heads) at 4,096 tokens per step and row lengths
# 64-1024 (docs/performance.md). Only the choice of the row shape uses it.
ATTENTION_COST = 4.0
COMPILE_STEPS = 8  # a shape's compile costs about this many of its steps (CPU: 6-15 s against ~1 s steps)
MAX_SHAPES = 4
ROW_STEP = 64  # packed row lengths are multiples of this (XLA:CPU's attention block is 128)


class PackedStep(NamedTuple):
    idx: np.ndarray  # example indices of the step
    R: int  # rows per micro-batch
    T: int  # tokens per row
    rows: list[list[int]]  # positions into idx, one list per row (row k in micro-batch k // R)


def plan_steps(lengths: Sequence[int] | np.ndarray, *, steps: int, per_step: int, seed: int, window: int = 8,
               stratified: bool = False) -> list[np.ndarray]:
    """Example indices for each optimizer step, deterministic in ``seed``.

    Indices come from a stream of seeded permutations (epoch after epoch). Every
    ``window`` steps' worth is sorted by length and cut into steps (``stratified``:
    step k takes sorted positions k, k + n, k + 2n, ...), whose order is then shuffled.
    """
    if not lengths:
        raise ValueError("no training examples")
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    stream: list[int] = []
    plan: list[np.ndarray] = []
    while len(plan) < steps:
        n_steps = min(window, steps - len(plan))
        while len(stream) < n_steps * per_step:
            stream.extend(rng.permutation(len(lengths)).tolist())
        chunk = np.asarray(stream[:n_steps * per_step])
        del stream[:n_steps * per_step]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        groups = chunk.reshape(per_step, n_steps).T if stratified else chunk.reshape(n_steps, per_step)
        plan.extend(groups[rng.permutation(n_steps)])
    return plan


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins (lists of positions into ``lengths``) of total length <= ``capacity``:
    longest first (ties by position), each into the first bin with room. Any two
    bins together hold more than ``capacity``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"an example of {n} tokens does not fit a row of {capacity}")
        for b, room in enumerate(free):
            if n <= room:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(capacity - n)
    return bins


def row_lengths(seq_len: int) -> list[int]:
    """Candidate packed row lengths: 16, 32 and the multiples of ``ROW_STEP`` below
    ``seq_len``, and ``seq_len``."""
    small = [n for n in (16, 32) if n < min(ROW_STEP, seq_len)]
    return small + list(range(ROW_STEP, seq_len, ROW_STEP)) + [seq_len]


def step_cost(A: int, R: int, T: int, dims: tuple[int, int, int, int]) -> float:
    """Estimated work of an (A, R, T) step in matmul FLOPs per layer: per token the
    q, k, v, out, fc_in and fc_out matmuls and a layer's share of the head, plus
    attention's T-proportional QK^T and PV, weighted by ``ATTENTION_COST``.
    ``dims`` = (n_layer, d_model, d_ff, vocab)."""
    L, D, F, V = dims
    dense = 2 * (4 * D * D + 2 * D * F) + 2 * D * V / L
    return A * R * T * (dense + ATTENTION_COST * 2 * D * T)


def choose_shapes(need: np.ndarray, lengths_T: Sequence[int], grad_accum: int,
                  dims: tuple[int, int, int, int]) -> list[tuple[int, int]]:
    """The compiled (R, T) shapes for a run. ``need[s, t]``: rows per micro-batch
    step s needs at row length ``lengths_T[t]`` (0: the step does not fit)."""
    cost = {(int(R), T): step_cost(grad_accum, int(R), T, dims)
            for t, T in enumerate(lengths_T) for R in np.unique(need[:, t]) if R > 0}

    def per_step(shape):  # each step's cost with this shape (inf where it does not fit)
        R, T = shape
        n = need[:, lengths_T.index(T)]
        return np.where((n > 0) & (n <= R), cost[shape], np.inf)

    # Start from the cheapest shape every step fits: the largest need at some T.
    full = [(int(need[:, t].max()), T) for t, T in enumerate(lengths_T) if (need[:, t] > 0).all()]
    chosen = [min(full, key=lambda s: (per_step(s).sum(), s[1]))]
    current = per_step(chosen[0])
    while len(chosen) < MAX_SHAPES:
        gains = [(current.sum() - np.minimum(current, per_step(s)).sum(), -s[1], s)
                 for s in cost if s not in chosen]
        if not gains:
            break
        gain, _, best = max(gains)
        if gain <= COMPILE_STEPS * cost[best]:
            break
        chosen.append(best)
        current = np.minimum(current, per_step(best))
    return chosen


def plan_packed(lengths: Sequence[int], *, steps: int, batch_size: int, grad_accum: int, seed: int, seq_len: int,
                dp: int, dims: tuple[int, int, int, int]) -> list[PackedStep]:
    """Every packed step of a run: its examples (stratified windows), the rows of
    each (first-fit decreasing) and its shape from the run's few (``choose_shapes``)."""
    plan = plan_steps(lengths, steps=steps, per_step=batch_size * grad_accum, seed=seed, stratified=True)
    lengths_T = row_lengths(seq_len)
    need = np.zeros((len(plan), len(lengths_T)), np.int64)
    for s, idx in enumerate(plan):
        L = [int(lengths[i]) for i in idx]
        for t, T in enumerate(lengths_T):
            if T >= max(L):
                per_micro = -(-len(first_fit_decreasing(L, T)) // grad_accum)
                need[s, t] = -(-per_micro // dp) * dp  # rows split evenly over dp
    shapes = choose_shapes(need, lengths_T, grad_accum, dims)
    out = []
    for s, idx in enumerate(plan):
        fits = [(step_cost(grad_accum, R, T, dims), T, R) for R, T in shapes
                if 0 < need[s, lengths_T.index(T)] <= R]
        _, T, R = min(fits)
        out.append(PackedStep(idx, R, T, first_fit_decreasing([int(lengths[i]) for i in idx], T)))
    return out
