"""Reading a word2vec binary export as it arrives, and turning it into gensim's ``KeyedVectors``.

Why not buffer the download and parse it after: the buffer would double the memory of a
model that is already large (the parsed arrays are the size of the file). The header line
gives the row count and dimension, so the arrays are allocated once and filled a record at
a time; only an unfinished record is kept between chunks. The format is word2vec.c's,
as ``online.learner.word2vec_format`` writes it; the client reads it itself so that it
needs nothing of the server side installed.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from online.client.errors import IncompleteExport, LiveVecError


@dataclass
class Snapshot:
    version: int
    words: list[str]
    vectors: np.ndarray          # float32 [len(words), dim]


EXPORT_FORMAT = 1   # the newest X-Export-Format this client reads (``online.frontend.export.EXPORT_FORMAT``)


def check_export_format(headers: Mapping[str, str]) -> None:
    """Refuse an export whose format (``X-Export-Format``; absent: 1) is newer than this client reads."""
    found = headers.get("x-export-format", "1")
    if not found.isdigit() or int(found) > EXPORT_FORMAT:
        raise LiveVecError(f"the export is in format {found} (X-Export-Format); this client reads format "
                           f"{EXPORT_FORMAT}: upgrade the livevec client to the front end's release")


class BinaryReader:
    """A ``protocol.Sink`` for ``GET /v1/export?format=binary``."""

    def __init__(self, headers: Mapping[str, str]):
        check_export_format(headers)
        self.version = int(headers.get("x-model-version", 0))
        self.promised = int(headers["x-model-rows"]) if "x-model-rows" in headers else None
        self._buf = bytearray()
        self._count = self._dim = -1
        self._vectors = np.zeros((0, 0), np.float32)
        self._words: list[str] = []

    def feed(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        if self._count < 0:
            end = buf.find(b"\n")
            if end < 0:
                return
            try:
                self._count, self._dim = (int(x) for x in bytes(buf[:end]).split())
            except ValueError:
                raise LiveVecError(f"the export does not start with '<count> <dim>': {bytes(buf[:80])!r}") from None
            if self.promised is not None and self.promised != self._count:
                raise LiveVecError(f"the export's header line gives {self._count} rows, X-Model-Rows {self.promised}")
            self._vectors = np.empty((self._count, self._dim), np.float32)
            pos = end + 1
        width, words, vectors, size = 4 * self._dim, self._words, self._vectors, len(buf)
        while len(words) < self._count:
            while pos < size and buf[pos] == 10:          # word2vec.c's newline after each vector
                pos += 1
            space = buf.find(b" ", pos)
            if space < 0 or space + 1 + width > size:
                break
            vectors[len(words)] = np.frombuffer(buf, dtype="<f4", count=self._dim, offset=space + 1)
            words.append(buf[pos:space].decode("utf-8", errors="replace"))
            pos = space + 1 + width
        del buf[:pos]

    def finish(self) -> Snapshot:
        if self._count < 0 or len(self._words) < self._count:
            raise IncompleteExport(f"the export ended after {max(len(self._words), 0)} of "
                                   f"{max(self._count, 0)} rows")
        return Snapshot(self.version, self._words, self._vectors)


_NEEDS_GENSIM = ("to_keyed_vectors() needs gensim, which the client does not install itself: "
                 "pip install 'gensim>=4.3,<5' (or livevec[bench])")


def require_gensim():
    """gensim's ``KeyedVectors`` class; called before a long download, so a missing gensim fails first."""
    try:
        from gensim.models import KeyedVectors
    except ImportError as exc:
        raise ImportError(_NEEDS_GENSIM) from exc
    return KeyedVectors


def to_gensim(snapshot: Snapshot, source: str):
    """A ``gensim.models.KeyedVectors`` holding ``snapshot``, as ``load_word2vec_format`` would build it
    from the same file (its made-up descending counts included)."""
    KeyedVectors = require_gensim()
    n, dim = snapshot.vectors.shape
    kv = KeyedVectors(vector_size=dim, count=0, dtype=np.float32)
    kv.add_vectors(snapshot.words, snapshot.vectors)
    kv.allocate_vecattrs(attrs=["count"], types=[np.int64])
    kv.expandos["count"][:] = np.arange(n, 0, -1, dtype=np.int64)
    kv.add_lifecycle_event("livevec_export", msg=f"{n} x {dim} vectors of model version {snapshot.version} "
                                                 f"from {source}", version=snapshot.version)
    return kv
