"""The ``tokens`` tokenizer and token-list records: words kept byte for byte.

Item2vec streams (sessions of product, video or ad IDs) and text tokenised upstream must reach the
vocabulary as they were sent: ``sku-123``, ``user:42``, ``C++`` and ``#hashtag`` are four words, not
pieces of words. ``tokens`` therefore splits on whitespace only (exactly what ``str.split()`` calls
whitespace, Unicode spaces included) and on NUL, which no word may hold because the servers' messages
separate words with it. Case, punctuation and every script are kept. Sentences end at newlines and at
a record's end only: a ``.`` is a word of its own here, not a sentence boundary.

A token list is a record that already is one sentence of tokens (a JSON list, ``online.stream.records``):
U+001E, then its items joined by U+001F. It is a plain ``str``, so everything that carries records (batches,
the worker's mini-batches, which size them with ``split()``) carries it unchanged, and the garbage collector
does not track it (it would track a ``str`` subclass, and on a stream of short sessions walk the trainer's
objects again and again). The stream keeps text records from starting with
U+001E. Each item is a token however many spaces it holds; only U+001E, U+001F and NUL split an item.

Both run as one compiled pass over the records' UTF-8 bytes (``tokens_spans``), like the ``text8``
scan of ``online.learner.spans``: no Python string per token.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from online.learner.spans import _SPACE, TokenSpans, _high_kind, span_hash

LIST_MARK = "\x1e"
LIST_SEPARATOR = "\x1f"

# ASCII bytes that end a token in text (str.split()'s ASCII whitespace, newlines apart, and NUL)
_ASCII_SPACE = np.zeros(128, dtype=np.bool_)
_ASCII_SPACE[[0x00, 0x09, 0x0B, 0x0C, 0x20, 0x1C, 0x1D, 0x1E, 0x1F]] = True


class TokenList:
    """Token-list records (see the module docstring): plain strings, made, recognised and read here."""

    @staticmethod
    def of(items) -> str:
        """The record of ``items`` (strings; ``str.join`` raises TypeError on anything else)."""
        return LIST_MARK + LIST_SEPARATOR.join(items)

    @staticmethod
    def is_one(record) -> bool:
        return record[:1] == LIST_MARK if isinstance(record, str) else record[:1] == b"\x1e"

    @staticmethod
    def items(record: str) -> list[str]:
        body = record[1:].replace("\x00", LIST_SEPARATOR).replace(LIST_MARK, LIST_SEPARATOR)
        return [t for t in body.split(LIST_SEPARATOR) if t]


def whitespace_tokens(text: str) -> list[str]:
    """The ``tokens`` tokenizer on one piece of text (the reference of the compiled scan)."""
    return text.replace("\x00", " ").split()


@njit(inline="always")
def _separator(data, i, end, is_list):
    """(bytes of the separator at ``i``, 0 if none; whether it is a newline)."""
    b = data[i]
    if is_list:
        return (1 if b == 0x1F or b == 0x1E or b == 0x00 else 0), False
    if b == 0x0A or b == 0x0D:
        return 1, True
    if b < 0x80:
        return (1 if _ASCII_SPACE[b] else 0), False
    kind, step = _high_kind(data, i, end)
    return (step if kind == _SPACE else 0), False


@njit(nogil=True, cache=True)
def _tokens_scan(data, ends, split_sentences, limit, start, length, hashes, sentences):
    """Tokens of records ``data[a:ends[r]]`` (each record followed by one joining byte; one that starts
    with U+001E is a token list); returns (tokens, sentences)."""
    n_tok = 0
    n_sent = 0
    a = 0
    for r in range(ends.shape[0]):
        end = ends[r]
        listed = a < end and data[a] == 0x1E
        pending = True
        cur = 0
        i = a
        while i < end:
            w, newline = _separator(data, i, end, listed)
            if w:
                if newline and split_sentences:
                    pending = True
                i += w
                continue
            if pending or cur == limit:
                sentences[n_sent] = n_tok
                n_sent += 1
                cur = 0
                pending = False
            j = i + 1
            while j < end:
                w, newline = _separator(data, j, end, listed)
                if w:
                    break
                j += 1
            start[n_tok] = i
            length[n_tok] = j - i
            hashes[n_tok] = span_hash(data, i, j - i)
            n_tok += 1
            cur += 1
            i = j
        a = end + 1
    sentences[n_sent] = n_tok
    return n_tok, n_sent


def tokens_spans(data, ends: np.ndarray, max_sentence_length: int, split_sentences: bool = True) -> TokenSpans:
    """``TokenSpans`` of records laid end to end in ``data`` (valid UTF-8), record ``r`` ending at
    ``ends[r]`` and followed by one joining byte (a newline: a record per line)."""
    raw = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    n = raw.shape[0]
    start = np.empty(n // 2 + 1, dtype=np.int64)
    length = np.empty(n // 2 + 1, dtype=np.int64)
    hashes = np.empty(n // 2 + 1, dtype=np.uint64)
    sentences = np.empty(n // 2 + 2, dtype=np.int64)
    n_tok, n_sent = _tokens_scan(raw, np.ascontiguousarray(ends, dtype=np.int64), bool(split_sentences),
                                 int(max_sentence_length), start, length, hashes, sentences)
    return TokenSpans(raw, start[:n_tok].copy(), length[:n_tok].copy(), hashes[:n_tok].copy(),
                      sentences[:n_sent + 1].copy())
