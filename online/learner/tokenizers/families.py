"""The tokenizer families and their one registry (``FAMILIES``).

A family says how it tokenises one piece of text (the Python path, and the reference of any compiled
one), where sentences end, and its compiled scan over a batch's bytes, if it has one.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from online.learner.tokenizers.text8 import text8_tokens
from online.learner.tokenizers.tokens import whitespace_tokens
from online.learner.tokenizers.unicode import unicode_tokens


@dataclass(frozen=True)
class Family:
    name: str
    tokens: Callable[..., list[str]]     # (text) or, for unicode, (text, language)
    sentence_end: re.Pattern             # what ends a sentence within a record
    compiled: str | None                 # the scan of the trainer's path: "text8", "tokens" or None (Python)
    takes_language: bool = False


# Newlines, and ". ! ?" or their full-width forms followed by whitespace (the compiled text8 scan's rule).
_STOP_THEN_SPACE = re.compile(r"(?<=[.!?\u3002\uff01\uff1f])\s+|[\r\n]+")
# The same, but a full-width stop ends a sentence without a space after it: Chinese and Japanese put none.
_CJK_STOPS = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])\s*|[\r\n]+")
# Newlines only: "." is a token of ``tokens``, not a boundary.
_NEWLINES = re.compile(r"[\r\n]+")

FAMILIES: dict[str, Family] = {
    "text8": Family("text8", text8_tokens, _STOP_THEN_SPACE, "text8"),
    "unicode": Family("unicode", unicode_tokens, _CJK_STOPS, None, takes_language=True),
    "tokens": Family("tokens", whitespace_tokens, _NEWLINES, "tokens"),
}
TOKENIZERS = tuple(FAMILIES)
