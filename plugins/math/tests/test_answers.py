r"""Reading answers: the last \boxed{} (nested braces, unbraced, \fbox, several, unclosed) and
Minerva's closing sentence, in the three extraction modes."""

from __future__ import annotations

import pytest

from star_math.answers import (UnclosedBox, boxed_answer, closing_sentence, extract, final_answer, last_boxed,
                               through_closing, unwrap_math)


@pytest.mark.parametrize("text, answer", [
    (r"so $x = \boxed{18}$.", "18"),
    (r"$\boxed{\frac{\sqrt{3}}{2}}$", r"\frac{\sqrt{3}}{2}"),  # nested braces
    (r"$\boxed{\begin{pmatrix} 11 \\ 4 \end{pmatrix}}$", r"\begin{pmatrix} 11 \\ 4 \end{pmatrix}"),
    (r"is $\boxed{\{1, 2\}}$", r"\{1, 2\}"),  # escaped braces are no group
    (r"$\boxed{\left\{ x \mid x > 0 \right.}$", r"\left\{ x \mid x > 0 \right."),  # an unmatched \{ too
    (r"$\boxed{a \\{b}}$", r"a \\{b}"),  # \\ is a backslash: the { after it opens a group
    (r"the answer is $\boxed 4$.", "4"),  # unbraced: up to the next $
    ("the answer is \\boxed 4\nand more", "4"),  # ... or the line's end
    (r"$\boxed5$", "5"),
    (r"$\boxed {7}$", "7"),
    (r"we get $0.15 \cdot 80 = \fbox{12}$.", "12"),
    (r"first $\boxed{14}$, then $\boxed{42}$", "42"),  # several: the last
    (r"$\boxed{1}$ and $\fbox{2}$", "2"),  # the last by position, \boxed or \fbox
    (r"$\fbox{1}$ and $\boxed{2}$", "2"),
    (r"$\boxed{\boxed{3}}$", "3"),
    (r"$\boxed{  -2, 3 }$", "-2, 3"),
    (r"$\boxed{}$", None),
    (r"no box at all", None),
    (r"$\boxedsymbol{5}$", None),  # another command, not \boxed
])
def test_last_boxed(text, answer):
    assert last_boxed(text) == answer


@pytest.mark.parametrize("text, offset, command", [
    (r"so $\boxed{\frac{1}{2}$", 4, "\\boxed"),
    (r"$\boxed{1}$ then $\boxed{2", 18, "\\boxed"),  # the last one is unclosed: no fallback to an earlier one
    (r"\fbox{\{1\}", 0, "\\fbox"),
])
def test_an_unclosed_box_is_an_error(text, offset, command):
    with pytest.raises(UnclosedBox) as e:
        last_boxed(text)
    assert e.value.offset == offset
    assert str(e.value) == f"{command}{{ at character {offset + 1} never closes"
    assert boxed_answer(text) is None  # in a generation: no answer, never an exception
    assert extract(text, "lenient") is None


@pytest.mark.parametrize("text, answer", [
    (r"$\frac{1}{2}$", r"\frac{1}{2}"),
    (r"$$\frac{1}{2}$$", r"\frac{1}{2}"),
    (r"\(x^2\)", "x^2"),
    (r"\[x^2\]", "x^2"),
    (r" $\boxed{5}$ ", "5"),
    (r"\boxed{1} + \boxed{2}", r"\boxed{1} + \boxed{2}"),  # not one box
    (r"\$5", r"\$5"),
    (r"$\$18.90$", r"\$18.90"),
    (r"5\$", r"5\$"),
])
def test_unwrap_math(text, answer):
    assert unwrap_math(text) == answer


@pytest.mark.parametrize("text, answer", [
    (r"Final Answer: The final answer is $\frac{1}{9}$. I hope it is correct.", r"\frac{1}{9}"),
    (r"Final Answer: The final answer is $0.5$. I hope it is correct.", "0.5"),
    (r"Final Answer: The final answer is 12. I hope it is correct.", "12"),
    (r"Final Answer: The final answer is $(-\infty, -2) \cup (1, \infty)$. I hope it is correct.",
     r"(-\infty, -2) \cup (1, \infty)"),
    (r"Final Answer: The final answer is $\boxed{7}$. I hope it is correct.", "7"),
    (r"the final answer is $3$.", "3"),  # cut off before the closing words; any case
    (r"So the final answer is $3$, which is odd.", "3"),  # the math span
    (r"Final Answer: The final answer is $\$5$, I think", r"\$5"),  # an escaped dollar is no delimiter
    ("The final answer is $4$. I hope it is correct.\nFinal Answer: The final answer is $5$.", "4"),  # the first
    (r"Final Answer: The final answer is . I hope it is correct.", None),
    (r"The answer is $5$.", None),
])
def test_final_answer(text, answer):
    assert final_answer(text) == answer


GEN = ("\nWe have $2 + 2 = \\boxed{4}$.\nFinal Answer: The final answer is $4.0$. I hope it is correct."
       "\n\nThe rest runs on: $\\boxed{9}$")


@pytest.mark.parametrize("mode, answer", [("lenient", "4.0"), ("minerva", "$4.0$"), ("boxed", "9"),
                                          ("hendrycks", "9")])
def test_extraction_modes(mode, answer):
    assert extract(GEN, mode) == answer
    assert extract(through_closing(GEN), "boxed") == "4"


def test_lenient_falls_back_to_the_last_box():
    text = "\nSo $x = \\boxed{\\frac{3}{4}}$."
    assert extract(text, "lenient") == extract(text, "boxed") == "\\frac{3}{4}"
    assert extract(text, "minerva") is None
    assert extract("\nNo answer here.", "lenient") is None


def test_through_closing_and_the_closing_sentence():
    sentence = closing_sentence("\\frac{1}{2}")
    assert sentence == "Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct."
    assert final_answer(sentence) == "\\frac{1}{2}"
    assert through_closing("a\n" + sentence + "\n\nmore") == "a\n" + sentence
    assert through_closing("no closing words") == "no closing words"
