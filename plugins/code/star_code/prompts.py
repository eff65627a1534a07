"""Worked examples for the ``code`` task's few-shot prompts (``n_shots``), written for this package:
``(question, solution, tests)``, in the layout's form (HumanEval: the prompt and the body; MBPP: the
task's text and the whole code)."""

HUMANEVAL_SHOTS = (
    ('def add(a: int, b: int) -> int:\n    """Return the sum of a and b.\n    >>> add(2, 3)\n    5\n    """\n',
     "    return a + b\n", ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]),
    ('from typing import List\n\n\ndef evens(xs: List[int]) -> List[int]:\n    """Return the even numbers of xs, '
     'in order.\n    >>> evens([1, 2, 3, 4])\n    [2, 4]\n    """\n',
     "    return [x for x in xs if x % 2 == 0]\n", ["assert evens([1, 2, 3, 4]) == [2, 4]", "assert evens([]) == []"]),
)

MBPP_SHOTS = (
    ("Write a function to return the larger of two numbers.", "def larger(a, b):\n    return a if a > b else b",
     ["assert larger(3, 5) == 5", "assert larger(7, 2) == 7", "assert larger(4, 4) == 4"]),
    ("Write a function to count the vowels in a string.",
     "def count_vowels(s):\n    return sum(1 for c in s if c in 'aeiou')",
     ["assert count_vowels('hello') == 2", "assert count_vowels('xyz') == 0", "assert count_vowels('aeiou') == 5"]),
)
