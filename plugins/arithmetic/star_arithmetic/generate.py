"""Seeded sampling of distinct n-digit addition problems.

A d-digit problem adds two d-digit numbers (0-9 for d = 1). ``draw`` spreads
problems evenly over the digit counts; a count with too few problems left (there
are only 100 one-digit problems) gives the rest of its share to the larger counts.
``draw_equal`` gives every count the same share (the dev set: accuracy per digit
count is measured on equally many questions) and fails instead of shifting it.
"""

from __future__ import annotations

import random
from collections.abc import Set as AbstractSet

Problem = tuple[int, int]

DENSE_LIMIT = 1_000_000
"""Largest problem space that is listed in full (when a draw takes most of it)."""


def bounds(d: int) -> tuple[int, int]:
    return (0 if d == 1 else 10 ** (d - 1)), 10**d - 1


def capacity(d: int) -> int:
    lo, hi = bounds(d)
    return (hi - lo + 1) ** 2


def n_digits(p: Problem) -> int:
    return len(str(p[0]))


class NotEnough(ValueError):
    """More problems asked for than the digit counts hold."""


def draw(rng: random.Random, digits: list[int], n: int, exclude: AbstractSet[Problem] = frozenset(),
         max_fraction: float = 1.0) -> list[Problem]:
    """``n`` distinct problems over ``digits`` (ascending), none in ``exclude``,
    taking at most ``max_fraction`` of any digit count's problems; shuffled."""
    taken_by_d: dict[int, int] = {}
    for p in exclude:
        taken_by_d[n_digits(p)] = taken_by_d.get(n_digits(p), 0) + 1
    out: list[Problem] = []
    left = n
    for i, d in enumerate(digits):
        share = -(-left // (len(digits) - i))  # ceil: what is left, spread over the remaining counts
        free = capacity(d) - taken_by_d.get(d, 0)
        k = min(share, free, int(capacity(d) * max_fraction))
        out += _draw_one(rng, d, k, free, exclude)
        left -= k
    if left:
        raise NotEnough(f"only {n - left} distinct problems of {digits[0]}-{digits[-1]} digits are available")
    rng.shuffle(out)
    return out


def equal_shares(digits: list[int], n: int) -> dict[int, int]:
    """``n`` split over ``digits`` (ascending) in shares that differ by at most one;
    the larger digit counts take the remainder."""
    base, extra = divmod(n, len(digits))
    return {d: base + (1 if i >= len(digits) - extra else 0) for i, d in enumerate(digits)}


def draw_equal(rng: random.Random, digits: list[int], n: int, max_fraction: float = 1.0) -> list[Problem]:
    """``n`` distinct problems in equal shares over ``digits`` (``equal_shares``),
    taking at most ``max_fraction`` of any digit count's problems; shuffled.
    NotEnough names the first count that cannot give its share."""
    shares = equal_shares(digits, n)
    for d, k in shares.items():
        allowed = int(capacity(d) * max_fraction)
        if k > allowed:
            raise NotEnough(f"an equal share of {n} over {digits[0]}-{digits[-1]} digits is {k} problems of "
                            f"{d} digits, but at most {allowed} of its {capacity(d)} may be taken "
                            f"(at most {allowed * len(digits)} in all)")
    out: list[Problem] = []
    for d, k in shares.items():
        out += _draw_one(rng, d, k, capacity(d), set())
    rng.shuffle(out)
    return out


def _draw_one(rng: random.Random, d: int, k: int, free: int, exclude: AbstractSet[Problem]) -> list[Problem]:
    lo, hi = bounds(d)
    if k <= 0:
        return []
    if k * 2 >= free:
        # Rejection sampling would crawl near exhaustion: list the free problems.
        if capacity(d) > DENSE_LIMIT:
            raise NotEnough(f"{k} problems of {d} digits is more than this generator lists")
        pool = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1) if (a, b) not in exclude]
        return rng.sample(pool, k)
    chosen: set[Problem] = set()
    out: list[Problem] = []
    while len(out) < k:
        p = (rng.randint(lo, hi), rng.randint(lo, hi))
        if p not in exclude and p not in chosen:
            chosen.add(p)
            out.append(p)
    return out
