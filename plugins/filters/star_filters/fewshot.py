"""What the few-shot question-answer tasks written after the released STaR code share
(``cqa``, ``gsm8k``): one ``prompt``, ``extract`` and ``trim`` (:class:`FewShotQA`) and one
check of their ``stop`` option (:func:`stop_strings`). Public: other plugins import these
names from ``star_filters`` (README, "For tasks").

Such a task reads a generation two ways, chosen by its option ``extraction``: ``"lenient"``
(the project's default) or ``"original"`` (exactly as the released code). Under
``"original"`` the generation is first cleaned up as GPT-2's decoding did
(:func:`star_filters.text.clean_up_tokenization`), before extraction and storage, as the
released code decoded. Its option ``stored_completion`` says what of a generation is checked
and stored: ``"until_stop"`` (all of it, up to a stop string) or ``"original"`` (what the
released code stored).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Literal

from star_engine import PROMPT_KINDS, UserError

from .text import clean_up_tokenization

__all__ = ["FewShotQA", "stop_strings"]


def stop_strings(stop: Sequence[str] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """A task's ``stop`` option as its stop strings: ``default`` when not given; a
    UserError naming ``stop`` when one of them is empty (it would end every generation)."""
    strings = default if stop is None else tuple(stop)
    if "" in strings:
        raise UserError(f"stop: must be a list of non-empty strings, got {stop!r}")
    return strings


class FewShotQA(ABC):
    """The formats a few-shot question-answer task shares: ``prompt``, ``extract`` and
    ``trim`` of the ``Task`` protocol. A subclass sets in its ``__init__`` ``prompts`` (the
    four few-shot prompts by kind, as ``star_engine.helpers.few_shot_prompts`` gives them),
    ``extraction`` and ``stored_completion`` (the module docstring), and gives its three
    readings of a generation as static methods: :meth:`read_lenient`,
    :meth:`read_original` and :meth:`store_original`."""

    prompts: Mapping[str, str]
    extraction: Literal["lenient", "original"]
    stored_completion: Literal["until_stop", "original"]

    @staticmethod
    @abstractmethod
    def read_lenient(generation: str) -> str | None:
        """The answer of a generation under ``extraction = "lenient"``, or None."""

    @staticmethod
    @abstractmethod
    def read_original(generation: str) -> str | None:
        """The answer of a generation exactly as the released code reads it, or None."""

    @staticmethod
    @abstractmethod
    def store_original(generation: str) -> str:
        """What of a generation the released code checks and stores."""

    def prompt(self, kind: str) -> str:
        if kind not in self.prompts:
            raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(PROMPT_KINDS)}")
        return self.prompts[kind]

    def extract(self, generation: str) -> str | None:
        return self.read_original(generation) if self.extraction == "original" else self.read_lenient(generation)

    def trim(self, generation: str) -> str:
        """What of a generation is checked and stored (``stored_completion``); under
        ``extraction = "original"`` with GPT-2's decoding clean-up first, as the released
        code decoded (``star_filters.text``)."""
        if self.extraction == "original":
            generation = clean_up_tokenization(generation)
        return self.store_original(generation) if self.stored_completion == "original" else generation
