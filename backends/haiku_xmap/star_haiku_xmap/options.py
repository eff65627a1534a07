"""The ``[model]`` table's run-time options (how to generate, train and store, not the
model's shape), checked before anything is built: each failure is a ``UserError``
naming its key, as ``model.<key>: ...``; and the optimizer tables' typed section
(``AdamW``), which the core checks and completes the ``[*.optimizer]`` tables by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from star_engine.errors import UserError
from star_engine.options import is_int
from star_engine.schema import above, at_least, between
from star_engine.settings import Section

from .config import ARCHITECTURES, DTYPES

GENERATION = ("continuous", "static")
OPT_STATE_DTYPES = ("float32", "bfloat16", "mixed")  # mixed: first moment bf16, second fp32
Schedule = Literal["constant", "linear", "cosine"]
SCHEDULES = get_args(Schedule)


@dataclass(frozen=True)
class AdamW(Section):
    """The ``[base_training.optimizer]`` and ``[training.optimizer]`` tables (the backend's:
    ``HaikuXmapBackend.optimizer_table``): global-norm clipping, then AdamW (weight decay on
    matrices only); the learning rate rises linearly from 0 to ``lr`` over ``warmup_steps``,
    then stays (``constant``) or anneals (``linear``, ``cosine``) to ``end_lr`` at the last
    step. The defaults are the paper's: 1e-6 after 100 warmup steps, constant."""

    lr: Annotated[float, above(0)] = 1e-6
    warmup_steps: Annotated[int, at_least(0)] = 100
    schedule: Schedule = "constant"
    end_lr: Annotated[float, at_least(0)] = 1e-6
    weight_decay: Annotated[float, at_least(0)] = 0.0
    clip_norm: Annotated[float, above(0)] = 1.0
    b1: Annotated[float, between(0, 1, hi_open=True)] = 0.9
    b2: Annotated[float, between(0, 1, hi_open=True)] = 0.999


def check_run_options(*, generation: Any, generation_chunk: Any, share_prefix: Any, zero: Any,
                      opt_state_dtype: Any, remat: Any, dtype: Any, architecture: Any) -> None:
    """The values each option may take (the model's dtypes against each other are
    ``train.check_dtypes``'s, the shape options the config's)."""
    if generation not in GENERATION:
        raise UserError(f"model.generation: must be one of {list(GENERATION)}, got {generation!r}")
    if not is_int(generation_chunk) or not 1 <= generation_chunk <= 4096:
        raise UserError(f"model.generation_chunk: must be an int in [1, 4096], got {generation_chunk!r}")
    for name, value in (("share_prefix", share_prefix), ("remat", remat)):
        if not isinstance(value, bool):
            raise UserError(f"model.{name}: must be true or false, got {value!r}")
    if isinstance(zero, bool) or zero not in (0, 1):
        raise UserError(f"model.zero: must be 0 (off) or 1 (ZeRO-1: optimizer state split over dp), got {zero!r}")
    if opt_state_dtype not in OPT_STATE_DTYPES:
        raise UserError(f"model.opt_state_dtype: must be one of {list(OPT_STATE_DTYPES)}, got {opt_state_dtype!r}")
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"model.dtype: must be one of {list(DTYPES)}, got {dtype!r}")
    if architecture is not None and architecture not in ARCHITECTURES:
        raise UserError(f"model.architecture: must be one of {list(ARCHITECTURES)}, got {architecture!r}")
