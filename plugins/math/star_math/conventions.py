r"""MATH answer extraction as two released evaluations do it, exactly (``task.options.extraction``
``"hendrycks"`` and ``"minerva"``); this project's own readings are in ``answers.py``.

``"hendrycks"``: Hendrycks et al. 2021, github.com/hendrycks/math, read at commit
985bdc1696e88e8643f081a0ff4719da39f2ae2a: ``modeling/dataset/util.py:last_boxed_only_string``, then
``modeling/eval_math_gpt.py:remove_boxed`` (``run_eval`` applies the pair to the model's output and
to the gold solution; ``modeling/evaluate_gpt3.py`` holds the same ``remove_boxed``).

- ``last_boxed_only_string``: the LAST ``\boxed`` (``str.rfind``, so ``\boxedfoo`` counts too); only
  when there is none, the last ``\fbox``; from there every ``{`` counts +1 and every ``}`` -1
  (escaped ``\{`` ``\}`` too), and the text up to the first ``}`` that brings the count to 0 is
  the box; no such ``}``: None.
- ``remove_boxed``: a box that starts ``\boxed{`` and ends ``}`` loses both; anything else (a
  ``\fbox{..}``, ``\boxed {5}``, ``\boxed 5 ... }``, None) is None. Nothing is stripped.

``"minerva"``: lm-evaluation-harness ``lm_eval/tasks/minerva_math/utils.py``, read at commit
4e7e0d47f33bc71070c1d38394bafbb52b117163 (the file last changed in 18d2faceca29, #3259; the format of
Lewkowycz et al. 2022, appendix D). The answer of a generation is ``get_unnormalized_answer(generation)``
(``process_results``); the gold is ``remove_boxed(last_boxed_only_string(solution))``
(``process_docs``), with the module's own copies of the two box functions, for MATH and MATH-500
alike (MATH-500's ``answer`` field is not read). lm-eval then passes both through
``normalize_final_answer`` before its sympy comparison (its ``exact_match`` metric): that is the
comparison, the checker's part here, and is not done (it also turns ``\infty`` into ``\iny``, as it
deletes every "ft": no gold answer for hints and gold completions).

- ``get_unnormalized_answer``: ``"I hope it is correct."`` appended to the text, then the first
  match of ``Final Answer: The final answer is(.*?). I hope it is correct.`` (case-sensitive, on
  one line, each ``.`` any character), its group stripped; no match: ``[invalidanswer]`` (None
  here, this project's "no answer").
- its ``last_boxed_only_string``: Hendrycks' above, except that a text holding ``"\boxed "``
  anywhere gives ``"\boxed "`` + what follows the last ``"\boxed "`` up to the next ``$`` (or the
  end); its ``remove_boxed`` drops ``"\boxed "`` from such a box, else asserts ``\boxed{..}``: an
  ``\fbox`` or a solution without a box stops lm-eval (here: the row is refused).
"""

from __future__ import annotations

import re

_MINERVA = re.compile(r"Final Answer: The final answer is(.*?). I hope it is correct.")
_END = "I hope it is correct."


def brace_close(text: str, start: int) -> int | None:
    """The index of the first ``}`` at or after ``start`` where the count of ``{`` minus ``}``
    seen from ``start`` falls to 0 (every brace counts, escaped or not); None without one."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def hendrycks_last_boxed(text: str) -> str | None:
    """``util.py:last_boxed_only_string`` (module docstring)."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    end = brace_close(text, start)
    return None if end is None else text[start:end + 1]


def hendrycks_remove_boxed(box: str | None) -> str | None:
    """``eval_math_gpt.py:remove_boxed`` (module docstring)."""
    if box is None or not box.startswith("\\boxed{") or not box.endswith("}"):
        return None
    return box[len("\\boxed{"):-1]


def hendrycks_answer(text: str) -> str | None:
    """Hendrycks et al.'s answer of a generation or a solution: ``remove_boxed(last_boxed_only_string(text))``."""
    return hendrycks_remove_boxed(hendrycks_last_boxed(text))


def hendrycks_gold(solution: str) -> str:
    """The gold answer under ``"hendrycks"``; ValueError saying why there is none (or it is empty)."""
    box = hendrycks_last_boxed(solution)
    if box is None:
        if "\\boxed" not in solution and "\\fbox" not in solution:
            raise ValueError("no \\boxed or \\fbox to take the gold answer from")
        raise ValueError("no brace closes the last \\boxed (or \\fbox): Hendrycks' last_boxed_only_string reads "
                         "no answer")
    answer = hendrycks_remove_boxed(box)
    if answer is None:
        raise ValueError(f"its last box {box[:40]!r} is not \\boxed{{...}}: Hendrycks' remove_boxed reads no answer")
    if not answer.strip():
        raise ValueError("its last \\boxed{} is empty")
    return answer


def lmeval_last_boxed(text: str) -> str | None:
    """minerva_math ``utils.py:last_boxed_only_string`` (module docstring)."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    return hendrycks_last_boxed(text)


def lmeval_remove_boxed(box: str) -> str:
    """minerva_math ``utils.py:remove_boxed``; ValueError where its assertions fail."""
    if "\\boxed " in box:
        if not box.startswith("\\boxed "):
            raise ValueError(f"its last box {box[:40]!r} does not start with '\\boxed '")
        return box[len("\\boxed "):]
    if not box.startswith("\\boxed{") or not box.endswith("}"):
        raise ValueError(f"its last box {box[:40]!r} is not \\boxed{{...}}: lm-eval's remove_boxed asserts it is")
    return box[len("\\boxed{"):-1]


def minerva_answer(text: str) -> str | None:
    """minerva_math ``utils.py:get_unnormalized_answer``; None for its ``[invalidanswer]``."""
    m = _MINERVA.search(text + _END)
    return None if m is None else m.group(1).strip()


def minerva_gold(solution: str) -> str:
    r"""The gold answer under ``"minerva"``: ``remove_boxed(last_boxed_only_string(solution))``;
    ValueError where lm-eval would stop (no box, an ``\fbox``) or the answer is empty."""
    box = lmeval_last_boxed(solution)
    if box is None:
        if "\\boxed" not in solution and "\\fbox" not in solution:
            raise ValueError("no \\boxed or \\fbox to take the gold answer from")
        raise ValueError("no brace closes the last \\boxed (or \\fbox): lm-eval's last_boxed_only_string reads "
                         "no answer")
    answer = lmeval_remove_boxed(box)
    if not answer.strip():
        raise ValueError(f"its last box {box[:40]!r} is empty")
    return answer
