"""Text as the released STaR code saw it after decoding.

The original decodes generations with ``GPT2TokenizerFast.decode``, whose GPT-2 default
``clean_up_tokenization_spaces=True`` runs ``PreTrainedTokenizerBase.clean_up_tokenization``
(transformers, ``tokenization_utils_base.py``) on the text: a space before ``.``, ``?``,
``!`` and ``,`` and before the English contractions goes, so ``"(e) ."`` reads ``"(e)."``
and its character ``[-3]`` is ``e``, not ``)``. The tasks apply it under
``extraction = "original"``, before extraction and storage, as the original did.
"""

from __future__ import annotations

# In transformers' order (each replacement sees the previous ones' output).
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_tokenization(text: str) -> str:
    """``text`` as GPT-2's decode with ``clean_up_tokenization_spaces=True`` returns it."""
    for old, new in CLEAN_UP:
        text = text.replace(old, new)
    return text
