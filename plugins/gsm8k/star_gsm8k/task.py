"""The GSM8K task and its ``gsm8k_answer`` hint formatter.

Context: ``Q: <question>\\nA:``. Rationale completion: `` <steps, one per line>\\n#### <n>``;
direct completion: `` #### <n>``. Hinted context (default template):
``Q: <question> (Answer: <n>)\\nA:``. Few-shot prompts are examples separated by blank
lines, with a trailing blank line (``"\\n\\n".join(prompts) + "\\n\\n"``, as the original).
"""

from __future__ import annotations

import re
import string
from typing import Annotated, Literal

from star_engine import NON_EMPTY, Example, TrainExample, UserError
from star_engine.helpers import few_shot_prompts, get, prompt_files, read_blocks, read_jsonl
from star_filters import FewShotQA, canonical_number, stop_strings

from .answers import answer_lines, final_answer, original_answer
from .known_files import DATA_FILES
from .prompts import builtin_blocks

FilePath = Annotated[str | None, NON_EMPTY]  # a file's path, or none
DEFAULT_TEMPLATE = "(Answer: {answer})"
HINT_FIELDS = ("answer", "solution")
_ANNOTATION = re.compile(r"<<[^<>\n]*>>")


def add_hint(block: str, hint: str) -> str:
    """``block`` with `` <hint>`` after the question, i.e. at the end of the line
    before the ``A:`` line (where the original puts it). Raises ValueError when
    there is no ``A:`` line."""
    m = re.search(r"\nA:", block)
    if m is None:
        raise ValueError("no line starting with 'A:'")
    return f"{block[: m.start()]} {hint}{block[m.start():]}"


def _checked_blocks(path: str, kind: str, verbatim: bool) -> list[tuple[str, str, str | None]]:
    """Prompt examples of a file as (file:line, text, answer after ####)."""
    out: list[tuple[str, str, str | None]] = []
    for where, text in read_blocks(path, verbatim=verbatim):
        if not text.startswith("Q:") or not re.search(r"\nA:", text):
            raise UserError(f"{where}: a {kind} prompt example must start with 'Q:' and have a line starting with 'A:'")
        try:
            answer = final_answer(text.split("\nA:", 1)[1])
        except (ValueError, ArithmeticError) as e:  # a number Python will not convert (more than 4300 digits)
            raise UserError(f"{where}: the answer of this {kind} prompt example is not a readable number "
                            f"({e})") from None
        if answer is None or canonical_number(answer) is None:
            raise UserError(f"{where}: the answer of this {kind} prompt example has no '#### <number>' line")
        out.append((where, text, answer))
    return out


class GSM8KTask(FewShotQA):
    """GSM8K (JSONL ``{"question", "answer"}``). Options:

    - ``calculator_annotations``: "strip" removes the ``<<48/2=24>>`` marks from gold
      rationales, "keep" keeps them.
    - ``prompts_file``, ``direct_prompts_file``: rationale / direct examples (default:
      built in); ``hint_prompts_file``, ``direct_hint_prompts_file``: hinted ones
      (default: derived, ``(Answer: <n>)`` after each question).
    - ``verbatim``: prompt files split on ``"\\n\\n"`` with nothing stripped, questions
      kept exactly as in the data file (the original); default: tidied, one line.
    - ``gold_answer``: "normalized" (default: ``1,080`` -> ``1080``, the canonical number of
      ``star_filters.canonical_number``) or "raw" (the
      original's ``answer.split("#### ")[-1]``, commas kept).
    - ``extraction``: "lenient" (``final_answer``) or "original" (``original_answer``).
    - ``stored_completion``: "until_stop" (default) or "original" (``answer_lines``).
    - ``stop``: the stop strings (default ``["\\nQ:", "\\n\\n\\n"]``).
    """

    data_files = DATA_FILES  # the released files it reads, with their sha256 (star-engine data check)
    default_checker = "numeric"
    default_hint = "gsm8k_answer"
    read_lenient = staticmethod(final_answer)  # prompt, extract and trim: FewShotQA's
    read_original = staticmethod(original_answer)
    store_original = staticmethod(answer_lines)

    def __init__(self, *, calculator_annotations: Literal["strip", "keep"] = "strip", prompts_file: FilePath = None,
                 hint_prompts_file: FilePath = None, direct_prompts_file: FilePath = None,
                 direct_hint_prompts_file: FilePath = None, verbatim: bool = False,
                 gold_answer: Literal["normalized", "raw"] = "normalized",
                 extraction: Literal["lenient", "original"] = "lenient",
                 stored_completion: Literal["until_stop", "original"] = "until_stop",
                 stop: list[str] | None = None) -> None:
        self.calculator_annotations, self.verbatim, self.gold_answer = calculator_annotations, verbatim, gold_answer
        self.extraction, self.stored_completion = extraction, stored_completion
        # "\nQ:" ends a generation that runs on into a new question; a rationale
        # itself has no blank lines, so "\n\n\n" only cuts rambling.
        self.stop = stop_strings(stop, ("\nQ:", "\n\n\n"))
        files = prompt_files(prompts_file, hint_prompts_file, direct_prompts_file, direct_hint_prompts_file)
        self.prompts = few_shot_prompts(
            files, lambda path, kind: _checked_blocks(path, kind, self.verbatim),
            lambda kind: [("built-in", t, final_answer(t)) for t in builtin_blocks(direct=kind == "direct")],
            lambda where, text, answer: add_hint(text, DEFAULT_TEMPLATE.format(answer=answer)))

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is None:
            raise UserError(f"task.data.{split}: the gsm8k task reads its data from a file; set task.data.{split}",
                            key=f"task.data.{split}")
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
                answer = canonical_number(raw)  # the numeric checker's reading (star_filters)
            except (ValueError, ArithmeticError) as e:  # a number Python will not convert (more than 4300 digits)
                raise UserError(f"{where}: field 'answer': the final answer is not a readable number ({e})") from None
            if answer is None:
                raise UserError(f"{where}: field 'answer': the final answer {raw.strip()!r} is not a number "
                                f"(one number, as the numeric checker reads it)")
            if self.gold_answer == "raw":
                text = solution.split("#### ")[-1]  # the original's gold, as it is
                if "\n" in text or canonical_number(text) != answer:
                    raise UserError(f"{where}: field 'answer': the text after its last '#### ' ({text[:40]!r}) "
                                    f"is not the final answer {raw.strip()!r}")
                answer = text
            rationale = "\n".join(lines[:final])
            if self.calculator_annotations == "strip":
                rationale = _ANNOTATION.sub("", rationale)
            # A few solutions have blank lines; drop them so gold completions look
            # like the prompts (one step per line) and never contain a stop string.
            rationale = "\n".join(line.rstrip() for line in rationale.split("\n") if line.strip())
            # GSM8K has no ids: the row's position in its file is stable.
            examples.append(Example(
                id=f"{split}-{i}", question=question if self.verbatim else " ".join(question.strip().splitlines()),
                answer=answer, fields={"rationale": rationale, "solution": solution}))
        return examples

    def context(self, example: Example) -> str:
        return f"Q: {example.question}\nA:"

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


def _template_fields(template: str) -> set[str]:
    """The placeholders of a hint template; UserError for anything but ``{answer}``
    and ``{solution}`` (``{{`` and ``}}`` are literal braces)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise UserError(f"template: {e} in {template!r}") from None
    names = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in HINT_FIELDS or spec or conversion:
            raise UserError(f"template: unknown placeholder {{{name}{'!' + conversion if conversion else ''}"
                            f"{':' + spec if spec else ''}}} in {template!r}; allowed: "
                            + ", ".join(f"{{{f}}}" for f in HINT_FIELDS))
        names.add(name)
    return names


class AnswerHint:
    """``gsm8k_answer``: a hint after the question, at the end of the line before
    ``A:``, written by ``template``: ``{answer}`` is the gold answer as the task loaded
    it, ``{solution}`` the data set's whole answer field, verbatim (the released STaR
    code inserts ``" (" + solution + ")"``: ``template = "({solution})"``)."""

    def __init__(self, *, template: Annotated[str, NON_EMPTY] = DEFAULT_TEMPLATE) -> None:
        self.template = template
        self.fields = _template_fields(self.template)

    def text(self, example: Example) -> str:
        """The hint for ``example``."""
        if not example.answer:
            raise UserError(f"gsm8k_answer: example {example.id!r} has no gold answer to hint")
        solution = example.fields.get("solution")
        if "solution" in self.fields and not isinstance(solution, str):
            raise UserError(f"gsm8k_answer: example {example.id!r} has no solution text for {{solution}}")
        return self.template.format(answer=example.answer, solution=solution)

    def context(self, task, example: Example) -> str:
        hint = self.text(example)
        try:
            return add_hint(task.context(example), hint)
        except ValueError as e:
            raise UserError(f"gsm8k_answer: example {example.id!r}: {e}") from None

    def leak_strings(self, task, example: Example) -> tuple[str, ...]:
        return (self.text(example),)
