"""The GSM8K task and its ``gsm8k_answer`` hint formatter.

Context: ``Q: <question>\\nA:``. Rationale completion: `` <steps, one per line>\\n#### <n>``;
direct completion: `` #### <n>``. Hinted context: ``Q: <question> (Answer: <n>)\\nA:``.
Few-shot prompts are examples separated by blank lines, with a trailing blank line.
"""

from __future__ import annotations

import re

from star_engine.api import Example, TrainExample
from star_engine.errors import UserError

from star_engine.datafiles import check_option_path, get, read_blocks, read_jsonl
from .answers import final_answer, normalize_number
from .prompts import builtin_blocks

PROMPT_KINDS = ("rationale", "direct", "hint")
ANNOTATION_MODES = ("strip", "keep")
_ANNOTATION = re.compile(r"<<[^<>\n]*>>")
_NUMERIC = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def hint_text(answer: str) -> str:
    return f"(Answer: {answer})"


def add_hint(block: str, answer: str) -> str:
    """``block`` with the hint after the question, i.e. at the end of the line
    before the ``A:`` line. Raises ValueError when there is no ``A:`` line."""
    m = re.search(r"\nA:", block)
    if m is None:
        raise ValueError("no line starting with 'A:'")
    return f"{block[: m.start()]} {hint_text(answer)}{block[m.start():]}"


def _checked_blocks(path: str, kind: str) -> list[tuple[str, str, str | None]]:
    """Prompt examples of a file as (file:line, text, answer after ####)."""
    out = []
    for where, text in read_blocks(path):
        if not text.startswith("Q:") or not re.search(r"\nA:", text):
            raise UserError(f"{where}: a {kind} prompt example must start with 'Q:' and have a line starting with 'A:'")
        try:
            answer = final_answer(text.split("\nA:", 1)[1])
        except (ValueError, ArithmeticError) as e:  # a number Python will not convert (more than 4300 digits)
            raise UserError(f"{where}: the answer of this {kind} prompt example is not a readable number "
                            f"({e})") from None
        if answer is None or not _NUMERIC.fullmatch(answer):
            raise UserError(f"{where}: the answer of this {kind} prompt example has no '#### <number>' line")
        out.append((where, text, answer))
    return out


class GSM8KTask:
    """GSM8K (JSONL ``{"question", "answer"}``). Options: ``calculator_annotations``
    ("strip" removes the ``<<48/2=24>>`` marks from gold rationales, "keep" keeps
    them), ``prompts_file``, ``hint_prompts_file`` (default: the rationale
    examples with their answer hinted), ``direct_prompts_file``."""

    default_checker = "numeric"
    default_hint = "gsm8k_answer"
    # "\nQ:" ends a generation that runs on into a new question; a rationale
    # itself has no blank lines, so "\n\n\n" only cuts rambling.
    stop = ("\nQ:", "\n\n\n")

    def __init__(self, *, calculator_annotations: str = "strip", prompts_file: str | None = None,
                 hint_prompts_file: str | None = None, direct_prompts_file: str | None = None) -> None:
        if calculator_annotations not in ANNOTATION_MODES:
            raise UserError(f"calculator_annotations: must be one of {', '.join(map(repr, ANNOTATION_MODES))}, "
                            f"got {calculator_annotations!r}")
        self.calculator_annotations = calculator_annotations
        files = {"rationale": check_option_path("prompts_file", prompts_file),
                 "hint": check_option_path("hint_prompts_file", hint_prompts_file),
                 "direct": check_option_path("direct_prompts_file", direct_prompts_file)}
        if files["rationale"]:
            checked = _checked_blocks(files["rationale"], "rationale")
        else:
            checked = [("built-in", t, final_answer(t)) for t in builtin_blocks(direct=False)]
        blocks = {"rationale": [t for _, t, _ in checked]}
        if files["hint"]:
            blocks["hint"] = [t for _, t, _ in _checked_blocks(files["hint"], "hint")]
        else:
            blocks["hint"] = [add_hint(t, a) for _, t, a in checked]
        if files["direct"]:
            blocks["direct"] = [t for _, t, _ in _checked_blocks(files["direct"], "direct")]
        else:
            blocks["direct"] = builtin_blocks(direct=True)
        self._prompts = {kind: "\n\n".join(b) + "\n\n" for kind, b in blocks.items()}

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is None:
            raise UserError(f"task.data.{split}: the gsm8k task reads its data from a file; set task.data.{split}")
        examples = []
        for i, (where, row) in enumerate(read_jsonl(path)):
            question = get(row, "question", str, where)
            solution = get(row, "answer", str, where)
            lines = solution.split("\n")
            final = next((k for k, line in enumerate(lines) if line.lstrip().startswith("####")), None)
            if final is None:
                raise UserError(f"{where}: field 'answer' has no final '#### <number>' line")
            raw = lines[final].split("####", 1)[1]
            try:
                answer = normalize_number(raw)
            except (ValueError, ArithmeticError) as e:  # a number Python will not convert (more than 4300 digits)
                raise UserError(f"{where}: field 'answer': the final answer is not a readable number ({e})") from None
            if answer is None or not _NUMERIC.fullmatch(answer):
                raise UserError(f"{where}: field 'answer': the final answer {raw.strip()!r} is not a number")
            rationale = "\n".join(lines[:final])
            if self.calculator_annotations == "strip":
                rationale = _ANNOTATION.sub("", rationale)
            # A few solutions have blank lines; drop them so gold completions look
            # like the prompts (one step per line) and never contain a stop string.
            rationale = "\n".join(line.rstrip() for line in rationale.split("\n") if line.strip())
            # GSM8K has no ids: the row's position in its file is stable.
            examples.append(Example(id=f"{split}-{i}", question=" ".join(question.strip().splitlines()),
                                    answer=answer, fields={"rationale": rationale}))
        return examples

    def context(self, example: Example) -> str:
        return f"Q: {example.question}\nA:"

    def prompt(self, kind: str) -> str:
        if kind not in self._prompts:
            raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(PROMPT_KINDS)}")
        return self._prompts[kind]

    def extract(self, generation: str) -> str | None:
        return final_answer(generation)

    def gold_completion(self, example: Example, direct: bool) -> str:
        if not example.answer:
            raise UserError(f"gsm8k: example {example.id!r} has no gold answer")
        if direct:
            return f" #### {example.answer}"
        rationale = example.fields.get("rationale", "")
        if not rationale:
            raise UserError(f"gsm8k: example {example.id!r} has no gold rationale")
        return f" {rationale}\n#### {example.answer}"

    def seed_examples(self) -> list[TrainExample]:
        return []


class AnswerHint:
    """``gsm8k_answer``: the gold answer in parentheses after the question."""

    def context(self, task, example: Example) -> str:
        if not example.answer:
            raise UserError(f"gsm8k_answer: example {example.id!r} has no gold answer to hint")
        try:
            return add_hint(task.context(example), example.answer)
        except ValueError as e:
            raise UserError(f"gsm8k_answer: example {example.id!r}: {e}") from None

    def leak_strings(self, task, example: Example) -> tuple[str, ...]:
        return (hint_text(example.answer),)
