"""The learning rate as an argument of the compiled step, so that stages of different
lengths compile one program.

``AdamW.schedule_fn(total_steps)`` bakes the stage's length into the schedule's constants
(the cosine's ``decay_steps``), so inside the step it made every STaR iteration, whose
step count differs (``steady_grow``), a new program: a new compile of every row shape
each iteration (~4 s each for the addition demo's model on 2 cores, minutes for a large
model). Here the schedule runs as its own small jitted program on the step counter
(``StepLr.value_at``), and the step reads the value from its argument (``StepLr`` is the
optax schedule the optimizer is built with: while the step is traced it returns the
traced argument). The schedule's operations and the step's are the ones they were, in
two programs instead of one, so the weights a stage trains are the same bit for bit
(``tests/test_train.py``); the step's program no longer depends on the stage's length,
and the persistent compilation cache serves it to the next stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


class StepLr:
    """An optax schedule whose value is the step's ``lr`` argument (``make_update(step_lr=)``
    sets it while tracing), and the stage's real schedule as its own program."""

    def __init__(self, schedule: Any, out_sharding: Any = None) -> None:
        self.value_at = jax.jit(schedule, out_shardings=out_sharding)  # count -> lr
        self.current: Any = None

    def __call__(self, count: Any) -> Any:
        if self.current is None:
            raise RuntimeError("StepLr: the step's lr is read only while make_update's step is traced")
        return self.current

    def feeding(self, update: Callable, base: Any = None) -> Callable:
        """``update(state, batch)`` for ``run_steps``: the step (``make_update(step_lr=self)``)
        given its learning rate and, for a LoRA stage, the frozen ``base``."""
        extra = () if base is None else (base,)
        return lambda state, batch: update(state, batch, self.value_at(state.step), *extra)
