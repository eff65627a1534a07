"""Built-in few-shot examples for CommonsenseQA, written for this project.

They follow the style of the original STaR prompts (a short rationale ending in
"Therefore, the answer is <text> (<letter>).") but are new questions, so no
dataset question leaks into the prompt. Each is (stem, choices, gold letter,
rationale without its final sentence).
"""

from __future__ import annotations

LETTERS = "abcde"

EXAMPLES: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("Where would you keep milk so that it stays cold?",
     ("cupboard", "refrigerator", "dining table", "oven", "garage"), "b",
     "Milk spoils when it gets warm, so it must be kept somewhere cold. "
     "A refrigerator is an appliance made to keep food cold."),
    ("What does a person usually do when they feel tired late at night?",
     ("go to sleep", "run a marathon", "eat breakfast", "start work", "mow the lawn"), "a",
     "Feeling tired at night is a sign that the body needs rest. "
     "People rest at night by going to sleep."),
    ("The children spent the afternoon building a snowman. What season was it most likely?",
     ("summer", "spring", "harvest time", "winter", "dry season"), "d",
     "A snowman is built out of snow. Snow falls when it is cold, and the cold season is winter."),
    ("If you want to cut a sheet of paper neatly, what tool would you use?",
     ("hammer", "spoon", "scissors", "stapler", "eraser"), "c",
     "Cutting paper neatly needs sharp blades. Scissors have two blades made for cutting paper."),
    ("Where would a traveler go to catch a flight?",
     ("harbor", "bus stop", "train station", "library", "airport"), "e",
     "A flight is a trip on an airplane. Airplanes take off from an airport."),
    ("What is likely to happen to a potted plant that is never watered?",
     ("it will wilt", "it will bloom", "it will grow taller", "it will attract bees", "it will bear fruit"),
     "a",
     "Plants need water to stay alive. Without water a plant dries out and droops."),
    ("How might someone feel when their best friend moves to another country?",
     ("hungry", "sad", "bored", "thirsty", "sleepy"), "b",
     "Losing daily contact with someone you care about is a loss. "
     "People feel sad about losing something they care about."),
)


def question_block(stem: str, choices: list[tuple[str, str]]) -> str:
    """The question context as the original STaR code writes it: ``Q: <stem>``,
    ``Answer Choices:``, one ``(<label>) <text>`` line per choice, ``A:``."""
    lines = [f"Q: {stem}", "Answer Choices:"]
    lines += [f"({label}) {text}" for label, text in choices]
    return "\n".join(lines + ["A:"])


def answer_sentence(text: str, letter: str, direct: bool) -> str:
    """The last sentence of a worked answer; the direct format is the one gold
    direct completions use, so direct prompts and fine-tuning data agree."""
    return f"The answer is {text} ({letter})." if direct else f"Therefore, the answer is {text} ({letter})."


def builtin_blocks(direct: bool) -> list[str]:
    out = []
    for stem, choices, letter, rationale in EXAMPLES:
        final = answer_sentence(choices[LETTERS.index(letter)], letter, direct)
        answer = final if direct else f"{rationale} {final}"
        out.append(f"{question_block(stem, list(zip(LETTERS, choices)))} {answer}")
    return out
