"""The ``text8`` tokenizer: the last step of the script that made text8.

It is also how the benchmark corpus ``wiki17m`` was normalised: ASCII letters lower-cased, each digit
spelled out as a word (``"1"`` -> ``"one"``), every other character (punctuation, non-ASCII) turned
into a space. Training on text normalised the same way as the evaluation sets keeps livevec
comparable with gensim/word2vec numbers on text8-like corpora. The trainer's path is the compiled
scan ``online.learner.spans.text8_spans``; ``text8_tokens`` is its Python reference.
"""
from __future__ import annotations

import re

DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

# bytes.translate table of the text8 normalisation: a-z stay, A-Z lower-cased, digits
# kept for the second pass that spells them out, everything else becomes a space.
_TEXT8_TABLE = bytearray(b" " * 256)
for _c in range(ord("a"), ord("z") + 1):
    _TEXT8_TABLE[_c] = _c
for _c in range(ord("A"), ord("Z") + 1):
    _TEXT8_TABLE[_c] = _c + 32
for _c in range(ord("0"), ord("9") + 1):
    _TEXT8_TABLE[_c] = _c
_TEXT8_TABLE = bytes(_TEXT8_TABLE)
_DIGIT_RE = re.compile(rb"[0-9]")
_DIGIT_BYTES = [f" {w} ".encode() for w in DIGIT_WORDS]


def text8_tokens(text: str) -> list[str]:
    """text8 normalisation of ``text``, split into tokens."""
    raw = text.encode("utf-8", errors="replace").translate(_TEXT8_TABLE)
    if _DIGIT_RE.search(raw):
        raw = _DIGIT_RE.sub(lambda m: _DIGIT_BYTES[m.group()[0] - 48], raw)
    # Only ASCII remains, so decoding cannot fail and split() is the C fast path.
    return raw.decode("ascii").split()
