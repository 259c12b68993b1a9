"""The ``unicode`` tokenizer: words of any script, for real multilingual streams.

NFKC normalisation, case folding, and words are maximal runs of Unicode letters, digits and marks
(``\\w``) with inner apostrophes kept (``don't``, ``l'homme``). A run holding Chinese or Japanese is
then cut into words by a dictionary segmenter (``online.learner.tokenizers.cjk``): neither language
separates words with spaces, so the regex alone would give clauses. Text with no CJK character pays
one regex search per sentence piece for that.
"""
from __future__ import annotations

import re
import unicodedata

from online.learner.tokenizers.cjk import CJK_RE, segmenter_for

_UNICODE_WORD_RE = re.compile(r"\w+(?:['\u2019]\w+)*")


def unicode_tokens(text: str, language: str = "auto") -> list[str]:
    norm = unicodedata.normalize("NFKC", text).casefold()
    words = _UNICODE_WORD_RE.findall(norm)
    if not CJK_RE.search(norm):
        return words
    segment = segmenter_for(norm, language)
    out: list[str] = []
    for word in words:
        if CJK_RE.search(word):
            out.extend(segment(word))
        else:
            out.append(word)
    return out
