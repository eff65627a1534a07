"""The ``[*.adapter]`` table of kind ``"lora"`` as declared options (``LoraOptions``; the
backend's ``adapter_tables``), checked as the core checks every declared table; jax-free.
What needs the model is ``lora.adapter_spec``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal
from collections.abc import Mapping

from star_engine import NON_EMPTY, Section, UserError, above, at_least
from star_engine.helpers import check_table


@dataclass(frozen=True)
class LoraOptions(Section):
    """The ``[*.adapter]`` table of kind ``"lora"`` (the backend's ``adapter_tables``): the rank
    r, alpha (default 2 r; the scale is alpha / r, ``rslora``: alpha / sqrt r) and the target
    projections by peft's names (default: every attention and MLP projection of the
    architecture). What needs the model (the targets it has, a rank within each target's
    sides) is ``lora.adapter_spec``'s, which makes the ``LoraSpec`` trained."""

    kind: Literal["lora"]
    rank: Annotated[int, at_least(1)] = 16
    alpha: Annotated[float | None, above(0)] = None
    targets: Annotated[tuple[str, ...] | None, NON_EMPTY] = None
    rslora: bool = False

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | LoraOptions, key: str = "adapter") -> LoraOptions:
        """An ``adapter`` table (``TrainSpec.adapter``) as the object; a table is checked here,
        the ``UserError`` naming ``key.<name>``; an object is used as it is."""
        if isinstance(table, LoraOptions):
            return table
        if not isinstance(table, Mapping):
            raise UserError(f"{key}: must be a table like {{ kind = \"lora\", rank = 16, alpha = 32 }}, got {table!r}",
                            key=key)
        checked = check_table(dict(table), cls.schema(), key)
        if checked.get("targets") is not None:
            checked["targets"] = tuple(checked["targets"])
        return cls(**checked)

