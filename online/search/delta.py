"""What a model source hands the search index: the rows that changed since a version.

It lives with the index, not with the sources, because it is the one thing the index
accepts: every source (a word2vec file, a trainer, the parameter servers) produces it and
``ModelIndex.apply`` consumes it, so neither side needs the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_EMPTY_U64 = np.zeros(0, dtype=np.uint64)


@dataclass
class ModelDelta:
    """Rows to add or replace, keys to remove, and the version they bring the caller to."""

    keys: np.ndarray                  # uint64 [n] word keys (online.learner.keys.word_key)
    words: list[str]                  # [n]
    vectors: np.ndarray               # float32 [n, dim], the INPUT vectors
    counts: np.ndarray                # int64 [n]
    version: int                      # pass this to the next changes_since
    full: bool = False                # True: this is the whole model, replace the copy
    removed: np.ndarray = field(default_factory=lambda: _EMPTY_U64)   # uint64 keys to drop

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1]) if self.vectors.ndim == 2 else 0

    def __len__(self) -> int:
        return len(self.keys)

    def parts(self, max_rows: int, before: int) -> list["ModelDelta"]:
        """This delta as parts of at most ``max_rows`` rows, applied one after the other: the last brings
        ``version`` and the removals, the others keep ``before`` (the version they start from; a part
        applied and then lost is asked for again). A full model, or a delta that fits, is one part."""
        n = len(self)
        if self.full or n <= max_rows or max_rows <= 0:
            return [self]
        vectors = np.asarray(self.vectors)
        out = []
        for lo in range(0, n, max_rows):
            hi = min(n, lo + max_rows)
            last = hi == n
            out.append(ModelDelta(self.keys[lo:hi], self.words[lo:hi], vectors[lo:hi], self.counts[lo:hi],
                                  self.version if last else before,
                                  removed=self.removed if last else _EMPTY_U64))
        return out

    @classmethod
    def unchanged(cls, version: int, dim: int = 0) -> "ModelDelta":
        return cls(_EMPTY_U64, [], np.zeros((0, dim), np.float32), np.zeros(0, np.int64), version)


class ModelDeltaError(ValueError):
    """A delta from a source is malformed (wrong shapes, wrong dimension)."""
