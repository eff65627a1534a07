"""Training batches: how examples become the rows of a step (``packing``) and which
targets carry loss (``loss``).

A step's batch is five (A, R, T) arrays: A accumulation micro-batches of R rows of
T tokens. ``tokens`` are the inputs and ``targets`` the next tokens; ``weights``
marks the targets that carry loss; ``segments`` numbers the examples of a row
(1, 2, ...; 0 = padding): a token attends only to earlier tokens of its own
segment; ``positions`` restart at 0 for every segment.

- ``"none"``: one example per row, right-padded to a power-of-two bucket (the
  previous path, kept as the baseline).
- ``"segments"``: the step's examples are packed into as few rows as fit (first-fit
  decreasing), block-diagonal causal attention, positions per example; the run's
  few compiled (R, T) shapes are chosen from its whole plan (``packplan.py``).
  Every token is predicted from its own example only, so a packed step is the same
  optimisation problem as a padded one with the same examples.
- ``"stream"``: the original STaR code's packing (create_finetune_tfrecords.py at
  ezelikman/STaR@6ffd3c4): examples shuffled with ``random.seed(10)``, concatenated
  into one stream, cut into chunks of seq_len + 1 tokens, the last chunk dropped,
  the chunks shuffled; plain causal attention over a whole chunk (an example sees
  the examples before it in its chunk). ``batch_size`` counts chunks.

``loss``: ``"completion"`` (the completion and its end-of-text) or ``"all"`` (every
token after the first of each example; with ``"stream"`` every token of a chunk
after its first, as the released code trained).
"""

from __future__ import annotations

import random
from typing import NamedTuple
from collections.abc import Iterator, Sequence

import numpy as np

from star_engine import LOSSES, PACKINGS  # noqa: F401  (the TrainSpec's values)

from . import packplan
from .packplan import plan_steps

STREAM_SEED = 10  # create_finetune_tfrecords.py: --seed default 10, used by every STaR iteration
KEYS = ("tokens", "targets", "weights", "segments", "positions")


class PackingError(ValueError):
    """The examples cannot be laid out as asked (stream packing without a single chunk)."""


class Encoded(NamedTuple):
    ids: np.ndarray  # int32 (n,): prompt + completion + end-of-text
    n_prompt: int  # the first n_prompt ids carry no loss with loss = "completion"


def encode_example(tokenizer, prompt: str, completion: str, seq_len: int | None) -> Encoded:
    """Token ids of prompt + completion + end-of-text, at most ``seq_len`` long
    (``None``: no limit, for stream packing, where an example may span chunks).

    Prompt and completion are encoded separately (generation sees the prompt
    alone, so its tokens must not merge with the completion's). Too long: the
    prompt loses tokens from its left (one is kept to predict the completion's
    first token); a completion that cannot fit raises ValueError.
    """
    p = tokenizer.encode(prompt)
    c = tokenizer.encode(completion) + [tokenizer.eos_id]
    if seq_len is None:
        return Encoded(np.asarray(p + c, np.int32), len(p))
    keep_prompt = min(len(p), max(seq_len - len(c), 0))
    if len(c) + (1 if p else 0) > seq_len:
        raise ValueError(f"completion of {len(c)} tokens (with end-of-text) does not fit seq_len={seq_len} "
                         f"after its prompt; raise seq_len or shorten the completion: {completion[:60]!r}...")
    ids = p[len(p) - keep_prompt:] + c
    return Encoded(np.asarray(ids, np.int32), keep_prompt)


def bucket_lengths(seq_len: int, smallest: int = 16) -> list[int]:
    """Powers of two from ``smallest`` below seq_len, then seq_len itself."""
    out, n = [], smallest
    while n < seq_len:
        out.append(n)
        n *= 2
    return out + [seq_len]


def check_options(packing: str, loss: str) -> None:
    """ValueError naming the option (``packing: ...``) for a value not offered."""
    if packing not in PACKINGS:
        raise ValueError(f"packing: must be one of {list(PACKINGS)}, got {packing!r}")
    if loss not in LOSSES:
        raise ValueError(f"loss: must be one of {list(LOSSES)}, got {loss!r}")


# ----------------------------------------------------------------------------- batches


def empty_batch(A: int, R: int, T: int, pad_id: int) -> dict[str, np.ndarray]:
    return {"tokens": np.full((A, R, T), pad_id, np.int32), "targets": np.zeros((A, R, T), np.int32),
            "weights": np.zeros((A, R, T), bool), "segments": np.zeros((A, R, T), np.int32),
            "positions": np.zeros((A, R, T), np.int32)}


def dense_batch(tokens_ABT: np.ndarray) -> dict[str, np.ndarray]:
    """Full rows of one sequence each, loss on every next token (benchmarks)."""
    A, R, T = tokens_ABT.shape
    b = empty_batch(A, R, T, 0)
    b["tokens"][:] = tokens_ABT
    b["targets"][..., :-1] = tokens_ABT[..., 1:]
    b["weights"][..., :-1] = True
    b["segments"][:] = 1
    b["positions"][:] = np.arange(T)
    return b


def _place(batch: dict[str, np.ndarray], a: int, r: int, offset: int, segment: int, ex: Encoded,
           loss: str) -> None:
    """Write example ``ex`` into row (a, r) at ``offset`` as segment ``segment``."""
    ids, n = ex.ids, len(ex.ids)
    sl = slice(offset, offset + n)
    batch["tokens"][a, r, sl] = ids
    batch["targets"][a, r, offset:offset + n - 1] = ids[1:]
    # target j (token j + 1 predicted from token j) carries loss if token j + 1 does
    first = 1 if loss == "all" else max(ex.n_prompt, 1)
    batch["weights"][a, r, offset + first - 1:offset + n - 1] = True
    batch["segments"][a, r, sl] = segment
    batch["positions"][a, r, sl] = np.arange(n)


def collate_padded(encoded: Sequence[Encoded], idx: np.ndarray, *, grad_accum: int, batch_size: int,
                   seq_len: int, pad_id: int, dp: int = 1, loss: str = "completion") -> dict[str, np.ndarray]:
    """packing "none": example j of the step in micro-batch j // batch_size, row
    j % batch_size, right-padded to the smallest bucket that fits the step's longest;
    rows padded with empty ones to a multiple of ``dp``."""
    longest = max(len(encoded[i].ids) for i in idx)
    T = next(b for b in bucket_lengths(seq_len) if b >= longest)
    batch = empty_batch(grad_accum, -(-batch_size // dp) * dp, T, pad_id)
    for j, i in enumerate(idx):
        a, r = divmod(j, batch_size)
        _place(batch, a, r, 0, 1, encoded[i], loss)
    return batch


def collate_packed(encoded: Sequence[Encoded], step: packplan.PackedStep, *, grad_accum: int,
                   pad_id: int, loss: str = "completion") -> dict[str, np.ndarray]:
    """packing "segments": a planned step (``packplan.plan_packed``): row k holds its
    examples one after the other (in plan order) and goes to micro-batch k // R."""
    batch = empty_batch(grad_accum, step.R, step.T, pad_id)
    for k, members in enumerate(step.rows):
        a, r = divmod(k, step.R)
        offset = 0
        for s, m in enumerate(sorted(members)):
            ex = encoded[step.idx[m]]
            _place(batch, a, r, offset, s + 1, ex, loss)
            offset += len(ex.ids)
    return batch


# ----------------------------------------------------------------------------- stream


def stream_chunks(encoded: Sequence[Encoded], seq_len: int, loss: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, loss flags), each (n_chunks, seq_len + 1), as the original builds its
    tfrecords: ``random.seed(10)``, the examples shuffled, concatenated, cut into
    chunks of seq_len + 1 tokens of which the last is dropped (even when full:
    ``chunk_and_finalize`` keeps ``sequences[:-1]``), then the chunks shuffled with
    the same generator. ``loss`` flags mark loss-carrying tokens (all, or the
    completions)."""
    rng = random.Random(STREAM_SEED)
    order = list(range(len(encoded)))
    rng.shuffle(order)
    total = sum(len(e.ids) for e in encoded)
    n = seq_len + 1
    n_chunks = max(total - 1, 0) // n
    if n_chunks == 0:
        return np.zeros((0, n), np.int32), np.zeros((0, n), bool)
    ids = np.concatenate([encoded[i].ids for i in order])[:n_chunks * n]
    if loss == "all":
        flags = np.ones(n_chunks * n, bool)
    else:
        flags = np.concatenate([np.arange(len(encoded[i].ids)) >= encoded[i].n_prompt
                                for i in order])[:n_chunks * n]
    chunk_order = list(range(n_chunks))
    rng.shuffle(chunk_order)
    return ids.reshape(n_chunks, n)[chunk_order], flags.reshape(n_chunks, n)[chunk_order]


def stream_steps(chunks: np.ndarray, flags: np.ndarray, *, steps: int, grad_accum: int, batch_size: int,
                 dp: int = 1, pad_id: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Step batches over the chunks, as the original's loader reads its tfrecord:
    ``batch_size x grad_accum`` consecutive chunks per step (chunk j of a step in
    micro-batch j // batch_size), the remainder of a pass dropped, every pass in the
    same order (TFRecordLoader.reset). Fewer chunks than one step: each step takes
    all of them (rows left empty), where the original would produce no step."""
    per_step = batch_size * grad_accum
    n_chunks, n = chunks.shape
    T = n - 1
    per_pass = max(n_chunks // per_step, 1)
    R = -(-batch_size // dp) * dp
    for s in range(steps):
        first = (s % per_pass) * per_step
        batch = empty_batch(grad_accum, R, T, pad_id)
        for j, c in enumerate(range(first, min(first + per_step, n_chunks))):
            a, r = divmod(j, batch_size)
            batch["tokens"][a, r] = chunks[c, :-1]
            batch["targets"][a, r] = chunks[c, 1:]
            batch["weights"][a, r] = flags[c, 1:]
            batch["segments"][a, r] = 1
            batch["positions"][a, r] = np.arange(T)
        yield batch


def step_batches(encoded: Sequence[Encoded], *, steps: int, batch_size: int, grad_accum: int, seed: int,
                 seq_len: int, pad_id: int, dp: int = 1, packing: str = "segments", loss: str = "completion",
                 dims: tuple[int, int, int, int] = (2, 128, 512, 264)) -> Iterator[dict[str, np.ndarray]]:
    """The host batches of ``steps`` optimizer steps (deterministic in ``seed``;
    stream packing's order is the original's fixed one). Bad options, and stream
    packing without a single chunk, raise ValueError here, before any step."""
    check_options(packing, loss)
    if not encoded:
        raise ValueError("no training examples")
    if packing == "stream":
        chunks, flags = stream_chunks(encoded, seq_len, loss)
        if len(chunks) == 0:
            total = sum(len(e.ids) for e in encoded)
            raise PackingError(f"stream packing needs more than seq_len + 1 = {seq_len + 1} tokens (the last chunk "
                             f"is dropped, as in the original), and the {len(encoded)} examples make {total}; "
                             f"use packing = \"segments\" or more examples")
        return stream_steps(chunks, flags, steps=steps, grad_accum=grad_accum, batch_size=batch_size, dp=dp,
                            pad_id=pad_id)
    lengths = [len(e.ids) for e in encoded]
    if packing == "none":
        plan = plan_steps(lengths, steps=steps, per_step=batch_size * grad_accum, seed=seed)
        return (collate_padded(encoded, idx, grad_accum=grad_accum, batch_size=batch_size, seq_len=seq_len,
                               pad_id=pad_id, dp=dp, loss=loss) for idx in plan)
    packed = packplan.plan_packed(lengths, steps=steps, batch_size=batch_size, grad_accum=grad_accum, seed=seed,
                                  seq_len=seq_len, dp=dp, dims=dims)
    return (collate_packed(encoded, step, grad_accum=grad_accum, pad_id=pad_id, loss=loss) for step in packed)
