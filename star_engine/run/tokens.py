"""Counting tokens with the backend's tokenizer, and the prompts it cuts.

A backend keeps at most ``Backend.prompt_capacity(spec)`` tokens of a prompt and drops the
start of a longer one (a few-shot prompt loses its first examples, or a question its
beginning) without a word. ``Truncation`` counts those prompts for each stage that generates:
each prompt's flag goes into its row (``prompt_truncated``), the counts into
``metrics.parquet`` (``prompts_truncated``) and the ``iteration_done`` event, and a stage
that cut any logs one ``prompts_truncated`` warning.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from ..api import Backend
from ..jobs import GenSpec
from ..capabilities import CapsPrompts, CountsTokens
from ..errors import PluginError
from ..config.registry import Registry
from ..config.schema import is_int

log = structlog.get_logger("star_engine")


def count_tokens(backend: Backend, texts: Sequence[str], registry: Registry) -> list[int]:
    """Tokens per text: the backend's optional ``count_tokens`` (``capabilities.CountsTokens``), else UTF-8
    bytes. ``registry`` built the backend (a failure names its plugin)."""
    if not isinstance(backend, CountsTokens):
        return [len(t.encode("utf-8")) for t in texts]
    with registry.calling(backend, "count_tokens"):
        counted = backend.count_tokens(list(texts))
    out = list(counted)
    if len(out) != len(texts) or not all(is_int(x) and x >= 0 for x in out):
        raise PluginError(f"model: backend count_tokens returned {len(out)} values for {len(texts)} texts", key='model')
    return out


class Truncation:
    """The prompts of each stage that the backend cuts (``Backend.prompt_capacity``)."""

    def __init__(self, backend: Backend, registry: Registry):
        self.backend, self.registry = backend, registry
        self.counts: dict[str, int] = {}  # stage -> prompts cut, since the last pop()

    def capacity(self, spec: GenSpec) -> int | None:
        """The backend's prompt capacity for ``spec``, or None when it does not say (``capabilities.CapsPrompts``)."""
        if not isinstance(self.backend, CapsPrompts):
            return None
        with self.registry.calling(self.backend, "prompt_capacity"):
            cap = self.backend.prompt_capacity(spec)
        if not is_int(cap) or cap < 0:
            raise PluginError(f"model: backend prompt_capacity returned {cap!r} (expected an integer >= 0)", key='model')
        return cap

    def flags(self, prompts: Sequence[str], spec: GenSpec, stage: str, iteration: int) -> Sequence[bool | None]:
        """One flag per prompt: cut (True) or whole (False); all None when the backend does not
        say. A stage that cuts any logs one warning (the count, the capacity, the longest)."""
        cap = self.capacity(spec)
        if cap is None or not prompts:
            return [None] * len(prompts)
        lengths = count_tokens(self.backend, prompts, self.registry)
        cut = [n > cap for n in lengths]
        self.counts[stage] = self.counts.get(stage, 0) + sum(cut)
        if any(cut):
            log.warning("prompts_truncated", iteration=iteration, stage=stage, prompts=sum(cut), of=len(prompts),
                        capacity=cap, longest=max(lengths),
                        note="the backend keeps the end of a prompt longer than its context less max_new_tokens: "
                             "these lost their start (a few-shot prompt its first examples)")
        return cut

    def pop(self) -> dict[str, int]:
        """Prompts cut per stage since the last call (stages that counted none included)."""
        out, self.counts = self.counts, {}
        return out
