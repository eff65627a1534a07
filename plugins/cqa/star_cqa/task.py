"""The CommonsenseQA task and its ``cqa_correct`` hint formatter.

Context format (REFERENCE.md)::

    Q: <stem>
    Answer Choices:
    (a) <text>
    ...
    (e) <text>
    A:

A completion starts with a space and ends with "... the answer is <text> (<letter>)."
Few-shot prompts are examples in that format separated by blank lines; ``prompt()``
returns them with a trailing blank line so that ``prompt + context`` reads on.
"""

from __future__ import annotations

import re

from star_engine.api import Example, TrainExample
from star_engine.errors import UserError

from star_engine.datafiles import check_option_path, get, read_blocks, read_jsonl
from .prompts import answer_sentence, builtin_blocks, question_block

MARK = " (CORRECT)"
PROMPT_KINDS = ("rationale", "direct", "hint")

# A parenthesised single letter, "(e)" or "( E )"; the answer is the last one on the line.
_LETTER = re.compile(r"\(\s*([A-Za-z])\s*\)")


def extract_letter(generation: str) -> str | None:
    """The answer letter of a generation, lowercase, or None.

    As in the original, only the first line counts (the model writes rationale
    and answer on one line; later lines are the model running on), but blank
    leading lines are skipped and the letter may be upper case or padded.
    """
    for line in generation.split("\n"):
        if line.strip():
            found = _LETTER.findall(line)
            return found[-1].lower() if found else None
    return None


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


def _checked_blocks(path: str, kind: str) -> list[tuple[str, str, str]]:
    """Prompt examples of a file as (file:line, text, answer letter)."""
    out = []
    for where, text in read_blocks(path):
        parts = _split_answer(text)
        if not text.startswith("Q:") or parts is None:
            raise UserError(f"{where}: a {kind} prompt example must start with 'Q:' and have a line starting with 'A:'")
        letter = extract_letter(parts[1])
        if letter is None:
            raise UserError(f"{where}: the answer of this {kind} prompt example ends in no letter like '(b)'")
        out.append((where, text, letter))
    return out


class CQATask:
    """CommonsenseQA (official JSONL). Options: ``prompts_file`` (rationale
    examples), ``hint_prompts_file`` (default: the rationale examples with their
    answer's choice marked " (CORRECT)"), ``direct_prompts_file``."""

    default_checker = "mc_letter"
    default_hint = "cqa_correct"
    stop = ("\n\n", "\nQ:")

    def __init__(self, *, prompts_file: str | None = None, hint_prompts_file: str | None = None,
                 direct_prompts_file: str | None = None) -> None:
        files = {"rationale": check_option_path("prompts_file", prompts_file),
                 "hint": check_option_path("hint_prompts_file", hint_prompts_file),
                 "direct": check_option_path("direct_prompts_file", direct_prompts_file)}
        blocks: dict[str, list[str]] = {}
        if files["rationale"]:
            checked = _checked_blocks(files["rationale"], "rationale")
        else:
            checked = [("built-in", text, extract_letter(_split_answer(text)[1]))
                       for text in builtin_blocks(direct=False)]
        blocks["rationale"] = [text for _, text, _ in checked]
        if files["hint"]:
            blocks["hint"] = [text for _, text, _ in _checked_blocks(files["hint"], "hint")]
        else:
            blocks["hint"] = []
            for where, text, letter in checked:
                try:
                    blocks["hint"].append(mark_choice(text, letter))
                except ValueError as e:  # only a user's prompts file can get here
                    raise UserError(f"{where}: cannot mark the correct choice for the hint prompt: {e}") from None
        if files["direct"]:
            blocks["direct"] = [text for _, text, _ in _checked_blocks(files["direct"], "direct")]
        else:
            blocks["direct"] = builtin_blocks(direct=True)
        self._prompts = {kind: "\n\n".join(b) + "\n\n" for kind, b in blocks.items()}

    # ------------------------------------------------------------------ data

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is None:
            raise UserError(f"task.data.{split}: the cqa task reads its data from a file; set task.data.{split}")
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
            choices = []
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
                choices.append({"label": label.lower(), "text": _one_line(text)})
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
            examples.append(Example(id=rid, question=_one_line(stem), answer=answer, fields={
                "choices": choices, "concept": concept if isinstance(concept, str) else ""}))
        return examples

    # ------------------------------------------------------------------ formats

    def context(self, example: Example) -> str:
        return question_block(example.question, [(c["label"], c["text"]) for c in example.fields["choices"]])

    def prompt(self, kind: str) -> str:
        if kind not in self._prompts:
            raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(PROMPT_KINDS)}")
        return self._prompts[kind]

    def extract(self, generation: str) -> str | None:
        return extract_letter(generation)

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
