"""Turning a record (a Kafka message, a line of a file) into sentences of tokens.

``Tokenizer`` applies the family a name picks (``online.learner.tokenizers.families``) to whole records.

Records are split into sentences because SGNS windows must not cross sentence
boundaries: on newlines and, for raw text, after ``. ! ?`` followed by whitespace (``text8``,
``unicode``) and after their full-width forms (``text8``: followed by whitespace; ``unicode``:
always, as Chinese and Japanese put no space after them); ``tokens`` on newlines only. A sentence longer than ``max_sentence_length`` tokens is
cut into chunks, as gensim and word2vec.c do (10,000 and 1,000 tokens), so one huge record (a whole
Wikipedia article on one line) costs no more memory than it must. A token-list record (the items
of a JSON list, ``online.stream.records``) is one sentence of its items, whatever the family.

``Tokenizer.sentences`` gives lists of strings. The trainer's path is ``Tokenizer.spans`` (records)
and ``Tokenizer.text_spans`` (a block of lines, one record each): the same tokens and sentences
as ``online.learner.spans.TokenSpans``, which ``text8`` and ``tokens`` (and every token list)
make in one compiled pass over the bytes without a Python string per token (``unicode`` goes
through ``sentences``).
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from online.learner.spans import TokenSpans, empty_spans, spans_of_sentences, text8_spans
from online.learner.tokenizers.cjk import LANGUAGES, check_available
from online.learner.tokenizers.families import FAMILIES, TOKENIZERS
from online.learner.tokenizers.tokens import TokenList, tokens_spans

DEFAULT_MAX_SENTENCE_LENGTH = 10_000


def _utf8(record: str | bytes) -> bytes:
    """A record's bytes, invalid UTF-8 replaced as ``sentences`` decodes it (the compiled scans keep
    bytes as they are, and a token must decode)."""
    if isinstance(record, str):
        return record.encode("utf-8", "surrogatepass")
    data = bytes(record)
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace").encode("utf-8")


class Tokenizer:
    """Splits records into sentences of tokens; picklable and thread-safe (stateless)."""

    def __init__(self, kind: str = "text8", max_sentence_length: int = DEFAULT_MAX_SENTENCE_LENGTH,
                 split_sentences: bool = True, language: str = "auto"):
        if kind not in FAMILIES:
            raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(TOKENIZERS)}")
        if language not in LANGUAGES:
            raise ValueError(f"unknown language {language!r}; choose one of {', '.join(LANGUAGES)}")
        if max_sentence_length < 2:
            raise ValueError("max_sentence_length must be >= 2")
        self.kind = kind
        self.family = family = FAMILIES[kind]
        self.language = language
        self.max_sentence_length = max_sentence_length
        self.split_sentences = split_sentences
        if family.takes_language:
            check_available()

    def tokens(self, text: str) -> list[str]:
        if self.family.takes_language:
            return self.family.tokens(text, self.language)
        return self.family.tokens(text)

    def _chunks(self, toks: list[str], out: list[list[str]]) -> None:
        limit = self.max_sentence_length
        if len(toks) <= limit:
            out.append(toks)
        else:
            out.extend(toks[i:i + limit] for i in range(0, len(toks), limit))

    def sentences(self, record: str | bytes | None) -> list[list[str]]:
        """The sentences of one record; empty sentences are dropped. Undecodable bytes
        become U+FFFD (a token boundary but for ``tokens``) and a None record (a Kafka tombstone)
        is empty, so no record can stop a worker."""
        if record is None:
            return []
        out: list[list[str]] = []
        if TokenList.is_one(record):
            toks = TokenList.items(record if isinstance(record, str) else bytes(record).decode("utf-8", "replace"))
            if toks:
                self._chunks(toks, out)
            return out
        if isinstance(record, (bytes, bytearray, memoryview)):
            record = bytes(record).decode("utf-8", errors="replace")
        pieces = self.family.sentence_end.split(record) if self.split_sentences else [record]
        for piece in pieces:
            if piece:
                toks = self.tokens(piece)
                if toks:
                    self._chunks(toks, out)
        return out

    def sentences_of(self, records: Iterable[str | bytes]) -> list[list[str]]:
        out: list[list[str]] = []
        for record in records:
            out.extend(self.sentences(record))
        return out

    def spans(self, records: Iterable[str | bytes | None]) -> TokenSpans:
        """``sentences_of(records)`` as ``TokenSpans`` (compiled for ``text8``, ``tokens`` and
        token-list records), in the records' order."""
        parts = []
        run: list[str | bytes] = []
        listed = False
        for record in records:
            if record is None:
                continue
            is_list = TokenList.is_one(record)
            if is_list != listed and run:
                parts.append(self._scan_tokens(run) if listed else self._text_records_spans(run))
                run = []
            listed = is_list
            run.append(record)
        if run:
            parts.append(self._scan_tokens(run) if listed else self._text_records_spans(run))
        if not parts:
            return empty_spans()
        return parts[0] if len(parts) == 1 else TokenSpans.concat(parts)

    def _text_records_spans(self, records: list[str | bytes]) -> TokenSpans:
        compiled = self.family.compiled
        if compiled == "tokens":
            return self._scan_tokens(records)
        if compiled is None:
            return spans_of_sentences(self.sentences_of(records))
        parts: list[bytes] = []
        bounds: list[int] = []
        end = 0
        for record in records:
            data = record.encode("utf-8", "surrogatepass") if isinstance(record, str) else bytes(record)
            parts.append(data)
            end += len(data)
            bounds.append(end)
            end += 1
        return text8_spans(b"\n".join(parts), self.max_sentence_length, self.split_sentences,
                           np.array(bounds, dtype=np.int64))

    def _scan_tokens(self, records) -> TokenSpans:
        """The ``tokens`` scan of text and token-list records (told apart by their first byte)."""
        parts = [_utf8(r) for r in records]
        ends = np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)) + 1) - 1
        return tokens_spans(b"\n".join(parts), ends, self.max_sentence_length, self.split_sentences)

    def text_spans(self, block: bytes) -> TokenSpans:
        """The sentences of a block of UTF-8 text whose lines are records (``livevec train``'s
        file), as ``TokenSpans``: the same as ``spans(block.split(b"\\n"))``."""
        if self.family.compiled is None:
            return spans_of_sentences(self.sentences_of(block.split(b"\n")))
        if self.family.compiled == "tokens":
            data = _utf8(block)
            raw = np.frombuffer(data, dtype=np.uint8)
            ends = np.append(np.flatnonzero(raw == 10), len(data))
            return tokens_spans(raw, ends, self.max_sentence_length, self.split_sentences)
        raw = np.frombuffer(block, dtype=np.uint8)
        bounds = None if self.split_sentences else np.flatnonzero(raw == 10)
        return text8_spans(raw, self.max_sentence_length, self.split_sentences, bounds)
