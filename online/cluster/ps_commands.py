"""livevec's commands on top of ps-lite, and the byte layouts of their payloads.

ps-lite gives two channels: KV requests, whose ``cmd`` travels in the meta's ``head``,
and SimpleApp requests with a ``head`` and a ``body``. livevec keeps the bulk numeric
traffic (rows, gradients, counts) on the KV channel, where keys and values are raw
little-endian frames sent without copies, and uses SimpleApp for the rarer control
traffic (word strings, the front end's incremental sync, stats, checkpoints).

KV commands (``cmd``), keys sorted and unique as ps-lite requires:

* ``CMD_ROWS`` (0, ps-lite's default): pull returns ``dim`` floats per key; push carries
  SGNS loss gradients that the server's optimizer applies. A stock ps-lite worker that
  pushes and pulls with cmd 0 therefore still talks to a livevec server.
* ``CMD_COUNTS``: push, one float per key: occurrence counts to add to words.
* ``CMD_FREE``: push, one (ignored) float per key: delete the rows (evicted words).
* ``CMD_DELTA``: pushpull, ``dim + 1`` floats per key: a worker replica's change of each row
  since its last sync and the row's AdaGrad accumulator increment; the answer has the same
  layout with the merged row and accumulator (``online.cluster.replica``).
* ``CMD_DELTA_FRESH``: as ``CMD_DELTA``, for rows the worker created from the initial value
  since its last sync: the server adds them only to rows still at that value (a word new to
  the cluster) and otherwise just answers with its row, which the worker adopts.
* ``CMD_DELTA_PACKED`` / ``CMD_DELTA_PACKED_I8``: ``CMD_DELTA`` with int8 deltas out, float16 / int8 rows back.
* ``CMD_WORD_COUNTS``: pushpull, one float per key (an input key): occurrences of every word
  read since the last sync; the answer is the cluster's total of each (``online.learner.word_counts``).

SimpleApp heads:

* ``HEAD_SET_WORDS``: body = ``encode_words(keys, words)``; the strings of input keys.
* ``HEAD_CHANGES``: body = orjson ``{"since": v, "epoch": e}``; the answer is
  ``encode_changes(...)``: the input rows changed after version ``v`` of that server.
  ``epoch`` is a random number a server draws at start (and on every reload), so a
  caller that asks a restarted server with an old version gets everything.
* ``HEAD_STATS``: answer = orjson dict of the server's counters.
* ``HEAD_EXCHANGE``: answer = orjson ``{"exchange": EXCHANGE_VERSION}``, the replica exchange this server speaks
  (a server that predates the head answers ``{"error": ...}``: exchange 1, float32 ``CMD_DELTA`` only).
* ``HEAD_WORKER_REPORT``: a worker's Kafka lag, words/s and training signal (orjson;
  ``online.cluster.training_signal``), kept by server 0 for ``HEAD_STATS`` so the front end
  can show the whole pipeline's figures.
* ``HEAD_CHECKPOINT_*``, ``HEAD_ROLLBACK_*``, ``HEAD_FENCE``, ``HEAD_LEDGER``, ``HEAD_RECOVERING``:
  coordinated checkpoints and rollbacks (``online.checkpoint.participants``; orjson bodies described there).
"""
from __future__ import annotations

import struct

import numpy as np
import orjson

CMD_ROWS = 0
CMD_COUNTS = 1
CMD_FREE = 2
CMD_DELTA = 3
CMD_WORD_COUNTS = 4
CMD_DELTA_FRESH = 5
CMD_DELTA_PACKED = 6
CMD_DELTA_PACKED_I8 = 7

# How each packed command's answers carry the rows: ``online.cluster.delta_wire``'s F16 and I8 layouts.
ROWS_BACK = {CMD_DELTA_PACKED: "f16", CMD_DELTA_PACKED_I8: "i8"}

# The replica exchange's version: 1, float32 deltas (``CMD_DELTA``) and every changed row listed; 2, packed deltas
# (``CMD_DELTA_PACKED``: rows back in float16) and rows listed once moved (``online.cluster.change_listing``);
# 3, rows back in int8 too (``CMD_DELTA_PACKED_I8``). A server speaks every version up to its own; a worker speaks
# the highest version every server answers ``HEAD_EXCHANGE`` with. Design: docs/design/0008-scalable-exchange.md
EXCHANGE_VERSION = 3

HEAD_SET_WORDS = 100
HEAD_CHANGES = 101
HEAD_STATS = 102
HEAD_WORKER_REPORT = 103     # worker -> server 0: its lag, rate and training signal (orjson), for the front end's stats
HEAD_TRAINABLE_SINCE = 104   # worker -> server: the keys that became trainable since a position of its journal
HEAD_CHANGED_ROWS = 105      # worker -> server: the keys of the rows changed since a version (its replica refreshes them)
HEAD_EXCHANGE = 106          # worker -> server: the replica exchange's version the server speaks
HEAD_CHECKPOINT_PAUSE = 110     # to workers: finish in-flight batches, pause, report offsets
HEAD_CHECKPOINT_SAVE = 111      # to servers: write your shard for checkpoint id
HEAD_CHECKPOINT_RESUME = 112    # to workers: go on
HEAD_ROLLBACK_LOAD = 113        # to servers: reload checkpoint id
HEAD_ROLLBACK_SEEK = 114        # to workers: drop in-flight work, seek to the checkpoint's offsets
HEAD_CHECKPOINT_REQUEST = 115   # to the scheduler's coordinator: take a checkpoint now, or roll back
HEAD_FENCE = 116                # worker -> server: answered once every earlier message of that worker was applied
HEAD_LEDGER = 117               # worker -> server 0: the Kafka offset ranges of a batch whose pushes were acked
HEAD_RECOVERING = 118           # coordinator -> servers: a rollback is (not) in progress, for the stats

_SEP = b"\x00"   # tokens never contain NUL (tokenizers split on whitespace and control bytes)


class PayloadError(ValueError):
    """A body does not have the layout its head promises."""


def encode_words(keys: np.ndarray, words: list[str]) -> bytes:
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    if len(keys) != len(words):
        raise ValueError("one word per key")
    return struct.pack("<I", len(keys)) + keys.tobytes() + _SEP.join(w.encode("utf-8") for w in words)


def decode_words(body: bytes) -> tuple[np.ndarray, list[str]]:
    if len(body) < 4:
        raise PayloadError("words body shorter than its header")
    (n,) = struct.unpack_from("<I", body)
    end = 4 + 8 * n
    if len(body) < end:
        raise PayloadError(f"words body announces {n} keys but is {len(body)} bytes")
    keys = np.frombuffer(body, dtype=np.uint64, count=n, offset=4)
    words = body[end:].split(_SEP) if n else []
    if len(words) != n:
        raise PayloadError(f"{n} keys but {len(words)} words")
    try:
        return keys, [w.decode("utf-8") for w in words]
    except UnicodeDecodeError as exc:
        raise PayloadError(f"word is not UTF-8: {exc}") from None


def _encode_two_and_keys(first: int, second: int, keys: np.ndarray) -> bytes:
    """Two unsigned 64-bit numbers, then 8-byte keys: the layout of the trainable and changed-rows answers."""
    return struct.pack("<QQ", first, second) + np.ascontiguousarray(keys, dtype=np.uint64).tobytes()


def _decode_two_and_keys(body: bytes, what: str) -> tuple[int, int, np.ndarray]:
    if len(body) < 16 or (len(body) - 16) % 8:
        raise PayloadError(f"{what} body of {len(body)} bytes is not a 16-byte header and 8-byte keys")
    first, second = struct.unpack_from("<QQ", body)
    return first, second, np.frombuffer(body, dtype=np.uint64, offset=16)


def encode_trainable(generation: int, position: int, keys: np.ndarray) -> bytes:
    """The answer to ``HEAD_TRAINABLE_SINCE``: the journal's generation, the next position, the keys."""
    return _encode_two_and_keys(generation, position, keys)


def decode_trainable(body: bytes) -> tuple[int, int, np.ndarray]:
    return _decode_two_and_keys(body, "trainable")


def encode_changed_rows(epoch: int, version: int, keys: np.ndarray) -> bytes:
    """The answer to ``HEAD_CHANGED_ROWS``: the shard's epoch and version, then the keys changed since the version
    asked (none when the epoch asked is not the shard's: after a restart or a rollback the worker reloads anyway)."""
    return _encode_two_and_keys(epoch, version, keys)


def decode_changed_rows(body: bytes) -> tuple[int, int, np.ndarray]:
    return _decode_two_and_keys(body, "changed-rows")


def encode_changes(*, epoch: int, version: int, full: bool, keys: np.ndarray, words: list[str],
                   vectors: np.ndarray, counts: np.ndarray, removed: np.ndarray) -> bytes:
    n, dim = (vectors.shape if vectors.ndim == 2 else (0, 0))
    header = orjson.dumps({"epoch": epoch, "version": version, "full": full, "n": int(n), "dim": int(dim),
                           "removed": int(len(removed))})
    parts = [struct.pack("<I", len(header)), header,
             np.ascontiguousarray(keys, dtype=np.uint64).tobytes(),
             np.ascontiguousarray(vectors, dtype=np.float32).tobytes(),
             np.ascontiguousarray(counts, dtype=np.int64).tobytes(),
             np.ascontiguousarray(removed, dtype=np.uint64).tobytes(),
             _SEP.join(w.encode("utf-8") for w in words)]
    return b"".join(parts)


def decode_changes(body: bytes) -> dict:
    """The fields of ``encode_changes`` as numpy arrays (views over ``body``)."""
    try:
        (hlen,) = struct.unpack_from("<I", body)
        header = orjson.loads(body[4:4 + hlen])
        n, dim, m = int(header["n"]), int(header["dim"]), int(header["removed"])
        off = 4 + hlen
        keys = np.frombuffer(body, np.uint64, n, off)
        off += 8 * n
        vectors = np.frombuffer(body, np.float32, n * dim, off).reshape(n, dim)
        off += 4 * n * dim
        counts = np.frombuffer(body, np.int64, n, off)
        off += 8 * n
        removed = np.frombuffer(body, np.uint64, m, off)
        off += 8 * m
        words = [w.decode("utf-8") for w in body[off:].split(_SEP)] if n else []
    except (struct.error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PayloadError(f"malformed changes body: {exc}") from None
    if len(words) != n:
        raise PayloadError(f"{n} rows but {len(words)} words")
    return {**header, "keys": keys, "vectors": vectors, "counts": counts, "removed": removed, "words": words}
