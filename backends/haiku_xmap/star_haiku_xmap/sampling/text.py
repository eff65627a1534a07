"""Text in, text out, around the token samplers: prompts encoded (an over-long prompt
keeps its end), stop strings checked between decode chunks (continuous batching) and
cut from the decoded text, either path chosen by ``model.generation``."""

from __future__ import annotations

import functools
from typing import Any
from collections.abc import Sequence

from star_engine import GenRequest, GenSpec, Progress


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` before the earliest occurrence of any stop string."""
    cut = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


def generate_text(params: Any, requests: Sequence[GenRequest], spec: GenSpec, *, tokenizer: Any, config: Any,
                  mesh: Any, generation: str, chunk: int, share_prefix: bool,
                  progress: Progress | None = None) -> list[str]:
    """Completions of ``requests`` (each with its own seed) under ``spec``: the static
    path (``generation = "static"``: length-sorted batches, each until its last row ends)
    or continuous batching (a slot whose row ended, by end-of-text, a stop string or its
    budget, takes the next prompt; ``chunk`` decode steps between refills)."""
    from . import continuous, static  # jax: this module loads with the plugin, which must not import jax

    tok = tokenizer
    max_prompt = config.n_ctx - spec.max_new_tokens
    # Prompts longer than the context keep their end; an empty one starts from end-of-text.
    prompts = [(tok.encode(r.prompt) or [tok.eos_id])[-max_prompt:] for r in requests]
    stops = tuple(s for s in spec.stop if s)
    # Continuous batching checks the stop strings after each chunk of decode steps and frees the slot.
    def stop(i: int, ids: Sequence[int]) -> bool:  # a row's tokens so far hold a stop string
        text = tok.decode(ids)
        return any(s in text for s in stops)

    if generation == "continuous":
        run = functools.partial(continuous.generate, chunk=chunk, stop=stop if stops else None,
                                share_prefix=share_prefix)
    else:  # the static path: length-sorted batches, each until its last row ends
        run = functools.partial(static.generate_batches, max_new_tokens=spec.max_new_tokens)
    out = run(params, prompts, [r.seed for r in requests], [spec.max_new_tokens] * len(requests),
              config=config, temperature=float(spec.temperature), top_p=float(spec.top_p),
              eos_id=tok.eos_id, pad_id=tok.pad_id, valid_vocab=tok.vocab_size, mesh=mesh,
              slots=spec.batch_size, progress=progress)
    return [cut_at_stop(tok.decode(ids), stops) for ids in out]
