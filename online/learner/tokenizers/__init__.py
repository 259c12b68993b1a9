"""Tokenizing: records in, sentences of tokens out.

``Tokenizer`` (``sentences.py``) splits a record into sentences and tokenises each with the family a
name picks (``families.py``, the registry ``FAMILIES``):

* ``text8`` (default, ``text8.py``): lower-case ASCII words, digits spelled out, as word2vec's demo corpus;
* ``unicode`` (``unicode.py``): any script, NFKC and case-folded, Chinese and Japanese cut into words
  (``cjk.py``);
* ``tokens`` (``tokens.py``): whitespace-separated tokens kept byte for byte, for IDs and text tokenised
  upstream.

A token-list record (``tokens.TokenList``: a JSON list of items) is one sentence of its items whatever
the family.

Design: docs/design/0007-tokenizers.md
"""
from __future__ import annotations

from online.learner.tokenizers.cjk import LANGUAGES
from online.learner.tokenizers.families import FAMILIES, TOKENIZERS, Family
from online.learner.tokenizers.sentences import DEFAULT_MAX_SENTENCE_LENGTH, Tokenizer
from online.learner.tokenizers.text8 import DIGIT_WORDS, text8_tokens
from online.learner.tokenizers.tokens import TokenList, whitespace_tokens
from online.learner.tokenizers.unicode import unicode_tokens

__all__ = ["DEFAULT_MAX_SENTENCE_LENGTH", "DIGIT_WORDS", "FAMILIES", "Family", "LANGUAGES", "TOKENIZERS",
           "TokenList", "Tokenizer", "text8_tokens", "unicode_tokens", "whitespace_tokens"]
