"""Which rows a server lists to the replicas as changed (``HEAD_CHANGED_ROWS``): those the merges moved far.

Every replica refreshes the rows the servers list, so listing every row at every change makes each replica pull
what all the others changed, and its bytes in per token grow with the replicas. A row is listed only once the
deltas merged into it since it was last listed add up to ``LIVEVEC_LIST_THRESHOLD`` of its norm; the sum of the
deltas' norms is a bound on how far the merges moved it, one float a row, no copy of the row before the merge.
A row not listed yet is still fresh where it matters most: a replica that sends a delta of it gets the merged row
in the answer, and the other held rows are refreshed in turn (``LIVEVEC_REFRESH_SHARE``).

The front end's own change feed (``HEAD_CHANGES``) is not thinned: it reads the rows' version stamps.
Design: docs/design/0008-scalable-exchange.md
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ps_bridge.settings import Setting

LIST_THRESHOLD = Setting("list_threshold", "LIVEVEC_LIST_THRESHOLD", float, 0.2, minimum=0.0, maximum=10.0,
                         help="replica exchange, servers: a row is listed to the replicas as changed once the deltas "
                              "merged into it since it was last listed add up to this share of its norm "
                              "(0: at every change)")


@njit(nogil=True, cache=True)
def _moved(deltas, answer, rows, threshold, moved, listed, version):
    """Add each delta's norm to its row's ``moved``; rows that reach ``threshold`` of their norm are listed at
    ``version``."""
    dim = deltas.shape[1]
    t2 = threshold * threshold
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0:
            continue
        dd = 0.0
        vv = 0.0
        for d in range(dim):
            dd += deltas[i, d] * deltas[i, d]
            vv += answer[i, d] * answer[i, d]
        if dd == 0.0:
            continue
        m = moved[r] + np.sqrt(dd)
        if m * m >= t2 * vv:
            listed[r] = version
            moved[r] = 0.0
        else:
            moved[r] = m


class ChangeListing:
    """The listed version of each row of a shard, and how far the merges moved it since. Follows the shard's
    rows (``index``: its key index); a shard replaced by a checkpoint's load starts a new listing."""

    def __init__(self, threshold: float):
        self.threshold = float(threshold)
        self.listed = np.zeros(0, dtype=np.int64)
        self.moved = np.zeros(0, dtype=np.float32)
        self.version = 0

    def _room(self, rows: int) -> None:
        if rows > len(self.listed):
            cap = max(rows, 2 * len(self.listed), 1024)
            self.listed = np.concatenate([self.listed, np.zeros(cap - len(self.listed), np.int64)])
            self.moved = np.concatenate([self.moved, np.zeros(cap - len(self.moved), np.float32)])

    def merged(self, rows: np.ndarray, deltas: np.ndarray, answer: np.ndarray, version: int) -> None:
        """Deltas [n, dim] were merged into ``rows`` (the shard's row indices), giving ``answer`` [n, dim (+ 1)];
        the shard is at ``version`` now."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if not len(rows):
            return
        self._room(int(rows.max()) + 1)
        self.version = int(version)
        if self.threshold <= 0.0:
            self.listed[rows[rows >= 0]] = version
            return
        _moved(np.ascontiguousarray(deltas, dtype=np.float32), np.ascontiguousarray(answer, dtype=np.float32),
               rows, self.threshold, self.moved, self.listed, int(version))

    def listed_since(self, version: int, live_rows: int) -> np.ndarray:
        """Row indices listed after ``version`` (among the first ``live_rows``)."""
        n = min(live_rows, len(self.listed))
        return np.flatnonzero(self.listed[:n] > version)
