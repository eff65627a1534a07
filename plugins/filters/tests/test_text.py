"""GPT-2's decoding clean-up, as transformers' clean_up_tokenization applies it."""

from __future__ import annotations

import pytest

from star_filters.text import clean_up_tokenization


@pytest.mark.parametrize("text, cleaned", [
    ("Hello , world !", "Hello, world!"),
    ("Is it ? Yes .", "Is it? Yes."),
    ("I do n't know", "I don't know"),       # " n't" joins the word before it
    ("I don 't know", "I don 't know"),      # "n 't" is none of the patterns
    ("I can n't", "I cann't"),               # a plain replacement, as transformers does
    ("it 's John 's", "it's John's"),
    ("we 're here , they 've gone , I 'm in", "we're here, they've gone, I'm in"),
    ("a ' b", "a'b"),
    ("(e) .", "(e)."),
    ("#### 72 .", "#### 72."),
    ("two  spaces .", "two  spaces."),       # one space before the period goes, not both
    ("no change", "no change"),
    ("", ""),
])
def test_clean_up(text, cleaned):
    assert clean_up_tokenization(text) == cleaned
