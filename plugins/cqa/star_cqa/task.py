"""The CommonsenseQA task and its ``cqa_correct`` hint formatter.

Context format (the original STaR code's, ``device_inference.py``; docs/fidelity.md)::

    Q: <stem>
    Answer Choices:
    (a) <text>
    ...
    (e) <text>
    A:

A completion starts with a space and ends with "... the answer is <text> (<letter>)."
Few-shot prompts are examples in that format separated by blank lines; ``prompt()``
returns them with a trailing blank line so that ``prompt + context`` reads on (as the
original joins them: ``"\\n\\n".join(prompts) + "\\n\\n" + context``).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, cast

from star_engine import NON_EMPTY, Example, TrainExample, UserError
from star_engine.helpers import few_shot_prompts, get, prompt_files, read_blocks, read_jsonl
from star_filters import FewShotQA, stop_strings

from .answers import extract_letter, first_line, original_letter
from .known_files import DATA_FILES
from .prompts import answer_sentence, builtin_blocks, question_block

FilePath = Annotated[str | None, NON_EMPTY]  # a file's path, or none
MARK = " (CORRECT)"

__all__ = ["CQATask", "CorrectHint", "extract_letter", "mark_choice"]


def mark_choice(block: str, letter: str) -> str:
    """``block`` with ``MARK`` appended to the choice line of ``letter``.
    Only lines before the ``A:`` line are choice lines. Raises ValueError."""
    lines = block.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("A:"):
            break
        if line.lower().startswith(f"({letter.lower()})"):
            lines[i] = line + MARK
            return "\n".join(lines)
    raise ValueError(f"no choice line '({letter}) ...' before 'A:'")


def _split_answer(block: str) -> tuple[str, str] | None:
    """(question part ending in "A:", answer text) of a prompt example."""
    m = re.search(r"^A:", block, re.MULTILINE)
    return (block[: m.end()], block[m.end():]) if m else None


def _checked_blocks(path: str, kind: str, verbatim: bool) -> list[tuple[str, str, str]]:
    """Prompt examples of a file as (file:line, text, answer letter)."""
    out = []
    for where, text in read_blocks(path, verbatim=verbatim):
        parts = _split_answer(text)
        if not text.startswith("Q:") or parts is None:
            raise UserError(f"{where}: a {kind} prompt example must start with 'Q:' and have a line starting with 'A:'")
        letter = extract_letter(parts[1])
        if letter is None:
            raise UserError(f"{where}: the answer of this {kind} prompt example ends in no letter like '(b)'")
        out.append((where, text, letter))
    return out


def _marked(where: str, text: str, letter: str) -> str:
    """A hint prompt example derived from an answered one: its answer's choice marked."""
    try:
        return mark_choice(text, letter)
    except ValueError as e:  # only a user's prompts file can get here
        raise UserError(f"{where}: cannot mark the correct choice for the hint prompt: {e}") from None


def _builtin(kind: str) -> list[tuple[str, str, str]]:
    return [("built-in", text, cast(str, extract_letter(cast("tuple[str, str]", _split_answer(text))[1])))
            for text in builtin_blocks(kind == "direct")]


class CQATask(FewShotQA):
    """CommonsenseQA (official JSONL). Options:

    - ``prompts_file``, ``direct_prompts_file``: rationale / direct-answer examples
      (default: built in); ``hint_prompts_file``, ``direct_hint_prompts_file``: the
      hinted ones (default: derived, the answer's choice marked " (CORRECT)").
    - ``verbatim``: read prompt files as the original does (split on ``"\\n\\n"``,
      nothing stripped) and keep stems and choice texts exactly as in the data file
      (default: tidied, each on one line).
    - ``extraction``: ``"lenient"`` (default) or ``"original"`` (``answers.py``).
    - ``stored_completion``: what of a generation is checked and stored:
      ``"until_stop"`` (default: all of it, up to a stop string) or ``"original"``
      (its first line, cut at ``<|endoftext|>``).
    - ``stop``: the stop strings (default ``["\\n\\n", "\\nQ:"]``).
    """

    data_files = DATA_FILES  # the released files it reads, with their sha256 (star-engine data check)
    default_checker = "mc_letter"
    default_hint = "cqa_correct"
    read_lenient = staticmethod(extract_letter)  # prompt, extract and trim: FewShotQA's
    read_original = staticmethod(original_letter)
    store_original = staticmethod(first_line)

    def __init__(self, *, prompts_file: FilePath = None, hint_prompts_file: FilePath = None,
                 direct_prompts_file: FilePath = None, direct_hint_prompts_file: FilePath = None,
                 verbatim: bool = False, extraction: Literal["lenient", "original"] = "lenient",
                 stored_completion: Literal["until_stop", "original"] = "until_stop",
                 stop: list[str] | None = None) -> None:
        self.verbatim, self.extraction, self.stored_completion = verbatim, extraction, stored_completion
        self.stop = stop_strings(stop, ("\n\n", "\nQ:"))
        files = prompt_files(prompts_file, hint_prompts_file, direct_prompts_file, direct_hint_prompts_file)
        self.prompts = few_shot_prompts(files, lambda path, kind: _checked_blocks(path, kind, self.verbatim),
                                         _builtin, _marked)

    # ------------------------------------------------------------------ data

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is None:
            raise UserError(f"task.data.{split}: the cqa task reads its data from a file; set task.data.{split}",
                            key=f"task.data.{split}")
        # Only the official test split ships without answers; elsewhere a missing
        # answerKey is a broken row, not an unlabelled question.
        labelled = split != "test"
        examples: list[Example] = []
        seen: dict[str, str] = {}
        for where, row in read_jsonl(path):
            rid = get(row, "id", str, where)
            question = get(row, "question", dict, where)
            stem = get(question, "stem", str, where, "question.stem")
            raw_choices = get(question, "choices", list, where, "question.choices")
            choices: list[dict[str, str]] = []
            for i, choice in enumerate(raw_choices):
                name = f"question.choices[{i}]"
                if not isinstance(choice, dict):
                    raise UserError(f"{where}: field '{name}' must be an object")
                label = get(choice, "label", str, where, f"{name}.label").strip()
                text = get(choice, "text", str, where, f"{name}.text")
                if len(label) != 1 or not (label.isascii() and label.isalpha()):
                    raise UserError(f"{where}: field '{name}.label' must be one letter, got {label!r}")
                if any(c["label"] == label.lower() for c in choices):
                    raise UserError(f"{where}: field '{name}.label': duplicate label {label!r}")
                choices.append({"label": label.lower(), "text": text if self.verbatim else _one_line(text)})
            if len(choices) < 2:
                raise UserError(f"{where}: field 'question.choices' needs at least 2 choices, got {len(choices)}")
            key = get(row, "answerKey", str, where, required=labelled)
            answer = ""
            if key is not None:
                answer = key.strip().lower()
                if answer not in {c["label"] for c in choices}:
                    raise UserError(f"{where}: field 'answerKey' is {key!r}, which names no choice")
            if rid in seen:
                raise UserError(f"{where}: duplicate id {rid!r} (first at {seen[rid]})")
            seen[rid] = where
            concept = question.get("question_concept")
            stem = stem if self.verbatim else _one_line(stem)
            examples.append(Example(id=rid, question=stem, answer=answer, fields={
                "choices": choices, "concept": concept if isinstance(concept, str) else ""}))
        return examples

    # ------------------------------------------------------------------ formats

    def context(self, example: Example) -> str:
        return question_block(example.question, [(c["label"], c["text"]) for c in example.fields["choices"]])

    def gold_completion(self, example: Example, direct: bool) -> str:
        if not direct:
            raise UserError("cqa: CommonsenseQA has no gold rationales; gold completions need task.direct = true")
        if not example.answer:
            raise UserError(f"cqa: example {example.id!r} has no gold answer (unlabelled split)")
        text = next(c["text"] for c in example.fields["choices"] if c["label"] == example.answer)
        return " " + answer_sentence(text, example.answer, direct=True)

    def seed_examples(self) -> list[TrainExample]:
        return []


def _one_line(text: str) -> str:
    # A newline inside a stem or choice would break the one-line-per-choice format.
    return " ".join(text.strip().splitlines())


class CorrectHint:
    """``cqa_correct``: the context with " (CORRECT)" after the gold choice's line."""

    def context(self, task, example: Example) -> str:
        if not example.answer:
            raise UserError(f"cqa_correct: example {example.id!r} has no gold answer to hint")
        try:
            return mark_choice(task.context(example), example.answer)
        except ValueError as e:
            raise UserError(f"cqa_correct: example {example.id!r}: {e}") from None

    def leak_strings(self, task, example: Example) -> tuple[str, ...]:
        return ("(CORRECT)", "CORRECT")
