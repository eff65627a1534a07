"""Text in, text out, around the token samplers: prompts encoded (an over-long prompt
keeps its end), stop strings checked between decode chunks (continuous batching) and
cut from the decoded text, either path chosen by ``model.generation``."""

from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable, Sequence

from star_engine import GenRequest, GenSpec, Progress
from star_engine.helpers import cut_at_stop

from . import continuous as cont, static


def generate_text(params: Any, requests: Sequence[GenRequest], spec: GenSpec, *, tokenizer: Any, config: Any,
                  mesh: Any, decode: Any, continuous: bool = True, progress: Progress | None = None) -> list[str]:
    """Completions of ``requests`` (each with its own seed) under ``spec``, decoded as
    ``decode`` (``options.DecodeConfig``) says: continuous batching (a slot whose row ended,
    by end-of-text, a stop string or its budget, takes the next prompt; ``decode.chunk``
    decode steps between refills) or, ``continuous`` False, the static path
    (``model.generation = "static"``: length-sorted batches, each until its last row ends)."""
    tok = tokenizer
    max_prompt = config.n_ctx - spec.max_new_tokens
    if max_prompt < 1:  # validate_run refuses such a spec, naming its TOML key; a caller that skipped it
        raise ValueError(f"GenSpec.max_new_tokens = {spec.max_new_tokens} leaves no room for a prompt in "
                         f"n_ctx = {config.n_ctx} (the backend's validate_run refuses it)")
    # Prompts longer than the context keep their end; an empty one starts from end-of-text.
    prompts = [(tok.encode(r.prompt) or [tok.eos_id])[-max_prompt:] for r in requests]
    stops = tuple(s for s in spec.stop if s)
    # Continuous batching checks the stop strings after each chunk of decode steps and frees the slot.
    def stop(i: int, ids: Sequence[int]) -> bool:  # a row's tokens so far hold a stop string
        text = tok.decode(ids)
        return any(s in text for s in stops)

    if continuous:
        run: Callable[..., list[list[int]]] = functools.partial(cont.generate, stop=stop if stops else None)
    else:  # the static path: length-sorted batches, each until its last row ends
        run = static.generate_batches
    out = run(params, prompts, [r.seed for r in requests], [spec.max_new_tokens] * len(requests),
              config=config, decode=decode, mesh=mesh, progress=progress)
    return [cut_at_stop(tok.decode(ids), stops) for ids in out]
