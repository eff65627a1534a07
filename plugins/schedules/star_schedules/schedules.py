"""Step schedules of the original STaR: optimizer steps for iteration ``n`` (1-based).

The original (``get_n_steps`` in ezelikman/STaR's ``iteration_train.py``) truncates
with ``int()``, i.e. floors; so do these (``exponential_grow``: 40 * 1.2**2 = 57.6
gives 57, where rounding would give 58). Arithmetic is exact: a float option is
taken as the decimal it prints as (``0.2`` is 1/5, ``1.2`` is 6/5), so a product
that is an integer in decimal is not floored one below by binary rounding: 45
examples at 1.4 epochs are 63 steps here, where the original's floats give
``int(45 * (1.0 + 0.2 * 2)) == 62`` (62.99999999999999).

Every schedule gives 0 steps when there are no examples (there is nothing to train
on), and ``max_steps`` (0 = no cap) caps the result. Each class is a factory whose
keyword-only ``__init__`` parameters declare the schedule's TOML options (types and
ranges, checked by the registry before the schedule is built).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Annotated

from star_engine import NonNegFloat, NonNegInt, UserError, above
from star_engine.helpers import is_int


def _exact(value: float) -> Fraction:
    """The decimal a float option was written as: 0.2 -> 1/5."""
    return Fraction(repr(value))


def _check_call(iteration: int, n_examples: int, batch_size: int, grad_accum: int) -> None:
    for name, value, minimum in (("iteration", iteration, 1), ("n_examples", n_examples, 0),
                                 ("batch_size", batch_size, 1), ("grad_accum", grad_accum, 1)):
        if not is_int(value) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


class _Schedule:
    max_steps: int

    def _cap(self, steps: int) -> int:
        return min(steps, self.max_steps) if self.max_steps else steps



class EpochsSchedule(_Schedule):
    """STaR's default: a growing number of epochs over the kept examples.

    ``steps = floor(n_examples * (base_epochs + add_epochs * (n - 1)) /
    (batch_size * grad_accum))``, at least ``min_steps`` when there are examples.
    """

    def __init__(self, *, base_epochs: NonNegFloat = 1.0, add_epochs: NonNegFloat = 0.2,
                 min_steps: NonNegInt = 1, max_steps: NonNegInt = 0) -> None:
        self.base_epochs, self.add_epochs = base_epochs, add_epochs
        self.min_steps, self.max_steps = min_steps, max_steps
        if self.max_steps and self.min_steps > self.max_steps:
            raise UserError(f"min_steps: must not exceed max_steps ({self.max_steps}), "
                            f"got {self.min_steps}")
        self._base = _exact(self.base_epochs)
        self._add = _exact(self.add_epochs)

    def steps(self, iteration: int, n_examples: int, batch_size: int, grad_accum: int) -> int:
        _check_call(iteration, n_examples, batch_size, grad_accum)
        if n_examples == 0:
            return 0
        epochs = self._base + self._add * (iteration - 1)
        steps = math.floor(n_examples * epochs / (batch_size * grad_accum))
        return self._cap(max(steps, self.min_steps))


class SteadyGrowSchedule(_Schedule):
    """``steps = start_steps + add_steps * (n - 1)``."""

    def __init__(self, *, start_steps: NonNegInt = 40, add_steps: NonNegInt = 20, max_steps: NonNegInt = 0) -> None:
        self.start_steps, self.add_steps, self.max_steps = start_steps, add_steps, max_steps

    def steps(self, iteration: int, n_examples: int, batch_size: int, grad_accum: int) -> int:
        _check_call(iteration, n_examples, batch_size, grad_accum)
        if n_examples == 0:
            return 0
        return self._cap(self.start_steps + self.add_steps * (iteration - 1))


class ExponentialGrowSchedule(_Schedule):
    """``steps = floor(start_steps * grow ** (n - 1))``: the paper's "40 steps, +20%
    per iteration" gives 40, 48, 57, 69, 82, 99, … (floor, as the original's ``int()``)."""

    def __init__(self, *, start_steps: NonNegInt = 40, grow: Annotated[float, above(0)] = 1.2,
                 max_steps: NonNegInt = 0) -> None:
        self.start_steps, self.grow, self.max_steps = start_steps, grow, max_steps
        self._grow = _exact(self.grow)

    def steps(self, iteration: int, n_examples: int, batch_size: int, grad_accum: int) -> int:
        _check_call(iteration, n_examples, batch_size, grad_accum)
        if n_examples == 0:
            return 0
        return self._cap(math.floor(self.start_steps * self._grow ** (iteration - 1)))
