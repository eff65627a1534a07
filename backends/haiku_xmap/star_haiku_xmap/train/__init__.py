"""Fine-tuning (``trainer``: the jit'd step and its loop; ``packing`` / ``packplan``: examples into
rows), its resumable snapshots (``resume``), and the stages beside the plain one: LoRA adapters
(``lora_stage``) and DPO verifiers with sequence scoring (``preference``).

Importing the package imports no jax. Until release 0.2 it also lends the names of the old
module star_haiku_xmap.train (now trainer), with a DeprecationWarning.
"""

from __future__ import annotations

from typing import Any

from .. import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
