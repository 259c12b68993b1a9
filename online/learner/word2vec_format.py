"""The word2vec.c text and binary formats, read and written in one place.

Exported vectors are the lingua franca between word2vec.c, gensim, fastText and every
downstream consumer, so the learner writes them and the front end reads any such file,
including livevec's own; one module owns both sides so the two cannot drift apart. The
tests check the reader against gensim's writer and the writer against gensim's reader.
Both formats start with a header line ``"<count> <dim>\\n"``:

text
    one line per word: ``word v1 v2 ... vdim``, space separated. A file without the
    header line (GloVe's layout) is read too; the dimension is taken from the first line.
binary
    per word: the UTF-8 word, one space, then ``dim`` little-endian float32. word2vec.c
    writes a newline after each vector and gensim does not; the reader accepts both and
    the writer follows word2vec.c.

Writing: words go out in the order given; livevec writes the most frequent first, which
is what ``restrict_vocab`` in gensim's evaluations assumes. Files are written to a
temporary name and renamed, so a reader never sees half a file.

Words with whitespace. Both formats end a word at a space, but a word may hold one (a JSON
record's list of tokens is taken as it is). The writers, and the front end's export, write
each whitespace character of such a word percent-escaped as its UTF-8 bytes
(``escape_word``: ``"two words"`` -> ``two%20words``, a tab ``%09``); every other word is
written byte for byte, ``%`` included, so IDs and punctuation read back as they were. The
escape is one way (a reader's key is ``two%20words``), and a whitespace word whose escaped
spelling is also a word of the file is left out (``file_spellings``). An empty word cannot
be written at all.

Reading: files ending in ``.gz`` are decompressed on the fly. Errors name the file and
the line (text) or record (binary) that is wrong, because these files are produced by
other people's jobs and a truncated export must be easy to diagnose.
"""
from __future__ import annotations

import gzip
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# ------------------------------------------------------------------ reading
FORMATS = ("auto", "text", "binary")
_TEXT_BYTES = frozenset(b"0123456789.-+eEinfaINFA \t\r\n")


class Word2VecFormatError(ValueError):
    """The file is not a valid word2vec file; the message says where."""


@dataclass
class WordVectors:
    words: list[str]
    vectors: np.ndarray          # float32 [len(words), dim]
    counts: np.ndarray           # int64 [len(words)], zero where unknown

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])


def _open_bytes(path: str | os.PathLike) -> bytes:
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return fh.read()


def _parse_header(first_line: bytes) -> tuple[int, int] | None:
    parts = first_line.split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[0]), int(parts[1])
    return None


def sniff_format(data: bytes) -> str:
    """``"binary"`` if the bytes after the first word of the first record are not text."""
    end = data.find(b"\n")
    header = _parse_header(data[:end] if end >= 0 else data)
    if header is None:
        return "text"           # only text files may lack the header line
    _count, dim = header
    pos = end + 1
    space = data.find(b" ", pos)
    if space < 0:
        return "text"
    line_end = data.find(b"\n", space + 1)
    parts = data[space + 1: line_end if line_end >= 0 else len(data)].split()
    if len(parts) == dim and all(p.lstrip(b"-+").replace(b".", b"", 1).isdigit() for p in parts):
        return "text"           # the first record is a text line (its next word may hold any bytes: '%')
    sample = data[space + 1: space + 1 + 4 * dim]
    return "text" if all(b in _TEXT_BYTES for b in sample) else "binary"


def read_word2vec(path: str | os.PathLike, fmt: str = "auto") -> WordVectors:
    """Read a word2vec text or binary file (``fmt`` ``auto`` sniffs which)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    data = _open_bytes(path)
    if not data.strip():
        raise Word2VecFormatError(f"{os.fspath(path)}: the file is empty")
    if fmt == "auto":
        fmt = sniff_format(data)
    if fmt == "binary":
        return _read_binary(data, os.fspath(path))
    return _read_text(data, os.fspath(path))


def _read_binary(data: bytes, name: str) -> WordVectors:
    end = data.find(b"\n")
    header = _parse_header(data[:end]) if end >= 0 else None
    if header is None:
        raise Word2VecFormatError(f"{name}: a binary word2vec file must start with '<count> <dim>'")
    count, dim = header
    if dim < 1:
        raise Word2VecFormatError(f"{name}: the header gives dimension {dim}")
    vectors = np.empty((count, dim), dtype=np.float32)
    words: list[str] = []
    width = 4 * dim
    pos = end + 1
    size = len(data)
    for i in range(count):
        while pos < size and data[pos] in b"\n\r":
            pos += 1
        space = data.find(b" ", pos)
        if space < 0 or space + 1 + width > size:
            raise Word2VecFormatError(f"{name}: record {i + 1} of {count} is truncated (the file ends early)")
        words.append(data[pos:space].decode("utf-8", errors="replace"))
        vectors[i] = np.frombuffer(data, dtype="<f4", count=dim, offset=space + 1)
        pos = space + 1 + width
    return WordVectors(words, vectors, np.zeros(count, dtype=np.int64))


def _read_text(data: bytes, name: str) -> WordVectors:
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines()
    header = _parse_header(lines[0].encode()) if lines else None
    body = lines[1:] if header is not None else lines
    body = [line for line in body if line.strip()]
    if header is not None:
        count, dim = header
        if len(body) < count:
            raise Word2VecFormatError(f"{name}: the header promises {count} words but the file has {len(body)}")
        body = body[:count]
    else:
        if not body:
            raise Word2VecFormatError(f"{name}: no vectors found")
        dim = len(body[0].split()) - 1
    if dim < 1:
        raise Word2VecFormatError(f"{name}: the dimension must be >= 1, got {dim}")
    words: list[str] = []
    rests: list[str] = []
    for line in body:
        word, _, rest = line.strip().partition(" ")
        words.append(word)
        rests.append(rest)
    flat = _parse_floats(" ".join(rests))
    if flat is None or flat.size != len(body) * dim:
        first_data_line = 2 if header is not None else 1
        for i, rest in enumerate(rests):
            parts = rest.split()
            try:
                ok = len(parts) == dim and len([float(p) for p in parts]) == dim
            except ValueError:
                ok = False
            if not ok:
                raise Word2VecFormatError(
                    f"{name}: line {i + first_data_line} (word {words[i]!r}) should have {dim} numbers "
                    f"after the word, got {rest[:80]!r}")
        raise Word2VecFormatError(f"{name}: could not parse the vectors")
    return WordVectors(words, flat.reshape(len(body), dim), np.zeros(len(body), dtype=np.int64))


def _parse_floats(joined: str) -> np.ndarray | None:
    """All whitespace-separated numbers of ``joined`` as float32, at C speed (None on a bad token)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # numpy warns (does not raise) when it stops at a bad token
        try:
            return np.fromstring(joined, dtype=np.float32, sep=" ")
        except (ValueError, DeprecationWarning):
            return None


def read_vocab_counts(path: str | os.PathLike) -> dict[str, int]:
    """A ``word count`` per line file (word2vec.c's ``-save-vocab``, gensim's ``fvocab``). The count
    is the last field, so a word written with its whitespace is read too; it is keyed by its file
    spelling (``escape_word``), which is how the vectors file beside it names it."""
    counts: dict[str, int] = {}
    text = _open_bytes(path).decode("utf-8", errors="replace")
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rsplit(None, 1)
        if len(parts) == 2 and WHITESPACE.search(parts[0].strip()):
            parts = [escape_word(parts[0].strip()), parts[1]]
        if len(parts) != 2:
            raise Word2VecFormatError(f"{os.fspath(path)}: line {lineno} should be 'word count', got {line[:80]!r}")
        try:
            counts[parts[0]] = int(parts[1])
        except ValueError:
            raise Word2VecFormatError(
                f"{os.fspath(path)}: line {lineno}: the count {parts[1]!r} is not an integer") from None
    return counts


# ------------------------------------------------------------------ writing
WHITESPACE = re.compile(r"\s")


def escape_word(word: str) -> str:
    """``word`` as the word2vec formats hold it: each whitespace character percent-escaped (UTF-8)."""
    return WHITESPACE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8")), word)


def file_spellings(words: list[str]) -> list[str | None]:
    """Each word as a file spells it, None for a whitespace word escaped into another word's spelling."""
    if any(not w for w in words):
        raise ValueError("an empty word cannot be written in word2vec format")
    if not WHITESPACE.search("".join(words)):
        return list(words)
    plain = set(words)
    out: list[str | None] = []
    for w in words:
        spelling = escape_word(w) if WHITESPACE.search(w) else w
        out.append(None if spelling != w and spelling in plain else spelling)
    return out


def _check(words: list[str], vectors: np.ndarray) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(words):
        raise ValueError(f"{len(words)} words but vectors of shape {vectors.shape}")
    return vectors, [(s, row) for s, row in zip(file_spellings(words), vectors) if s is not None]


def write_text(path: str | os.PathLike, words: list[str], vectors: np.ndarray) -> None:
    vectors, records = _check(words, vectors)
    tmp = Path(f"{path}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(f"{len(records)} {vectors.shape[1]}\n")
        for word, row in records:
            out.write(word + " " + " ".join(f"{x:.6g}" for x in row.tolist()) + "\n")
    os.replace(tmp, path)


def write_binary(path: str | os.PathLike, words: list[str], vectors: np.ndarray) -> None:
    vectors, records = _check(words, vectors)
    tmp = Path(f"{path}.tmp")
    with open(tmp, "wb") as out:
        out.write(f"{len(records)} {vectors.shape[1]}\n".encode())
        for word, row in records:
            out.write(word.encode("utf-8") + b" " + row.astype("<f4", copy=False).tobytes() + b"\n")
    os.replace(tmp, path)


def write_vocab(path: str | os.PathLike, words: list[str], counts) -> None:
    """``word count`` per line (word2vec.c's ``-save-vocab``), the words spelled as the vectors files
    spell them, so ``--vocab-counts`` matches them to their rows."""
    tmp = Path(f"{path}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.writelines(f"{s} {int(c)}\n" for s, c in zip(file_spellings(words), counts) if s is not None)
    os.replace(tmp, path)
