"""One version of the model as the search index holds it: the rows, their codes and maps, words, keys, counts.

A ``Snapshot`` never changes once built. ``snapshot_writer`` writes the next one from a delta, and
``model_index.ModelIndex`` is the snapshot that answers queries. This module holds what both read: the
arrays of one version (views of the lineage's ``row_store``, read-only) and the reads of rows, words
and keys.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from online.search import int8_prefilter
from online.search import ivf as ivf_lists
from online.search.word_lookup import AlphaIndex, KeyIndex, WordArena, WordsView
from online.learner.keys import word_key

SEARCH_MODES = ("auto", "exact")


@dataclass(frozen=True)
class SearchConfig:
    """How queries are answered (``LIVEVEC_SEARCH``, ``LIVEVEC_IVF_*``)."""

    search: str = "auto"           # auto: the inverted file once built on a large model; exact: always exact
    ivf_min_rows: int = 100_000    # smallest model that gets an inverted file
    ivf_lists: int = 0             # lists; 0 = sqrt(rows)
    ivf_nprobe: int = 32           # lists a query scans
    # An ivf answer whose k-th cosine is below this is redone exactly (0: never). A weak
    # neighbourhood (an undertrained rare word: its top k is a near-tie) is scattered over lists
    # that rank far down for the query, and no per-list bound cheap enough to check rules those
    # lists out in 100 dimensions (bench/ivf_recall.py). The k-th score is the best predictor of a
    # miss measured, but where to cut depends on the model (0.51 on one-epoch CBOW vectors, 0.70
    # on skip-gram ones, nothing on the synthetic clusters), so with ``ivf_exact_below_auto`` the
    # recall monitor sets it from what it measures (``ivf_build.RecallMonitor.floor``); this is
    # the value until it has enough samples.
    ivf_exact_below: float = 0.55
    ivf_exact_below_auto: bool = True
    # With the floor's calibration, the monitor may also have queries scan fewer lists than ``ivf_nprobe``
    # (``ivf_build.RecallMonitor.choose``): ``nprobe_served`` (0: ``ivf_nprobe``).
    ivf_nprobe_auto: bool = True
    nprobe_served: int = 0

    @classmethod
    def of(cls, settings) -> "SearchConfig":
        """The search part of a ``FrontendSettings``."""
        return cls(settings.search, settings.ivf_min_rows, settings.ivf_lists, settings.ivf_nprobe,
                   settings.ivf_exact_below, settings.ivf_exact_below_auto, settings.ivf_nprobe_auto)

    @property
    def nprobe(self) -> int:
        """Lists a query scans now."""
        return min(self.nprobe_served, self.ivf_nprobe) if self.nprobe_served > 0 else self.ivf_nprobe


class Snapshot:
    """One immutable version of the model's rows.

    Rows 0..n-1 are the vocabulary (``words``, ``keys``, ``counts``, ``unit`` and ``norms``
    in row order). Words are found through their keys (``word_key`` then a binary search,
    ``word_lookup.KeyIndex``), so no per-word dict is copied per sync. The constructor is the
    writer's (``snapshot_writer``); ``empty`` is the model before its first delta.
    """

    def __init__(self, version: int, store, buffer, n: int, n_tiles: int, keys_all: np.ndarray,
                 words_all: WordArena, counts: np.ndarray, key_index: KeyIndex, alpha: AlphaIndex,
                 ivf: ivf_lists.IvfLists | None = None, bad_rows: int = 0, updated_at: float | None = None,
                 config: SearchConfig | None = None, ivf_next: ivf_lists.IvfLists | None = None):
        self.version = int(version)
        self.store = store
        self._buffer = buffer
        self.config = config if config is not None else (store.config if store is not None else SearchConfig())
        self.n_tiles = int(n_tiles)
        slots = self.n_tiles * int8_prefilter.TILE_ROWS
        self.keys = keys_all[:n]
        self.words = WordsView(words_all, n)
        self._n = int(n)
        self.counts = counts
        if buffer is None:
            dim = 0
            self._pool, self.norms = np.zeros((0, 0), np.float32), np.zeros(0, np.float32)
            self.row_phys = np.zeros(0, np.int64)
            self.row_slot, self.slot_row = np.zeros(0, np.int64), np.zeros(0, np.int64)
            self.codes, self.code_scale, self.code_error, self.code_sum = int8_prefilter.quantise(self._pool)
            self.tile_err = np.zeros(0, np.float32)
        else:
            dim = buffer.dim
            # row r's unit vector is _pool[row_phys[r]] (row_store: one copy, written out of place);
            # unit * norms = the vectors
            self._pool, self.row_phys, self.norms = buffer.pool_array.view(), buffer.row_phys[:n], buffer.norms[:n]
            self.row_slot, self.slot_row = buffer.row_slot[:n], buffer.slot_row[:slots]
            # int8 copy of unit in the kernel's packed layout, by slot (row order without an
            # inverted file, list by list with one); per slot: scale, |x - x_hat|, code sum
            cs = buffer.code_store            # one copy: a sync writes only slots this snapshot does not file
            self.codes = cs.codes[:self.n_tiles]
            self.code_scale, self.code_error = cs.scale[:slots], cs.error[:slots]
            self.code_sum, self.tile_err = cs.csum[:slots], cs.tile_err[:self.n_tiles]
        self._dim = dim
        self.key_index, self.alpha = key_index, alpha
        self.ivf = ivf
        # while new lists are installed over old ones: the rows moved so far (``ivf`` files the rest)
        self.ivf_next = ivf_next
        self.bad_rows = bad_rows
        self.updated_at = time.time() if updated_at is None else updated_at
        for a in (self.keys, self.counts, self._pool, self.row_phys, self.norms, self.row_slot, self.slot_row, self.codes,
                  self.code_scale, self.code_error, self.code_sum, self.tile_err):
            a.flags.writeable = False

    @classmethod
    def empty(cls, config: SearchConfig | None = None) -> "Snapshot":
        return cls(0, None, None, 0, 0, np.zeros(0, np.uint64), WordArena(), np.zeros(0, np.int64),
                   KeyIndex.build(np.zeros(0, np.uint64)), AlphaIndex.build([]), updated_at=0.0,
                   config=config or SearchConfig())

    def rows_of_keys(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, -1 where absent (vectorised binary search)."""
        return self.key_index.rows_of(keys)

    # ----------------------------------------------------------------- reading
    @property
    def n(self) -> int:
        return self._n

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def alpha_words(self) -> list[str]:
        """Every word in alphabetical order (O(n); for tests and scripts)."""
        return self.alpha.words()

    @property
    def alpha_rows(self) -> np.ndarray:
        return self.alpha.rows()

    def unit_rows(self, rows) -> np.ndarray:
        """The unit vectors of ``rows`` (a new [len(rows), dim] array; ``unit_row`` for one)."""
        return self._pool[self.row_phys[np.asarray(rows, dtype=np.int64)]]

    def unit_row(self, row: int) -> np.ndarray:
        """Row ``row``'s unit vector (a copy: a view would outlive the snapshot, and the pool reuses
        a row once no snapshot reads it)."""
        return self._pool[self.row_phys[row]].copy()

    @property
    def unit(self) -> np.ndarray:
        """All unit vectors in row order (a new array, O(n): for scripts and tests, not the query path)."""
        return self._pool[self.row_phys]

    def vector(self, row: int) -> np.ndarray:
        """The vector of ``row`` as the source sent it (to float32 rounding)."""
        return self.unit_row(row) * self.norms[row]

    @property
    def vectors(self) -> np.ndarray:
        """All vectors (a new array; for scripts and tests, not the query path)."""
        return self.unit * self.norms[:, None]

    def _row_of_word(self, word: str) -> int:
        if not self.n:
            return -1
        r = int(self.rows_of_keys(np.array([word_key(word)], dtype=np.uint64))[0])
        return r if r >= 0 and self.words[r] == word else -1

    def row(self, word: str) -> int:
        """Row of ``word`` (exact, else its lower-case form), or -1."""
        r = self._row_of_word(word)
        if r < 0:
            lower = word.lower()
            if lower != word:
                r = self._row_of_word(lower)
        return r

    def prefix(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` words starting with ``prefix``, most frequent first (then alphabetical)."""
        return self.alpha.prefix(prefix, limit, self.counts, self.words)

    def prefix_total(self, prefix: str) -> int:
        return self.alpha.total(prefix)
