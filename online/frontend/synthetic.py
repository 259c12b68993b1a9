"""A model source that changes like a training model, without training.

For the query-load benchmark (a 100k x 100 model whose rows keep changing while it is
queried), for the page's browser test, and for trying the front end without a cluster::

    livevec frontend --source online.frontend.synthetic:create_source

Words are clustered: the topic words and planted pairs of ``online.stream.sample_corpus`` are
each other's neighbours (``paris`` -> ``france``), then ``w0``, ``w1``, ... fill the
vocabulary in random clusters. Every call moves ``update_rows_per_second`` rows a little
and adds ``new_words_per_second`` words, stamping each changed row with the new version,
as an ``EmbeddingShard`` does; training statistics are invented but plausible.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numba import njit

from online.cluster.training_signal import summarise_reports
from online.search.delta import ModelDelta
from online.search.snapshot_writer import full_load_buffer
from online.stream.sample_corpus import PLANTED_PAIRS, TOPICS
from online.learner.keys import word_keys
from online.learner.settings import MODEL
from ps_bridge.settings import Setting, SettingGroup


_PIECE = 8192             # rows per compiled call (each lets go of the GIL)


_IRWIN_HALL_MEAN = 2.0 * 65535.0
_IRWIN_HALL_SD = (4.0 * (65536.0 ** 2 - 1.0) / 12.0) ** 0.5


@njit(nogil=True, cache=True, inline="always")
def _normal(seed, row, step, t):
    """About N(0, 1), depending only on (seed, row, step, t), so that no row has to be stored to be
    produced again: one splitmix64 hash, its four 16-bit quarters summed (Irwin-Hall; a benchmark's
    clusters need no better tails) and standardised."""
    x = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(row) * np.uint64(0xBF58476D1CE4E5B9)
         + np.uint64(step) * np.uint64(0x94D049BB133111EB) + np.uint64(t) * np.uint64(0xD6E8FEB86659FD93))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    m = np.uint64(0xFFFF)
    total = (x & m) + ((x >> np.uint64(16)) & m) + ((x >> np.uint64(32)) & m) + (x >> np.uint64(48))
    return (np.float64(total) - _IRWIN_HALL_MEAN) / _IRWIN_HALL_SD


@njit(nogil=True, cache=True)
def _rows(seed, rows, named, centres, which, steps, out):
    """Row ``rows[i]``'s vector into ``out[i]``: the named words' vectors (rows below
    ``len(named)``) or its cluster's centre plus 0.5 N(0, 1), and after s training steps of
    0.05 N(0, 1) each a displacement of the same spread, 0.05 sqrt(s) N(0, 1)."""
    d = out.shape[1]
    base = np.empty(d)
    for i in range(len(rows)):
        r = rows[i]
        s = steps[r]
        if r < len(named):
            base[:] = named[r]
        else:
            c = which[r]
            for t in range(d):          # no branch inside, so the hashes vectorise
                base[t] = centres[c, t] + 0.5 * _normal(seed, r, 0, t)
        if s:
            walk = 0.05 * math.sqrt(s)
            for t in range(d):
                out[i, t] = base[t] + walk * _normal(seed, r, s, t)
        else:
            for t in range(d):
                out[i, t] = base[t]


class _Names(Sequence):
    """Row -> word, computed: the named words, then ``w0``, ``w1``, ..., then ``new0``, ``new1``, ... A list
    of 10M strings would be 0.65 GB of the front end's process that one fed by the servers never holds."""

    def __init__(self, named: list[str], rest: int):
        self.named, self.rest, self.added = named, rest, 0

    def __len__(self) -> int:
        return len(self.named) + self.rest + self.added

    def __getitem__(self, r):
        if isinstance(r, slice):
            lo, hi, step = r.indices(len(self))
            if step != 1:
                return [self[i] for i in range(lo, hi, step)]
            return self._span(lo, hi)
        if r < 0:
            r += len(self)
        if not 0 <= r < len(self):
            raise IndexError("row out of range")
        if r < len(self.named):
            return self.named[r]
        r -= len(self.named)
        return f"w{r}" if r < self.rest else f"new{r - self.rest}"

    def _span(self, lo: int, hi: int) -> list[str]:
        """Rows ``lo..hi-1`` in one list, part by part (a full load asks for all 10M: one ``__getitem__``
        per row took 6 s of it)."""
        named, rest = len(self.named), self.rest
        out = self.named[lo:min(hi, named)]
        a, b = max(lo, named) - named, min(hi, named + rest) - named
        out += ["w" + str(i) for i in range(a, b)] if b > a else []
        a, b = max(lo, named + rest) - named - rest, hi - named - rest
        out += ["new" + str(i) for i in range(a, b)] if b > a else []
        return out


class SyntheticSource:
    """Its rows are computed, not stored (``_rows``): the source lives in the front end's process
    (the query-load bench), and a float32 copy of a 10M-word model would be 4 GB of that process's
    memory that a front end fed by the parameter servers never holds."""

    def __init__(self, n: int = 10_000, dim: int = 100, *, update_rows_per_second: float = 0.0,
                 new_words_per_second: float = 0.0, clusters: int = 200, seed: int = 0,
                 words_per_second: float = 250_000.0):
        self.dim = dim
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.update_rows_per_second = update_rows_per_second
        self.new_words_per_second = new_words_per_second
        self.nominal_wps = words_per_second
        words: list[str] = []
        vectors: list[np.ndarray] = []
        for members in TOPICS.values():
            centre = self.rng.standard_normal(dim)
            for w in members:
                words.append(w)
                vectors.append(centre + 0.35 * self.rng.standard_normal(dim))
        for a, b in PLANTED_PAIRS:
            centre = self.rng.standard_normal(dim)
            words += [a, b]
            vectors += [centre + 0.05 * self.rng.standard_normal(dim), centre + 0.05 * self.rng.standard_normal(dim)]
        self.named = np.asarray(vectors, np.float64).reshape(len(words), dim)
        self.centres = self.rng.standard_normal((clusters, dim))
        rest = max(0, n - len(words))
        total = len(words) + rest
        self.which = np.zeros(total, np.int32)
        self.which[len(words):] = self.rng.integers(0, clusters, rest)
        self.words = _Names(words, rest)
        self.keys = word_keys(self.words[:])      # one list: 10M __getitem__ calls took 8 s more
        self.counts = np.sort(self.rng.zipf(1.3, len(self.words)).astype(np.int64) % 10_000_000)[::-1].copy()
        self.row_version = np.ones(len(self.words), dtype=np.int64)
        self.steps = np.zeros(len(self.words), dtype=np.int32)
        self.version = 1
        self.started = self._last_step = time.monotonic()
        self.words_trained = 0.0
        self._added = 0
        self._lock = asyncio.Lock()

    def vectors_of(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        out = np.empty((len(rows), self.dim), np.float32) if out is None else out
        for lo in range(0, len(rows), _PIECE):
            _rows(self.seed, rows[lo:lo + _PIECE], self.named, self.centres, self.which, self.steps, out[lo:lo + _PIECE])
        return out

    @property
    def vectors(self) -> np.ndarray:
        """Every row's vector (a new array; for tests)."""
        return self.vectors_of(np.arange(len(self.words), dtype=np.int64))

    def _step(self) -> None:
        now = time.monotonic()
        dt = now - self._last_step
        self._last_step = now
        n = len(self.words)
        changed = min(n, int(round(self.update_rows_per_second * dt)))
        fresh = int(round(self.new_words_per_second * dt))
        if not changed and not fresh:
            return
        self.version += 1
        if changed:
            rows = self.rng.choice(n, changed, replace=False) if changed * 8 > n else \
                np.unique(self.rng.integers(0, n, changed))      # (a choice without replacement permutes all n)
            self.steps[rows] += 1
            self.counts[rows] += 1
            self.row_version[rows] = self.version
        if fresh:
            n = len(self.words)
            new_words = [f"new{self._added + i}" for i in range(fresh)]
            self._added += fresh
            if n + fresh > len(self.keys):             # grow by doubling, not by one copy per new word
                cap = max(2 * len(self.keys), n + fresh)
                for name in ("keys", "counts", "row_version", "steps", "which"):
                    old = getattr(self, name)
                    grown = np.zeros((cap,) + old.shape[1:], dtype=old.dtype)
                    grown[:n] = old[:n]
                    setattr(self, name, grown)
            self.words.added += fresh
            self.which[n:n + fresh] = self.rng.integers(0, len(self.centres), fresh)
            self.keys[n:n + fresh] = word_keys(new_words)
            self.counts[n:n + fresh] = 1
            self.row_version[n:n + fresh] = self.version

    def _changes_since(self, version: int) -> ModelDelta:
        self._step()
        n = len(self.words)
        if version <= 0 or version > self.version:      # the whole model
            return ModelDelta(self.keys[:n], self.words[:n],
                              self.vectors_of(np.arange(n, dtype=np.int64), full_load_buffer(n, self.dim)),
                              self.counts[:n], self.version, full=True)
        elif version == self.version:
            return ModelDelta.unchanged(version, self.dim)
        rows = np.flatnonzero(self.row_version[:n] > version)
        return ModelDelta(self.keys[rows], [self.words[r] for r in rows.tolist()], self.vectors_of(rows),
                          self.counts[rows], self.version)

    async def changes_since(self, version: int) -> ModelDelta:
        async with self._lock:
            return await asyncio.to_thread(self._changes_since, version)

    async def stats(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        wps = self.nominal_wps * (1.0 + 0.25 * math.sin(elapsed / 4.0) + 0.05 * float(self.rng.standard_normal()))
        self.words_trained += wps * max(0.0, elapsed - getattr(self, "_stats_elapsed", 0.0))
        self._stats_elapsed = elapsed
        return {"source": "synthetic", "words_trained": int(self.words_trained), "words_per_second": round(wps, 1),
                "vocab_size": len(self.words), "kafka_lag": int(5000 + 4000 * math.sin(elapsed / 7.0)),
                "updated_at": time.time(), "synthetic": True, "training": self._training(elapsed, wps)}

    def _training(self, elapsed: float, wps: float) -> dict[str, Any] | None:
        """A healthy worker's training signal (``online.cluster.training_signal``): the loss falls from
        about 4 towards 2, the hot rows grow from about 1 towards 3."""
        learnt = 1.0 - math.exp(-elapsed / 120.0)
        noise = 0.03 * float(self.rng.standard_normal())
        hot = {kind: {"mean": round(base * (0.4 + 0.6 * learnt), 4), "max": round(1.7 * base * (0.4 + 0.6 * learnt), 4)}
               for kind, base in (("input", 2.4), ("output", 3.1))}
        report = {"loss": round(4.0 - 1.9 * learnt + noise, 4), "loss_pairs": int(wps * 5 * 30 / 32),
                  "nonfinite_batches": 0, "window_seconds": 30.0, "hot_rows": {"words": 100, "nonfinite": 0, **hot}}
        return summarise_reports([{"node": 9, "training": report}])


SYNTHETIC = SettingGroup("synthetic model source", (
    Setting("n", "LIVEVEC_SYNTHETIC_WORDS", int, 10_000, minimum=100, flags=(), help="words in the model"),
    MODEL["dim"].replace(flags=()),
    Setting("update_rows_per_second", "LIVEVEC_SYNTHETIC_UPDATES", float, 1000.0, minimum=0.0, flags=(),
            help="rows changed per second, as training would"),
    Setting("new_words_per_second", "LIVEVEC_SYNTHETIC_NEW_WORDS", float, 2.0, minimum=0.0, flags=(),
            help="words added per second"),
    Setting("seed", "LIVEVEC_SYNTHETIC_SEED", int, 0, minimum=0, flags=()),
))


def create_source(settings, env: Mapping[str, str]) -> SyntheticSource:
    """Factory for ``--source online.frontend.synthetic:create_source`` (sizes from LIVEVEC_SYNTHETIC_*)."""
    return SyntheticSource(**SYNTHETIC.read(None, env))
