"""A mini-batch of tokens as spans of one byte buffer, made and hashed by compiled code.

``TokenSpans`` is what the trainer's compiled preparation consumes (``online.learner.vocab``
looks the spans up, ``online.learner.subsampling`` keeps or drops them): token ``i`` is
``buf[start[i]:start[i] + length[i]]`` (UTF-8), ``hash[i]`` is ``span_hash`` of those bytes and
``sentences`` holds the index of each sentence's first token, then the token count. No token
becomes a Python string on the way; only the words the vocabulary admits are ever decoded.

Two ways in:

``text8_spans``
    The ``text8`` tokenizer of ``online.learner.tokenizers`` over raw UTF-8 bytes in one
    compiled pass: it lower-cases, spells digits out, splits sentences on newlines and after
    ``. ! ?`` (and their full-width forms) followed by whitespace, and cuts sentences longer
    than ``max_sentence_length`` into chunks, exactly as ``Tokenizer.sentences`` does on the
    decoded text. That holds for any bytes, valid UTF-8 or not: only ASCII letters and digits
    make tokens, a decoder replacing invalid bytes never swallows an ASCII byte or a lead byte,
    so the only non-ASCII characters that matter (the full-width stops and the Unicode
    whitespace ``re``'s ``\\s`` matches) are recognised by their exact byte sequences.

``spans_of_sentences``
    Tokens that are already strings (``list[list[str]]``, any tokenizer): they are joined into
    one buffer in a few C-level calls and measured in code points, so no per-token Python loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
from numba import njit

_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGIT_TAIL = np.frombuffer("".join(_DIGIT_WORDS).encode(), dtype=np.uint8)
_DIGIT_OFFSET = np.cumsum([0] + [len(w) for w in _DIGIT_WORDS[:-1]]).astype(np.int64)
_DIGIT_LENGTH = np.array([len(w) for w in _DIGIT_WORDS], dtype=np.int64)

# byte classes of the text8 scan
_OTHER, _LETTER, _DIGIT, _NEWLINE, _SPACE, _STOP, _HIGH = 0, 1, 2, 3, 4, 5, 6
_CLASS = np.zeros(256, dtype=np.uint8)
_LOWER = np.arange(256, dtype=np.uint8)
for _c in range(26):
    _CLASS[ord("a") + _c] = _CLASS[ord("A") + _c] = _LETTER
    _LOWER[ord("A") + _c] = ord("a") + _c
_CLASS[ord("0"):ord("9") + 1] = _DIGIT
_CLASS[[ord("\n"), ord("\r")]] = _NEWLINE
_CLASS[[0x09, 0x0B, 0x0C, 0x20, 0x1C, 0x1D, 0x1E, 0x1F]] = _SPACE     # the ASCII that re's \s matches
_CLASS[[ord("."), ord("!"), ord("?")]] = _STOP
_CLASS[0x80:] = _HIGH

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(inline="always")
def _mix(h):
    """splitmix64's finaliser: every input bit reaches the high bits a table indexes by."""
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


@njit(inline="always")
def span_hash(buf, start, length):
    """64-bit hash of ``buf[start:start + length]`` (FNV-1a, then mixed); not a model key."""
    h = _FNV_OFFSET
    for i in range(start, start + length):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return _mix(h)


@njit(nogil=True, cache=True)
def hash_spans(buf, start, length, out):
    for i in range(start.shape[0]):
        out[i] = span_hash(buf, start[i], length[i])


@njit(inline="always")
def _high_kind(data, i, n):
    """(kind, bytes) of the non-ASCII character at ``i``: _SPACE, _STOP or _OTHER."""
    b = data[i]
    b1 = data[i + 1] if i + 1 < n else 0
    b2 = data[i + 2] if i + 2 < n else 0
    if b == 0xC2 and (b1 == 0x85 or b1 == 0xA0):
        return _SPACE, 2
    if b == 0xE1 and b1 == 0x9A and b2 == 0x80:
        return _SPACE, 3
    if b == 0xE2 and ((b1 == 0x80 and ((0x80 <= b2 <= 0x8A) or b2 == 0xA8 or b2 == 0xA9 or b2 == 0xAF))
                      or (b1 == 0x81 and b2 == 0x9F)):
        return _SPACE, 3
    if b == 0xE3 and b1 == 0x80 and (b2 == 0x80 or b2 == 0x82):
        return (_SPACE if b2 == 0x80 else _STOP), 3
    if b == 0xEF and b1 == 0xBC and (b2 == 0x81 or b2 == 0x9F):
        return _STOP, 3
    return _OTHER, 1


@njit(nogil=True, cache=True)
def _text8_scan(data, bounds, split_sentences, limit, cls, lower, digit_offset, digit_length,
                buf, start, length, hashes, sentences):
    """One pass over ``data``; returns (tokens, sentences). ``bounds``: sorted byte offsets
    where a record ends (a forced sentence break). ``buf`` gets the lower-cased letters and,
    after ``len(data)``, the digit words that digit tokens point at."""
    n = data.shape[0]
    n_tok = 0
    n_sent = 0
    cur = 0                 # tokens in the current sentence
    pending = True          # a sentence break is due before the next token
    after_stop = False      # the previous character was . ! ? or a full-width stop
    next_bound = 0
    stop = bounds[0] if bounds.shape[0] > 0 else n     # where the current record ends
    i = 0
    while True:
        if i >= stop:
            if stop >= n and next_bound >= bounds.shape[0]:
                break
            pending = True      # a record's end
            after_stop = False
            next_bound += 1
            stop = bounds[next_bound] if next_bound < bounds.shape[0] else n
            if stop > n:
                stop = n
            continue
        b = data[i]
        c = cls[b]
        if c == _LETTER or c == _DIGIT:
            if pending or cur == limit:
                sentences[n_sent] = n_tok
                n_sent += 1
                cur = 0
                pending = False
            after_stop = False
            if c == _DIGIT:
                d = b - 48
                a = n + digit_offset[d]
                start[n_tok] = a
                length[n_tok] = digit_length[d]
                hashes[n_tok] = span_hash(buf, a, digit_length[d])
                i += 1
            else:
                h = _FNV_OFFSET
                j = i
                while j < stop:
                    lb = lower[data[j]]
                    if cls[lb] != _LETTER:
                        break
                    buf[j] = lb
                    h = (h ^ np.uint64(lb)) * _FNV_PRIME
                    j += 1
                start[n_tok] = i
                length[n_tok] = j - i
                hashes[n_tok] = _mix(h)
                i = j
            n_tok += 1
            cur += 1
            continue
        step = 1
        if c == _NEWLINE:
            if split_sentences:
                pending = True
            after_stop = False
        elif c == _STOP:
            after_stop = True
        else:
            kind = c
            if c == _HIGH:
                kind, step = _high_kind(data, i, n)
            if kind == _SPACE:
                if after_stop and split_sentences:
                    pending = True
                after_stop = False
            elif kind == _STOP:
                after_stop = True
            else:
                after_stop = False
        i += step
    sentences[n_sent] = n_tok
    return n_tok, n_sent


@njit(nogil=True, cache=True)
def _byte_lengths(buf, chars, out):
    """Byte length of each of the consecutive UTF-8 tokens whose code-point counts are ``chars``."""
    pos = 0
    n = buf.shape[0]
    for t in range(chars.shape[0]):
        begin = pos
        for _ in range(chars[t]):
            pos += 1
            while pos < n and (buf[pos] & 0xC0) == 0x80:
                pos += 1
        out[t] = pos - begin


@njit(nogil=True, cache=True)
def _gather(buf, start, length, out, out_start):
    used = 0
    for t in range(start.shape[0]):
        out_start[t] = used
        a = start[t]
        for b in range(length[t]):
            out[used + b] = buf[a + b]
        used += length[t]


@dataclass
class TokenSpans:
    """Tokens of a mini-batch as spans of ``buf``; see the module docstring."""

    buf: np.ndarray         # uint8
    start: np.ndarray       # int64 per token
    length: np.ndarray      # int64 per token
    hash: np.ndarray        # uint64 per token, ``span_hash``
    sentences: np.ndarray   # int64 first token of each sentence, then the token count

    @property
    def num_tokens(self) -> int:
        return int(self.start.shape[0])

    @property
    def num_sentences(self) -> int:
        return int(self.sentences.shape[0]) - 1

    def __len__(self) -> int:
        """Sentences, as ``len`` of the ``list[list[str]]`` it stands for."""
        return self.num_sentences

    def token(self, i: int) -> str:
        a = int(self.start[i])
        return self.buf[a:a + int(self.length[i])].tobytes().decode("utf-8", "surrogatepass")

    def to_sentences(self) -> list[list[str]]:
        """The tokens as strings, one list per sentence (tests and diagnostics; slow)."""
        words = [self.token(i) for i in range(self.num_tokens)]
        s = self.sentences.tolist()
        return [words[s[k]:s[k + 1]] for k in range(len(s) - 1)]

    def sentence_slice(self, first: int, last: int) -> "TokenSpans":
        """Sentences ``first`` .. ``last - 1`` (views; the buffer is shared)."""
        a, b = int(self.sentences[first]), int(self.sentences[last])
        return TokenSpans(self.buf, self.start[a:b], self.length[a:b], self.hash[a:b],
                          self.sentences[first:last + 1] - a)

    def head(self, tokens: int) -> "TokenSpans":
        """The first ``tokens`` tokens (the last sentence cut there)."""
        if tokens >= self.num_tokens:
            return self
        k = int(np.searchsorted(self.sentences, tokens, side="left"))
        sentences = np.append(self.sentences[:k], tokens).astype(np.int64)
        return TokenSpans(self.buf, self.start[:tokens], self.length[:tokens], self.hash[:tokens], sentences)

    def compact(self) -> "TokenSpans":
        """The same tokens in a buffer of their own bytes only (to keep a slice of a big batch)."""
        buf = np.empty(int(self.length.sum()), dtype=np.uint8)
        start = np.empty(self.num_tokens, dtype=np.int64)
        _gather(self.buf, self.start, self.length, buf, start)
        return TokenSpans(buf, start, self.length.copy(), self.hash.copy(), self.sentences.copy())

    @staticmethod
    def concat(parts: list["TokenSpans"]) -> "TokenSpans":
        """One batch of several (their buffers are copied into one)."""
        parts = [p for p in parts if p.num_tokens]
        if not parts:
            return empty_spans()
        if len(parts) == 1:
            return parts[0]
        offsets = np.cumsum([0] + [len(p.buf) for p in parts[:-1]])
        firsts = np.cumsum([0] + [p.num_tokens for p in parts[:-1]])
        return TokenSpans(np.concatenate([p.buf for p in parts]),
                          np.concatenate([p.start + o for p, o in zip(parts, offsets)]),
                          np.concatenate([p.length for p in parts]), np.concatenate([p.hash for p in parts]),
                          np.concatenate([p.sentences[:-1] + f for p, f in zip(parts, firsts)]
                                         + [np.array([firsts[-1] + parts[-1].num_tokens], dtype=np.int64)]))


def empty_spans() -> TokenSpans:
    z = np.zeros(0, dtype=np.int64)
    return TokenSpans(np.zeros(0, dtype=np.uint8), z, z, np.zeros(0, dtype=np.uint64), np.zeros(1, dtype=np.int64))


def text8_spans(data, max_sentence_length: int, split_sentences: bool = True,
                bounds: np.ndarray | None = None) -> TokenSpans:
    """The text8 tokens and sentences of UTF-8 ``data`` (bytes-like or uint8 array)."""
    raw = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    n = raw.shape[0]
    buf = np.empty(n + DIGIT_TAIL.shape[0], dtype=np.uint8)
    buf[n:] = DIGIT_TAIL
    start = np.empty(n + 1, dtype=np.int64)
    length = np.empty(n + 1, dtype=np.int64)
    hashes = np.empty(n + 1, dtype=np.uint64)
    sentences = np.empty(n + 2, dtype=np.int64)
    b = np.zeros(0, dtype=np.int64) if bounds is None else np.ascontiguousarray(bounds, dtype=np.int64)
    n_tok, n_sent = _text8_scan(raw, b, bool(split_sentences), int(max_sentence_length), _CLASS, _LOWER,
                                _DIGIT_OFFSET, _DIGIT_LENGTH, buf, start, length, hashes, sentences)
    return TokenSpans(buf, start[:n_tok].copy(), length[:n_tok].copy(), hashes[:n_tok].copy(),
                      sentences[:n_sent + 1].copy())


def spans_of_tokens(tokens: list[str]) -> TokenSpans:
    """One sentence of string tokens (vocabulary updates of a token list)."""
    return spans_of_sentences([tokens])


def spans_of_sentences(sentences) -> TokenSpans:
    """``TokenSpans`` of tokenised sentences (``list[list[str]]``); empty sentences are kept."""
    if isinstance(sentences, TokenSpans):
        return sentences
    per_sentence = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
    tokens = list(chain.from_iterable(sentences))
    text = "".join(tokens)
    raw = text.encode("utf-8", "surrogatepass")
    buf = np.frombuffer(raw, dtype=np.uint8)
    chars = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    if len(raw) == len(text):
        length = chars
    else:
        length = np.empty(len(tokens), dtype=np.int64)
        _byte_lengths(buf, chars, length)
    start = np.zeros(len(tokens), dtype=np.int64)
    if len(tokens) > 1:
        np.cumsum(length[:-1], out=start[1:])
    hashes = np.empty(len(tokens), dtype=np.uint64)
    hash_spans(buf, start, length, hashes)
    bounds = np.zeros(len(sentences) + 1, dtype=np.int64)
    np.cumsum(per_sentence, out=bounds[1:])
    return TokenSpans(buf, start, length, hashes, bounds)


@njit(nogil=True, cache=True)
def batch_ends(sentences, first, batch_tokens):
    """Sentence indices ending each batch of at least ``batch_tokens`` tokens, from sentence
    ``first`` on (``livevec train``'s rule: a batch closes with the sentence that fills it)."""
    out = np.empty(sentences.shape[0], dtype=np.int64)
    k = 0
    begin = sentences[first]
    for s in range(first + 1, sentences.shape[0]):
        if sentences[s] - begin >= batch_tokens:
            out[k] = s
            k += 1
            begin = sentences[s]
    return out[:k]
