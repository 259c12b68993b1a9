"""``GET /v1/export``: the served model as one word2vec file, streamed from one snapshot.

Why a snapshot and not "the rows as they are now": the model keeps changing while a
large export is on the wire, and a file whose first rows come from version v and its last
from v+40 matches no model anyone served. The handler takes ``holder.current`` once; a
``ModelIndex`` is never modified (syncs build a new one and swap the reference), so every
row of the answer, the version header and the row count come from that one object, however
many swaps happen meanwhile. The price is that the snapshot stays alive until the last
byte is sent.

Why streamed in chunks: the file of a 1M x 300 model is 1.2 GB; rows are encoded a chunk
(about ``CHUNK_BYTES``) at a time in a worker thread and written with back-pressure
(``StreamResponse.write`` waits while the socket is full), so memory stays at a chunk or
two per export and the event loop keeps answering queries while rows are formatted.

Formats (``format=``): ``binary`` (default) and ``text`` are word2vec.c's, as
``online.learner.word2vec_format`` writes them (binary: word, space, ``dim`` little-endian
float32, newline), so gensim's ``load_word2vec_format`` and livevec's own ``--model``
read the answer. Text writes 9 significant digits, which is what float32 needs to read back
to the same bits, so both formats carry the same numbers. ``vocab`` is word2vec.c's
``-save-vocab`` layout (``word count`` per line, what ``--vocab-counts`` reads): the word
list without the vectors, for clients that only need the vocabulary. Rows go out most
frequent first (ties: in the index's order), as word2vec.c and the learner write them,
which is what gensim's ``restrict_vocab`` assumes.

Words with whitespace. A word may hold any character (a JSON record's item list can carry
``"two words"``), but word2vec files end a word at the first space (text: every field is
space separated). So in ``binary``, ``text`` and ``vocab`` each whitespace character of a
word is written percent-escaped as its UTF-8 bytes (``word2vec_format.escape_word``:
``"two words"`` -> ``two%20words``, a tab ``%09``, U+00A0 ``%C2%A0``); every other word, ``%`` included, is
written byte for byte, so IDs and punctuation come back as they were. The escape is one
way: a reader sees ``two%20words`` as the key. Should the escaped spelling be a word of
the snapshot itself, the whitespace word is left out and counted in ``X-Model-Skipped``
(the header line still gives the row count exactly), as is an empty word (no tokenizer
makes one; a plug-in source might). ``words`` is for clients that need the words exactly:
one JSON array ``["two words", count]`` per line, every row, in the same order; the
Python clients' ``index_to_key`` comes from it.

Version: ``X-Export-Format`` (``EXPORT_FORMAT``), a header, since the bodies are other programs' formats.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import numpy as np
import orjson
from aiohttp import web

from online.search.model_index import ModelHolder, ModelIndex
from online.learner.word2vec_format import WHITESPACE, escape_word
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend")

FORMATS = ("binary", "text", "vocab", "words")
# The X-Export-Format header: raised by any change a reader of the previous version would misread (the escape, the
# row order, the words lines); the Python client refuses a newer one (``online.client.word2vec_stream``).
EXPORT_FORMAT = 1
CHUNK_BYTES = 1 << 20
_CONTENT_TYPES = {"binary": "application/octet-stream", "text": "text/plain", "vocab": "text/plain",
                  "words": "application/x-ndjson"}


def _escaped_words(index: ModelIndex) -> dict[int, str]:
    """Row -> escaped spelling, for the rows whose word holds whitespace (none in most models)."""
    words = index.words
    if not WHITESPACE.search("".join(words)):
        return {}
    return {r: escape_word(w) for r, w in enumerate(words) if WHITESPACE.search(w)}


def exportable_rows(index: ModelIndex, fmt: str = "binary") -> np.ndarray:
    """Rows of ``index`` in export order: most frequent first; for the word2vec formats, words they
    cannot hold (empty, or escaped into another word's spelling) left out."""
    order = np.argsort(-index.counts, kind="stable")
    if fmt == "words":
        return order
    words = index.words
    escaped = _escaped_words(index)
    if "" in words or escaped:                              # rare: only then look at each word
        ok = np.fromiter((bool(w) for w in words), dtype=bool, count=len(words))
        for r, spelling in escaped.items():
            other = index.row(spelling)
            ok[r] = not (other >= 0 and words[other] == spelling)
        order = order[ok[order]]
    return order


def encode_rows(index: ModelIndex, rows: np.ndarray, fmt: str, escaped: dict[int, str] | None = None) -> bytes:
    """The records of ``rows`` in ``fmt``; vectors as ``/v1/vector`` gives them (unit row times norm)."""
    rows_list = rows.tolist()
    if fmt == "words":
        counts = index.counts[rows].tolist()
        return b"".join(orjson.dumps([index.words[r], c]) + b"\n" for r, c in zip(rows_list, counts))
    words = _Escaped(index, escaped)
    if fmt == "vocab":
        counts = index.counts[rows].tolist()
        return "".join(f"{words[r]} {c}\n" for r, c in zip(rows_list, counts)).encode("utf-8")
    vectors = (index.unit_rows(rows) * index.norms[rows, None]).astype("<f4", copy=False)
    if fmt == "binary":
        return b"".join(words[r].encode("utf-8") + b" " + v.tobytes() + b"\n" for r, v in zip(rows_list, vectors))
    line = " ".join(["%.9g"] * index.dim)
    return "".join(f"{words[r]} {line % tuple(v)}\n" for r, v in zip(rows_list, vectors.tolist())).encode("utf-8")


class _Escaped:
    """``index.words`` as the word2vec formats spell them (``escape_word`` where needed)."""

    def __init__(self, index: ModelIndex, escaped: dict[int, str] | None = None):
        self._words = index.words
        self._escaped = _escaped_words(index) if escaped is None else escaped

    def __getitem__(self, row: int) -> str:
        return self._escaped.get(row) or self._words[row]


class Export:
    """The handler, given the holder it snapshots and the app's JSON error answer (as ``Guards`` is)."""

    def __init__(self, holder: ModelHolder, error_response: Callable[..., web.Response]):
        self._holder, self._error = holder, error_response

    async def handle(self, request: web.Request) -> web.StreamResponse:
        fmt = request.query.get("format", "binary")
        if fmt not in FORMATS:
            return self._error(400, "bad_format", f"format must be one of {', '.join(FORMATS)}, got {fmt[:40]!r}",
                               parameter="format")
        if not self._holder.loaded:
            return self._error(503, "not_ready", "no model has been loaded yet; try again shortly")
        index = self._holder.current                     # the one snapshot this whole answer is cut from
        rows = await asyncio.to_thread(exportable_rows, index, fmt)
        escaped = await asyncio.to_thread(_escaped_words, index)        # once, not per chunk
        dim = index.dim
        suffix = {"binary": "bin", "words": "jsonl"}.get(fmt, "txt")
        response = web.StreamResponse(headers={
            "X-Model-Version": str(index.version), "X-Model-Rows": str(len(rows)), "X-Model-Dim": str(dim),
            "X-Model-Skipped": str(index.n - len(rows)), "X-Export-Format": str(EXPORT_FORMAT),
            "Cache-Control": "no-store",
            "Content-Disposition": f'attachment; filename="livevec-v{index.version}-{fmt}.{suffix}"'})
        response.content_type = _CONTENT_TYPES[fmt]
        if fmt != "binary":
            response.charset = "utf-8"
        per_chunk = max(1, CHUNK_BYTES // {"binary": 16 + 4 * dim, "text": 16 + 14 * dim, "vocab": 24,
                                           "words": 28}[fmt])
        sent = 0
        try:
            await response.prepare(request)
            if request.method == "HEAD":         # the headers alone: version and row count, no rows encoded
                return response
            if fmt in ("binary", "text"):
                await response.write(f"{len(rows)} {dim}\n".encode())
            for start in range(0, len(rows), per_chunk):
                chunk = await asyncio.to_thread(encode_rows, index, rows[start:start + per_chunk], fmt,
                                                escaped)
                await response.write(chunk)
                sent = min(start + per_chunk, len(rows))
            await response.write_eof()
        except ConnectionError as exc:      # the client went away; nothing to answer, nothing to log as a 500
            log_event(log, "export_aborted", logging.INFO, version=index.version, rows_sent=sent,
                      rows=len(rows), error=repr(exc))
            return response
        log_event(log, "export_sent", version=index.version, format=fmt, rows=len(rows))
        return response
