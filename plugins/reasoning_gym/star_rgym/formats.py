"""Text formats of the reasoning_gym task.

Context, completion and hinted context for a question ``q`` with answer ``a``::

    Question: <q, stripped>
    Answer: <rationale, when there is one> <answer>a</answer>

    Question: <q>
    Hint: a
    Answer:

The model states its answer inside ``<answer>...</answer>``, as reasoning-gym's own prompts ask;
``extract`` is reasoning-gym's ``extract_answer`` (the last such tag). Few-shot examples are
separated by a blank line; ``STOP`` ends a generation that runs on into a new question, and
``trim`` keeps a generation up to its last ``</answer>``.
"""

from __future__ import annotations

QUESTION, HINT, ANSWER = "Question: ", "Hint: ", "Answer:"
OPEN, CLOSE = "<answer>", "</answer>"
STOP = ("\nQuestion:",)
SEPARATOR = "\n\n"


def context(question: str) -> str:
    return f"{QUESTION}{question.strip()}\n{ANSWER}"


def hint_line(answer: str) -> str:
    return f"{HINT}{answer}"


def hinted(question: str, answer: str) -> str:
    return f"{QUESTION}{question.strip()}\n{hint_line(answer)}\n{ANSWER}"


def completion(answer: str, rationale: str | None = None) -> str:
    """`` <rationale> <answer>a</answer>`` (`` <answer>a</answer>`` without a rationale)."""
    body = f" {rationale.strip()}" if rationale and rationale.strip() else ""
    return f"{body} {OPEN}{answer}{CLOSE}"


def trim(generation: str) -> str:
    """``generation`` up to and including its last ``</answer>`` (all of it when it has none):
    what a model writes after its answer is neither checked nor trained on."""
    end = generation.rfind(CLOSE)
    return generation if end < 0 else generation[: end + len(CLOSE)]
