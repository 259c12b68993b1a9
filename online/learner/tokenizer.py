"""Turning a text record (a Kafka message, a line of a file) into sentences of tokens.

Two tokenizers, chosen by name:

``text8`` (default)
    The last step of the script that made text8, which is also how the benchmark corpus
    ``wiki17m`` was normalised: ASCII letters lower-cased, each digit spelled out as a
    word (``"1"`` -> ``"one"``), every other character (punctuation, non-ASCII) turned into
    a space. Training on text normalised the same way as the evaluation sets keeps
    livevec comparable with gensim/word2vec numbers on text8-like corpora.

``unicode``
    For real multilingual streams: NFKC normalisation, case folding, and words are
    maximal runs of Unicode letters/digits/marks (``\\w``), with inner apostrophes kept
    (``don't``, ``l'homme``). Scripts without spaces (CJK) come out as runs, which is the
    honest best a regex can do.

Records are split into sentences because SGNS windows must not cross sentence
boundaries: on newlines and, for raw text, after ``. ! ?`` (and their full-width
forms) followed by whitespace. A sentence longer than ``max_sentence_length`` tokens is cut
into chunks, as gensim and word2vec.c do (10,000 and 1,000 tokens), so one huge record
(a whole Wikipedia article on one line) costs no more memory than it must.

``Tokenizer.sentences`` gives lists of strings. The trainer's path is ``Tokenizer.spans`` (records)
and ``Tokenizer.text_spans`` (a block of lines, one record each): the same tokens and sentences
as ``online.learner.spans.TokenSpans``, which the ``text8`` tokenizer makes in one compiled pass
over the bytes without a Python string per token (``unicode`` goes through ``sentences``).
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

import numpy as np

from online.learner.spans import TokenSpans, spans_of_sentences, text8_spans

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

_SENTENCE_END_RE = re.compile(r"(?<=[.!?\u3002\uff01\uff1f])\s+|[\r\n]+")
_UNICODE_WORD_RE = re.compile(r"\w+(?:['\u2019]\w+)*")

DEFAULT_MAX_SENTENCE_LENGTH = 10_000
TOKENIZERS = ("text8", "unicode")


def text8_tokens(text: str) -> list[str]:
    """text8 normalisation of ``text``, split into tokens."""
    raw = text.encode("utf-8", errors="replace").translate(_TEXT8_TABLE)
    if _DIGIT_RE.search(raw):
        raw = _DIGIT_RE.sub(lambda m: _DIGIT_BYTES[m.group()[0] - 48], raw)
    # Only ASCII remains, so decoding cannot fail and split() is the C fast path.
    return raw.decode("ascii").split()


def unicode_tokens(text: str) -> list[str]:
    """Unicode-aware words: NFKC, case-folded, runs of word characters."""
    return _UNICODE_WORD_RE.findall(unicodedata.normalize("NFKC", text).casefold())


class Tokenizer:
    """Splits records into sentences of tokens; picklable and thread-safe (stateless)."""

    def __init__(self, kind: str = "text8", max_sentence_length: int = DEFAULT_MAX_SENTENCE_LENGTH,
                 split_sentences: bool = True):
        if kind not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(TOKENIZERS)}")
        if max_sentence_length < 2:
            raise ValueError("max_sentence_length must be >= 2")
        self.kind = kind
        self.max_sentence_length = max_sentence_length
        self.split_sentences = split_sentences
        self._tokens = text8_tokens if kind == "text8" else unicode_tokens

    def tokens(self, text: str) -> list[str]:
        return self._tokens(text)

    def sentences(self, record: str | bytes | None) -> list[list[str]]:
        """The sentences of one record; empty sentences are dropped. Undecodable bytes
        become U+FFFD (a token boundary) and a None record (a Kafka tombstone) is empty,
        so no record can stop a worker."""
        if record is None:
            return []
        if isinstance(record, (bytes, bytearray, memoryview)):
            record = bytes(record).decode("utf-8", errors="replace")
        pieces = _SENTENCE_END_RE.split(record) if self.split_sentences else [record]
        out: list[list[str]] = []
        limit = self.max_sentence_length
        for piece in pieces:
            if not piece:
                continue
            toks = self._tokens(piece)
            if not toks:
                continue
            if len(toks) <= limit:
                out.append(toks)
            else:
                out.extend(toks[i:i + limit] for i in range(0, len(toks), limit))
        return out

    def sentences_of(self, records: Iterable[str | bytes]) -> list[list[str]]:
        out: list[list[str]] = []
        for record in records:
            out.extend(self.sentences(record))
        return out

    def spans(self, records: Iterable[str | bytes | None]) -> TokenSpans:
        """``sentences_of(records)`` as ``TokenSpans`` (compiled for ``text8``)."""
        if self.kind != "text8":
            return spans_of_sentences(self.sentences_of(records))
        parts: list[bytes] = []
        bounds: list[int] = []
        end = 0
        for record in records:
            if record is None:
                continue
            data = record.encode("utf-8", "surrogatepass") if isinstance(record, str) else bytes(record)
            parts.append(data)
            end += len(data)
            bounds.append(end)
            end += 1
        return text8_spans(b"\n".join(parts), self.max_sentence_length, self.split_sentences,
                           np.array(bounds, dtype=np.int64))

    def text_spans(self, block: bytes) -> TokenSpans:
        """The sentences of a block of UTF-8 text whose lines are records (``livevec train``'s
        file), as ``TokenSpans``: the same as ``spans(block.split(b"\\n"))``."""
        if self.kind != "text8":
            return spans_of_sentences(self.sentences_of(block.split(b"\n")))
        raw = np.frombuffer(block, dtype=np.uint8)
        bounds = None if self.split_sentences else np.flatnonzero(raw == 10)
        return text8_spans(raw, self.max_sentence_length, self.split_sentences, bounds)
