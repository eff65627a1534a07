"""Built-in few-shot examples for GSM8K, written for this project (not taken
from the data set or the original prompts). Each is (question, rationale lines,
answer); a worked answer is the rationale, one step per line, then ``#### n``.
"""

from __future__ import annotations

EXAMPLES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("A baker makes 24 muffins in the morning and 18 muffins in the afternoon. He sells 30 muffins. "
     "How many muffins does he have left?",
     ("The baker makes 24 + 18 = 42 muffins.",
      "After selling 30, he has 42 - 30 = 12 muffins left."), "12"),
    ("Maya reads 15 pages of her book every day. The book has 210 pages. "
     "How many days does it take her to finish the book?",
     ("Maya reads 15 pages a day, so she needs 210 / 15 = 14 days.",), "14"),
    ("A pack of pencils costs $3 and a notebook costs $5. Leo buys 4 packs of pencils and 2 notebooks. "
     "How much money does he spend?",
     ("The pencils cost 4 * 3 = $12.",
      "The notebooks cost 2 * 5 = $10.",
      "In total he spends 12 + 10 = $22."), "22"),
    ("A room has 5 rows of chairs with 8 chairs in each row. If 27 people sit down, how many chairs are empty?",
     ("There are 5 * 8 = 40 chairs.",
      "27 of them are taken, so 40 - 27 = 13 chairs are empty."), "13"),
    ("Sam earns $9 per hour. He works 6 hours on Saturday and 4 hours on Sunday, and he spends half of "
     "what he earned on a jacket. How much money does he have left?",
     ("Sam works 6 + 4 = 10 hours.",
      "He earns 10 * 9 = $90.",
      "The jacket costs 90 / 2 = $45.",
      "He has 90 - 45 = $45 left."), "45"),
    ("A garden has 3 times as many roses as tulips. There are 16 tulips. How many flowers are there in all?",
     ("There are 3 * 16 = 48 roses.",
      "In all there are 48 + 16 = 64 flowers."), "64"),
    ("Emma had 50 stickers. She gave 12 to her brother and then bought 3 packs of 8 stickers. "
     "How many stickers does she have now?",
     ("After giving some away, Emma has 50 - 12 = 38 stickers.",
      "She buys 3 * 8 = 24 more stickers.",
      "Now she has 38 + 24 = 62 stickers."), "62"),
)


def builtin_blocks(direct: bool) -> list[str]:
    out = []
    for question, steps, answer in EXAMPLES:
        body = f" #### {answer}" if direct else " " + "\n".join(steps) + f"\n#### {answer}"
        out.append(f"Q: {question}\nA:{body}")
    return out
