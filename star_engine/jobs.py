"""The jobs the core gives a backend (``star_engine.api.Backend``) and what it gets back: how
to sample (``GenSpec``, ``GenRequest``), how to fine-tune (``TrainSpec``, ``TrainResult``) and
how to train a verifier (``PreferencePair``, ``PreferenceSpec``). Part of the plugin API
(``star_engine.__all__``)."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, Literal, get_args


@dataclass(frozen=True)
class GenSpec:
    """How to sample. ``temperature == 0`` means greedy."""

    max_new_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    batch_size: int


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` before the earliest occurrence of any stop string (``GenSpec.stop``; "" is none):
    how a completion is cut, by the backend's sampler and by a generation engine alike."""
    cut = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


@dataclass(frozen=True)
class GenRequest:
    """One sequence to sample; ``seed`` alone decides its randomness."""

    prompt: str
    seed: int


Packing = Literal["segments", "stream", "none"]
Loss = Literal["completion", "all"]
PACKINGS: tuple[str, ...] = get_args(Packing)
LOSSES: tuple[str, ...] = get_args(Loss)


@dataclass(frozen=True)
class TrainSpec:
    """One fine-tuning job. ``optimizer`` is the ``[training.optimizer]`` (or
    ``[base_training.optimizer]``) table as the backend declared it: an instance of its
    ``optimizer_table`` (a frozen ``Section``, checked and completed once, at load), or the plain
    table where the backend declares none.

    A step takes ``batch_size`` x ``grad_accum`` examples (``"stream"``: sequences)
    and minimises the mean loss over every loss-carrying token of the step.

    ``packing`` — how a backend lays examples out in its rows:

    - ``"segments"`` (default): several examples share a row, each attending only
      to itself, with its own positions; no example sees another, so the result is
      that of one example per row, without the padding.
    - ``"none"``: one example per row, padded.
    - ``"stream"``: as the original STaR code: the examples shuffled with seed 10
      (always 10, whatever the experiment seed), concatenated into one token stream,
      cut into sequences of the backend's training length + 1 (the last one
      dropped), plain causal attention over a whole sequence (an example sees the
      examples before it), steps cycling through the sequences in one fixed order;
      ``batch_size`` counts sequences. Too few examples for one sequence is a
      UserError naming ``training.packing``.

    ``loss`` — which tokens carry loss: ``"completion"`` (default; the completion
    and the end-of-text the backend appends) or ``"all"`` (every token of each
    example after its first; with ``"stream"`` every token of a sequence after its
    first, which is what the released original code trained on).
    """

    steps: int
    batch_size: int
    grad_accum: int
    seed: int
    optimizer: Any  # the backend's optimizer object (its optimizer_table), or a table
    packing: str = "segments"
    loss: str = "completion"
    adapter: Any = None
    """The section's ``adapter`` (parameter-efficient fine-tuning, e.g. ``{ kind = "lora",
    rank = 16 }``): its ``kind`` is one of the backend's ``adapter_kinds`` (the core refuses a
    table the backend cannot train); an instance of that kind's declaration where the backend
    has one (``adapter_tables``: checked and completed once, at load), else the table; what
    needs the model is the backend's to check (``validate_run``); None: every weight is trained."""


@dataclass(frozen=True)
class TrainResult:
    checkpoint: str  # a reference the same backend can load (a path)
    checkpoint_id: str  # stable content id (e.g. sha256 of its manifest)
    steps: int
    tokens: int  # tokens that carried loss
    losses: tuple[float, ...]  # one per optimizer step


@dataclass(frozen=True)
class PreferencePair:
    """One preference of a verifier's training set (``Backend.train_preferences``): two
    completions of ``prompt``, ``chosen`` a kept (right) rationale and ``rejected`` a wrong one of
    the same question, stored with the same prompt. What is compared is the log-probability of
    each completion's tokens and of the end-of-text token the backend appends (the tokens a
    ``TrainExample``'s loss covers)."""

    prompt: str
    chosen: str
    rejected: str


@dataclass(frozen=True)
class PreferenceSpec:
    """One verifier-training job: DPO (Rafailov et al. 2023, Eq. 7) from ``init``, the reference
    model being ``init`` itself, frozen:
    ``L = -mean log sigmoid(beta * [(log p(c) - log p_ref(c)) - (log p(r) - log p_ref(r))])``
    over the pairs of a step, log-probabilities summed over each completion's tokens (as
    ``PreferencePair`` says). A step takes ``batch_size`` x ``grad_accum`` pairs, drawn in an
    order that ``seed`` alone decides. ``optimizer`` and ``adapter`` are as ``TrainSpec``'s
    (``[verifier.optimizer]``, ``[verifier.adapter]``)."""

    steps: int
    batch_size: int
    grad_accum: int
    seed: int
    optimizer: Any  # as TrainSpec.optimizer
    beta: float
    adapter: Any = None  # as TrainSpec.adapter
