"""What is new in the served model: words that arrived, words whose counts rise, words whose meaning drifted.

The sources keep no history (a server knows its rows and counts now, not an hour ago), so the front end
records its own, from the snapshots it serves. ``WhatsNew.observe`` looks at ``ModelHolder.current`` once
per sync interval (a background task) and at the start of every request, so an answer always describes
the model being served:

arrivals (``/v1/new``)
    The keys of the served snapshot that the previously observed one lacked, with the time they were
    first served. A word reaches the front end when it becomes trainable (``min_count``) and the next
    sync brings its row, so ``first_seen`` is that moment, to within one sync interval. The words of the
    first snapshot have no arrival time (``observed_since``); a word evicted and admitted again arrives
    again. Kept in a ring of at most ``LIVEVEC_NEW_WORDS_KEEP`` keys, oldest forgotten first.
count samples (``/v1/rising``)
    Every ``LIVEVEC_RISING_INTERVAL`` seconds, a sample of the served snapshot's counts, kept as the rows
    that changed before the next sample (``count_samples``). At most ``LIVEVEC_RISING_SAMPLES + 1`` are
    kept, so a window reaches back ``interval x samples`` seconds. Samples stay aligned with the rows of
    the latest snapshot (rows only get appended between syncs); after a removal or a full reload they are
    re-indexed once by key. The rise of a word over a window is its count now minus its count in the
    newest sample at least ``window`` seconds old.
checkpoints (``/v1/drift``)
    The first snapshot, then every ``LIVEVEC_DRIFT_INTERVAL`` seconds a compact copy of the served
    snapshot (none while the model is unchanged): its words and keys by reference and its unit vectors in
    float16, so a checkpoint costs 2 dim + 20 bytes per word, not the 5 dim + 40 of a ``ModelIndex`` with
    its int8 search copy (a 1M x 100 model: 220 MB, not 540). At most ``LIVEVEC_DRIFT_KEEP`` are kept,
    numbered 1, 2, ... from the front end's start: the front end's own, not the cluster's coordinated
    checkpoints; their rows on local disk (``LIVEVEC_DRIFT_DIR``), or in memory. A word's drift is its k
    nearest neighbours now against those in a checkpoint: overlap@k and the words that entered and left.
    Neighbours now are exact (as ``/v1/similar``), then exact over the float16 vectors (scores within about
    1e-3). ``oldest`` is the oldest kept, ``previous`` the newest that differs from the served model. A word
    that arrived after the checkpoint has no neighbours there: all of them entered (``in_checkpoint`` false).

Cost bounds. Memory, all of it fixed by the settings: arrivals 8 bytes per remembered key; samples 16
bytes per row that changed before the next sample (the newest is the served counts array itself);
checkpoints ``2 dim + 20`` bytes per word each: about 420 bytes per word at dim 100 with the default 2
(``LIVEVEC_DRIFT_KEEP=0`` keeps none), the ``2 dim`` of the vectors on disk unless kept in memory. Time
per observation with a change: one comparison of the key arrays (about 1 ms per million words), O(n log n)
only after a removal or a full reload (as ``apply`` pays anyway), per sample or checkpoint one pass. Requests: ``new`` O(a log n) for a arrivals; ``rising`` one vectorised pass over the vocabulary; ``drift``
two exact top-k searches (the checkpoint's in blocks of ``_BLOCK`` rows). ``limit`` is at most ``MAX_LIMIT``.
"""
from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from online.frontend.count_samples import CountSamples
from online.search.model_index import ModelHolder, ModelIndex, Neighbour
from online.learner.keys import word_key
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend.whats_new")

MAX_LIMIT = 1000
RANKINGS = ("rise", "lift")
_BLOCK = 65_536              # checkpoint rows scored at once (a 25 MB float32 temporary at dim 100)


class HistoryLookupError(LookupError):
    """What was asked for is not in the history (an unknown word or checkpoint): a 404."""

    def __init__(self, code: str, message: str, **extra: Any):
        super().__init__(message)
        self.code, self.message, self.extra = code, message, extra


class Stale(RuntimeError):
    """The served model's rows were renumbered while a checkpoint was copied from it."""


class PastModel:
    """What ``drift`` needs of a past snapshot: words and keys (by reference), float16 unit vectors and
    their norms after the rounding (so that scores are cosines of the stored vectors).

    With ``directory`` the float16 rows go to a file there, unlinked as soon as it is open (the open
    descriptor keeps it until this object goes; a crash leaves nothing), and are read back with
    ``pread`` a block at a time: no mapping, so a drift query's scan adds nothing to the process's
    resident memory. Without, they are an array in memory."""

    def __init__(self, index: ModelIndex | Callable[[], ModelIndex], directory: str | os.PathLike | None = None):
        """From ``index``, or block by block from the snapshot ``index()`` serves at that moment: a copy of
        10M rows takes half a minute, and a snapshot held that long keeps its rows and buffer from the
        syncs' reuse (``row_store``: rows retired meanwhile pile up, until the pool grows by half). Read so,
        the vectors are the served model's over the copy's duration. ``Stale`` if the rows were renumbered
        meanwhile (a full reload, a removal)."""
        current = index if callable(index) else (lambda held=index: held)
        index = current()
        self.version = index.version
        self.words = index.words
        self.keys = index.keys
        self._dim = index.dim
        self.served = weakref.ref(index)
        store = index.store
        del index
        self._fd: int | None = None
        self.unit: np.ndarray | None = None
        norms = np.empty(self.n, np.float32)
        if directory is None:
            self.unit = np.empty((self.n, self._dim), np.float16)
        else:
            fd, path = tempfile.mkstemp(prefix="livevec-drift-", suffix=".f16", dir=directory)
            os.unlink(path)
            self._fd = fd
            self._finalizer = weakref.finalize(self, os.close, fd)
        for start in range(0, self.n, _BLOCK):      # in blocks: no float32 copy of the whole model
            index = current()
            if index.store is not store:
                raise Stale("the model was reloaded while its drift checkpoint was copied")
            block = index.unit_rows(np.arange(start, min(self.n, start + _BLOCK))).astype(np.float16)
            del index
            norms[start:start + len(block)] = np.linalg.norm(block.astype(np.float32), axis=1)
            if self.unit is not None:
                self.unit[start:start + len(block)] = block
            else:
                data = memoryview(block).cast("B")
                offset = start * self._row_bytes
                while data:
                    written = os.pwrite(fd, data, offset)
                    data, offset = data[written:], offset + written
        self.inverse_norms = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)

    @property
    def _row_bytes(self) -> int:
        return 2 * self._dim

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Rows start..stop-1 as float32 (from memory, or read from the file)."""
        if self.unit is not None:
            return self.unit[start:stop].astype(np.float32)
        want = (stop - start) * self._row_bytes
        buf = bytearray(want)
        got = os.preadv(self._fd, [buf], start * self._row_bytes)
        if got != want:
            raise OSError(f"drift checkpoint file: read {got} of {want} bytes")
        return np.frombuffer(buf, np.float16).reshape(stop - start, self._dim).astype(np.float32)

    def vector(self, row: int) -> np.ndarray:
        """The unit vector of ``row`` (float32, renormalised after the rounding to float16)."""
        return self._rows(row, row + 1)[0] * self.inverse_norms[row]

    @property
    def n(self) -> int:
        return len(self.words)

    @property
    def dim(self) -> int:
        return self._dim

    def memory_bytes(self) -> int:
        return int((self.unit.nbytes if self.unit is not None else 0) + self.inverse_norms.nbytes)

    def disk_bytes(self) -> int:
        return 0 if self.unit is not None else self.n * self._row_bytes

    def row(self, word: str) -> int:
        """Row of exactly ``word`` (a scan of the keys: one per request, about 1 ms per million words)."""
        hits = np.flatnonzero(self.keys == np.uint64(word_key(word)))
        return next((int(r) for r in hits if self.words[r] == word), -1)

    def neighbours(self, row: int, k: int) -> list[Neighbour]:
        """Exact top k by cosine over the float16 vectors, the word itself left out; ties by row."""
        query = self.vector(row)
        scores = np.empty(self.n, dtype=np.float32)
        for start in range(0, self.n, _BLOCK):
            stop = min(self.n, start + _BLOCK)
            scores[start:stop] = self._rows(start, stop) @ query
        scores *= self.inverse_norms
        scores[row] = -np.inf
        top = _top(scores, min(k, self.n - 1))
        return [Neighbour(self.words[r], round(float(scores[r]), 6)) for r in top.tolist()]


@dataclass(frozen=True)
class DriftCheckpoint:
    """A past model kept for ``/v1/drift`` to compare a word's neighbours against."""
    id: int
    taken_at: float
    model: PastModel
    served: weakref.ref          # the ModelIndex it was taken from, while that is alive

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "taken_at": round(self.taken_at, 3), "version": self.model.version,
                "vocab_size": self.model.n}


def _rounded(t: float | None) -> float | None:
    return None if t is None else round(t, 3)


def _top(score: np.ndarray, limit: int) -> np.ndarray:
    """Positions of the ``limit`` largest scores, best first, ties by position (no full sort)."""
    if limit <= 0:
        return np.zeros(0, dtype=np.int64)
    if len(score) > limit:
        kth = np.partition(score, len(score) - limit)[len(score) - limit]
        candidates = np.flatnonzero(score >= kth)
    else:
        candidates = np.arange(len(score))
    return candidates[np.lexsort((candidates, -score[candidates]))][:limit]


def _same_start(longer: np.ndarray, shorter: np.ndarray) -> bool:
    """Whether ``shorter`` is a view of the start of ``longer``'s memory (keys are only ever appended)."""
    return not len(shorter) or (longer.__array_interface__["data"][0] == shorter.__array_interface__["data"][0]
                                and longer.strides == shorter.strides)


def _neighbours(index: ModelIndex, row: int, k: int) -> list[Neighbour]:
    query = np.ascontiguousarray(index.unit_row(row)[None, :], dtype=np.float32)
    return index.top_k(query, [[row]], [k])[0]


class WhatsNew:
    """The front end's history of the served model and the answers computed from it (thread-safe)."""

    def __init__(self, holder: ModelHolder, *, new_words_keep: int = 100_000, rising_interval: float = 30.0,
                 rising_samples: int = 30, drift_interval: float = 600.0, drift_keep: int = 2,
                 drift_dir: str | os.PathLike | None = None, clock: Callable[[], float] = time.time):
        self.holder = holder
        self.new_words_keep = int(new_words_keep)
        self.rising_interval = float(rising_interval)
        self.rising_samples = int(rising_samples)
        self.drift_interval = float(drift_interval)
        self.drift_keep = int(drift_keep)
        self.drift_dir = drift_dir
        self.clock = clock
        self._lock = threading.Lock()
        # The latest snapshot observed, by weak reference: holding a ModelIndex would keep its row
        # buffer from being reused by the next sync (row_store). Its keys (never in those buffers,
        # only ever appended to) are all the diff needs; the samples follow its rows.
        self._last: weakref.ref | None = None
        self._last_keys: np.ndarray | None = None
        self._last_at = 0.0
        self.observed_since: float | None = None       # when the first snapshot was observed
        self._arrivals: deque[tuple[float, np.ndarray]] = deque()   # (first served at, keys), oldest first
        self._remembered = 0
        self.forgotten_until: float | None = None      # arrivals up to this time were dropped from the ring
        self._samples = CountSamples(self.rising_samples + 1)
        self._checkpoints: deque[DriftCheckpoint] = deque(maxlen=self.drift_keep)
        self._checkpointing = False          # observe() is making one outside the lock
        self._next_id = 1

    @property
    def max_window(self) -> float:
        """The longest window ``rising`` answers in full: the span the kept samples cover."""
        return self.rising_interval * self.rising_samples

    # ------------------------------------------------------------ recording
    def observe(self, now: float | None = None) -> None:
        """Record what changed since the last look at the served snapshot (keeping no reference to it).

        A drift checkpoint copies every row (about 27 s at 10M words in a background thread), so it
        is made outside the lock (``/v1/stats`` reads the history's size on the event loop, and
        waiting for the lock stalled every request for that long) and holds no snapshot meanwhile."""
        with self._lock:
            index = self._observe(self.clock() if now is None else now, checkpoint=False)
            now = self._last_at
            due = index is not None and self._checkpoint_due(index, now)
            self._checkpointing |= due
        del index                       # the copy reads the served snapshot block by block (``PastModel``)
        if not due:
            return
        past = None
        try:
            past = PastModel(lambda: self.holder.current, self.drift_dir)
        except Stale as exc:            # taken at the next look
            log_event(log, "drift_checkpoint_skipped", reason=str(exc))
        finally:
            with self._lock:            # one step: no other look sees the flag down before it is filed
                self._checkpointing = False
                if past is not None:
                    self._checkpoints.append(DriftCheckpoint(self._next_id, now, past, past.served))
                    self._next_id += 1

    def _checkpoint_due(self, index: ModelIndex, now: float) -> bool:
        if not self.drift_keep or self._checkpointing:
            return False
        return not self._checkpoints or (now - self._checkpoints[-1].taken_at >= self.drift_interval
                                         and self._checkpoints[-1].served() is not index)

    def _observe(self, now: float, checkpoint: bool = True) -> ModelIndex | None:
        if not self.holder.loaded:
            return None
        index = self.holder.current
        now = max(now, self._last_at)          # times only go forward (the wall clock may step back)
        if self._last is None or self._last() is not index:
            if self._last_keys is None:
                self.observed_since = now
            else:
                self._follow(self._last_keys, index, now)
            self._last, self._last_keys = weakref.ref(index), index.keys
        self._last_at = now
        if not len(self._samples) or now - self._samples.times()[-1] >= self.rising_interval:
            self._samples.add(now, index.counts)
        if checkpoint and self._checkpoint_due(index, now):     # an answer that needs one: not the periodic look
            self._checkpoints.append(DriftCheckpoint(self._next_id, now, PastModel(index, self.drift_dir),
                                                     weakref.ref(index)))
            self._next_id += 1
        return index

    def _follow(self, old_keys: np.ndarray, new: ModelIndex, now: float) -> None:
        n_old = len(old_keys)
        new_keys = new.keys
        if len(new_keys) >= n_old and (_same_start(new_keys, old_keys) or np.array_equal(new_keys[:n_old], old_keys)):
            fresh = new_keys[n_old:]                     # rows kept, new ones appended: the usual sync
        else:                                            # a removal or a full reload moved rows
            order = np.argsort(old_keys, kind="stable")
            ordered = old_keys[order]
            pos = np.minimum(np.searchsorted(ordered, new_keys), n_old - 1)     # n_old >= 1 here
            rows_in_old = np.where(ordered[pos] == new_keys, order[pos], -1)
            fresh = new_keys[rows_in_old < 0]
            self._samples.remap(rows_in_old)
        if len(fresh):
            self._arrivals.append((now, fresh.copy()))   # a copy: a view would keep the whole key array alive
            self._remembered += len(fresh)
        while self._remembered > self.new_words_keep:
            t, oldest = self._arrivals[0]
            excess = self._remembered - self.new_words_keep
            if len(oldest) <= excess:
                self._arrivals.popleft()
                self._remembered -= len(oldest)
            else:
                self._arrivals[0] = (t, oldest[excess:].copy())
                self._remembered -= excess
            self.forgotten_until = t

    async def run(self, interval: float) -> None:
        """Observe every ``interval`` seconds until cancelled."""
        while True:
            try:
                await asyncio.to_thread(self.observe)
            except Exception as exc:    # a bug here must not stop the history, nor the front end
                log_event(log, "whats_new_observe_failed", logging.ERROR, error=repr(exc))
            await asyncio.sleep(interval)

    # -------------------------------------------------------------- answers
    def new_words(self, since: float, limit: int) -> dict[str, Any]:
        """Words first served at or after ``since`` (unix s) and still in the model, newest first."""
        with self._lock:
            now = self.clock()
            index = self._observe(now)
            chunks = []
            for t, keys in reversed(self._arrivals):
                if t < since:
                    break
                chunks.append((t, keys))
            observed_since, forgotten = self.observed_since, self.forgotten_until
        if index is None:
            raise HistoryLookupError("not_ready", "no model has been observed yet")
        if chunks:
            keys = np.concatenate([k for _, k in chunks])                  # newest first
            times = np.concatenate([np.full(len(k), t) for t, k in chunks])
            _, latest = np.unique(keys, return_index=True)                  # evicted and back: the last arrival
            keys, times = keys[latest], times[latest]
            rows = index.rows_of_keys(keys)
            present = rows >= 0
            rows, times = rows[present], times[present]
        else:
            rows, times = np.zeros(0, np.int64), np.zeros(0)
        counts = index.counts[rows]
        order = np.lexsort((rows, -counts, -times))[:limit]   # newest first, then most frequent
        complete = observed_since is not None and since >= observed_since \
            and (forgotten is None or since > forgotten)
        return {"version": index.version, "since": since, "now": round(now, 3),
                "observed_since": _rounded(observed_since), "complete": bool(complete), "total": int(len(rows)),
                "words": [{"word": index.words[r], "first_seen": round(float(t), 3), "count": int(c)}
                          for r, t, c in zip(rows[order].tolist(), times[order].tolist(), counts[order].tolist())]}

    def rising(self, window: float, limit: int, by: str = "rise") -> dict[str, Any]:
        """Words whose counts rose most over the last ``window`` seconds.

        ``by="rise"``: the largest increase. ``by="lift"``: the increase against what the
        word's share of the counts at the window's start predicts, ``(rise + 1) /
        (expected + 1)``, so a word used far more than usual beats a frequent one used as
        usual. Only words present at both ends and with a rise count; words that arrived
        within the window are ``new_words``.
        """
        if by not in RANKINGS:
            raise ValueError(f"by must be one of {RANKINGS}")
        with self._lock:
            now = self.clock()
            index = self._observe(now)
            chosen = None if index is None else self._samples.then(now - window, index.counts)
        if index is None or chosen is None:
            raise HistoryLookupError("not_ready", "no model has been observed yet")
        version, words, current = index.version, index.words, index.counts   # not its row buffers
        del index
        t_then, partial, moved, c_then, total_then = chosen
        total_then = max(total_then, 1)
        rise = current[moved] - c_then
        up = rise > 0                       # a rollback to a checkpoint can lower counts: not a rise
        rows, c_then, rise = moved[up], c_then[up], rise[up]
        expected = c_then / total_then * int(rise.sum())     # the rise the word's earlier share predicts
        lift = (rise + 1.0) / (expected + 1.0)
        score = rise.astype(np.float64) if by == "rise" else lift
        span = max(now - t_then, 1e-9)
        top = _top(score, limit)
        return {"version": version, "by": by, "window_seconds": window, "from": round(t_then, 3),
                "to": round(now, 3), "span_seconds": round(now - t_then, 3), "partial": partial,
                "words": [{"word": words[r], "count": int(current[r]), "count_then": int(c), "rise": int(d),
                           "per_second": round(d / span, 3), "lift": round(float(f), 3)}
                          for r, c, d, f in zip(rows[top].tolist(), c_then[top].tolist(), rise[top].tolist(),
                                                lift[top].tolist())]}

    def _checkpoint(self, spec: str, index: ModelIndex) -> DriftCheckpoint:
        kept = list(self._checkpoints)
        ids = [c.id for c in kept]
        if not kept:
            why = "LIVEVEC_DRIFT_KEEP is 0" if not self.drift_keep else "none has been taken yet"
            raise HistoryLookupError("unknown_checkpoint", f"the front end keeps no checkpoints ({why})",
                                     checkpoints=ids)
        if spec == "oldest":
            return kept[0]
        if spec == "previous":
            for c in reversed(kept):
                if c.served() is not index:
                    return c
            raise HistoryLookupError("unknown_checkpoint", "no checkpoint differs from the model being served yet "
                                     f"(one is taken every {self.drift_interval:g} s while it changes)",
                                     checkpoints=ids)
        if spec.isascii() and spec.isdigit() and len(spec) <= 18:
            for c in kept:
                if c.id == int(spec):
                    return c
        raise HistoryLookupError("unknown_checkpoint", f"no checkpoint {spec[:40]!r}: use 'oldest', 'previous' or "
                                 f"one of the ids kept: {ids}", checkpoints=ids)

    def drift(self, word: str, k: int, checkpoint: str = "oldest") -> dict[str, Any]:
        """``word``'s k nearest neighbours now against those in a checkpoint."""
        with self._lock:
            now = self.clock()
            index = self._observe(now)
            if index is None:
                raise HistoryLookupError("not_ready", "no model has been observed yet")
            cp = self._checkpoint(checkpoint, index)
        row = index.row(word)
        if row < 0:
            raise HistoryLookupError("unknown_word", f"not in the vocabulary (model version {index.version}): "
                                     f"{word[:100]!r}", unknown=[word])
        matched, version, vector = index.words[row], index.version, index.unit_row(row).copy()
        now_nb = _neighbours(index, row, k)
        del index                            # let go of the served snapshot's rows before the longer scan
        past = cp.model
        past_row = past.row(matched)
        then_nb = past.neighbours(past_row, k) if past_row >= 0 else []
        now_set, then_set = {n.word for n in now_nb}, {n.word for n in then_nb}
        shared = len(now_set & then_set)
        size = max(len(now_nb), len(then_nb))
        self_similarity = None
        if past_row >= 0 and past.dim == len(vector):
            self_similarity = round(float(np.dot(vector, past.vector(past_row))), 6)

        def listed(ns):
            return [{"word": n.word, "score": n.score} for n in ns]

        return {"word": matched, "k": k, "version": version,
                "checkpoint": {**cp.describe(), "age_seconds": round(now - cp.taken_at, 3)},
                "in_checkpoint": past_row >= 0, "overlap": round(shared / size, 6) if size else 1.0,
                "shared": shared, "self_similarity": self_similarity,
                "entered": listed(n for n in now_nb if n.word not in then_set),
                "left": listed(n for n in then_nb if n.word not in now_set),
                "now": listed(now_nb), "then": listed(then_nb)}

    def nbytes(self) -> int:
        """What the history holds: the drift checkpoints' rows, the rising samples and the arrivals. Read
        without the lock (from the event loop): copies of the deques, sizes only."""
        past = sum(c.model.memory_bytes() for c in list(self._checkpoints))
        return int(past + self._samples.nbytes() + sum(k.nbytes for _, k in list(self._arrivals)))

    def disk_bytes(self) -> int:
        """What the drift checkpoints hold on disk (``LIVEVEC_DRIFT_DIR``); without the lock, as ``nbytes``."""
        return self._disk_bytes()

    def _disk_bytes(self) -> int:
        return sum(c.model.disk_bytes() for c in list(self._checkpoints))

    def history(self) -> dict[str, Any]:
        """What the front end remembers: checkpoints, the samples' reach, the arrivals kept."""
        with self._lock:
            now = self.clock()
            index = self._observe(now)
            oldest = self._samples.times()[0] if len(self._samples) else None
            return {
                "now": round(now, 3), "version": None if index is None else index.version,
                "observed_since": _rounded(self.observed_since),
                "checkpoints": [c.describe() for c in self._checkpoints],
                "drift": {"interval_seconds": self.drift_interval, "keep": self.drift_keep,
                          "on_disk": self.drift_dir is not None,
                          "disk_bytes": self._disk_bytes()},
                "rising": {"interval_seconds": self.rising_interval, "samples": len(self._samples),
                           "keep": self.rising_samples, "max_window_seconds": self.max_window,
                           "oldest_sample_at": _rounded(oldest)},
                "new_words": {"remembered": self._remembered, "keep": self.new_words_keep,
                              "forgotten_until": _rounded(self.forgotten_until)},
            }
